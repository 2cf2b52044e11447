// TXL Serve playground: the server's API as the page calls it (fetch, its errors, server-sent events), and the
// page's shared state. The playground's scripts are classic scripts loaded in order (index.html), sharing one
// scope: no build step and no dependencies. User and model text is only ever written with textContent.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_STORAGE = "txl.apiKey";

// What the page holds between events.
const state = {
  session: null, // the server's session object
  conversation: null, // the id of the conversation the session is (its transcript is its items), if any
  controller: null, // AbortController of the running generation
  scoring: false,
  documentName: null, // the file the document came from, if any: the memory's name
  memories: [], // the caller's preloaded memories (GET v1/memories)
  lastGeneration: null, // {session, version, text, made}: what Regenerate repeats (session.js)
  history: [], // the session's kept versions, newest first (GET v1/sessions/{id}/versions)
};

class ApiError extends Error {
  constructor(status, error) {
    super(error.message || `HTTP ${status}`);
    this.status = status;
    this.type = error.type || "error";
    this.param = error.param || null;
  }
}

function headers(json = true) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  const key = localStorage.getItem(KEY_STORAGE);
  if (key) h["Authorization"] = `Bearer ${key}`;
  return h;
}

// Relative URLs, so that the playground also works behind a path prefix.
async function api(method, path, body, { signal } = {}) {
  const response = await fetch(path, {
    method,
    headers: headers(body !== undefined),
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
  });
  if (!response.ok) throw await errorOf(response);
  if (response.status === 204) return null;
  return response;
}

async function errorOf(response) {
  let error = { type: "error", message: `HTTP ${response.status}` };
  try {
    const body = await response.json();
    if (body && body.error) error = body.error;
  } catch (_) {
    /* not the server's error shape (a proxy's page): keep the status */
  }
  return new ApiError(response.status, error);
}

async function apiJson(method, path, body) {
  const response = await api(method, path, body);
  return response ? response.json() : null;
}

// Reads `data: <json>` server-sent events from a fetch response as they arrive; calls onEvent for each.
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""))
        .join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      const event = JSON.parse(data);
      if (event.type === "error") throw new ApiError(0, event.error || {});
      onEvent(event);
    }
  }
}

function showError(error) {
  const box = $("error");
  if (!error) {
    box.hidden = true;
    box.textContent = "";
    return;
  }
  let text = error instanceof ApiError ? `${error.type}: ${error.message}` : String(error.message || error);
  // The server's messages name their field; a param they do not mention is added.
  if (error instanceof ApiError && error.param && !error.message.includes(error.param)) text += ` (${error.param})`;
  if (error instanceof ApiError && error.status === 401) text += " — enter the server's API key above.";
  box.textContent = text;
  box.hidden = false;
}
