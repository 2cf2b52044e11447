// TXL Serve playground: generation on a session (streamed over SSE), started from nothing or from a preloaded
// memory, and a per-token surprisal heatmap (whose document can be saved as a memory). A session started from
// nothing is a conversation's: each generation is a response in it (/v1/responses with `conversation`), so the
// transcript is the conversation's items, shown again on a later visit. Going back to a version or forking leaves
// the conversation (the session goes on with the Sessions API).
// No build step and no dependencies. User and model text is only ever written with textContent.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_STORAGE = "txl.apiKey";
const SESSION_STORAGE = "txl.sessionId";
const CONVERSATION_STORAGE = "txl.conversationId";
const LN2 = Math.log(2);

// ------------------------------------------------------------------------------------------------ API

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

// ------------------------------------------------------------------------------------------------ page state

const state = {
  session: null, // the server's session object
  conversation: null, // the id of the conversation the session is (its transcript is its items), if any
  controller: null, // AbortController of the running generation
  scoring: false,
  documentName: null, // the file the document came from, if any: the memory's name
  memories: [], // the caller's preloaded memories (GET v1/memories)
  texts: new Map(), // "session:version" -> the transcript's pieces at that version (what this page saw)
  lastGeneration: null, // {version, text}: the version a generation started from and its text, for Regenerate
  history: [], // the session's kept versions, newest first (GET v1/sessions/{id}/versions)
};

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

function setBusy(busy) {
  $("generate").disabled = busy;
  $("stop").disabled = !busy;
  $("regenerate").disabled = busy || !state.session || !state.lastGeneration;
  $("history").querySelectorAll("button[data-version]").forEach((b) => (b.disabled = busy || b.dataset.current));
  $("fork").disabled = busy || !state.session;
  $("delete").disabled = busy || !state.session;
  $("new-session").disabled = busy;
  $("memory-select").disabled = busy;
}

// The session's conversation (its id), or null: the session goes on outside it (after a rewind or a fork).
function setConversation(id) {
  state.conversation = id;
  if (id) localStorage.setItem(CONVERSATION_STORAGE, id);
  else localStorage.removeItem(CONVERSATION_STORAGE);
}

function showSession(session) {
  if (!session || !state.session || session.id !== state.session.id) state.lastGeneration = null;
  if (!session || (state.conversation && state.conversation !== `conv_${session.id}`)) setConversation(null);
  state.session = session;
  if (session) localStorage.setItem(SESSION_STORAGE, session.id);
  else localStorage.removeItem(SESSION_STORAGE);
  $("session-id").textContent = session ? session.id : "none yet";
  $("session-tokens").textContent = session ? String(session.tokens) : "–";
  $("session-mem").textContent = session ? `${session.mem_tokens} / ${session.mem_len}` : "–";
  $("session-version").textContent = session ? String(session.version) : "–";
  $("session-expires").textContent = session ? new Date(session.expires_at * 1000).toLocaleString() : "–";
  setBusy(Boolean(state.controller));
  refreshHistory();
}

function clearTranscript(note) {
  const transcript = $("transcript");
  transcript.replaceChildren();
  if (note) {
    const span = document.createElement("span");
    span.className = "placeholder";
    span.textContent = note;
    transcript.append(span);
  }
}

// The transcript as pieces (prompt and generated text), to show again when the session goes back to a version.
function transcriptPieces() {
  return Array.from($("transcript").children)
    .filter((el) => !el.classList.contains("placeholder"))
    .map((el) => ({ className: el.className.replace(/\s*streaming\b/, ""), text: el.textContent }));
}

function showPieces(pieces) {
  clearTranscript();
  for (const piece of pieces) addPiece(piece.className, piece.text);
}

function remember(session) {
  state.texts.set(`${session.id}:${session.version}`, transcriptPieces());
}

function addPiece(className, text) {
  const transcript = $("transcript");
  transcript.querySelectorAll(".placeholder").forEach((p) => p.remove());
  const span = document.createElement("span");
  span.className = className;
  span.textContent = text;
  transcript.append(span);
  return span;
}

// ------------------------------------------------------------------------------------------------ generate

function numberOr(id, fallback) {
  const raw = $(id).value.trim();
  if (raw === "") return fallback;
  const value = Number(raw);
  return Number.isFinite(value) ? value : fallback;
}

function stopStrings() {
  return $("stop-strings")
    .value.split(",")
    .map((s) => s.replace(/\\n/g, "\n").replace(/\\t/g, "\t"))
    .filter((s) => s.length > 0);
}

function samplingBody() {
  const body = {
    max_tokens: numberOr("max-tokens", 300),
    temperature: numberOr("temperature", 0.8),
    top_k: numberOr("top-k", 0),
    top_p: numberOr("top-p", 0.95),
  };
  const seed = numberOr("seed", null);
  if (seed !== null) body.seed = seed;
  const stop = stopStrings();
  if (stop.length) body.stop = stop;
  return body;
}

// A generation in the session's conversation: a response (its input the prompt, continued verbatim), streamed.
async function respond(text, signal, onDelta) {
  const sampling = samplingBody();
  const body = {
    conversation: state.conversation,
    input: text,
    stream: true,
    max_output_tokens: sampling.max_tokens,
    temperature: sampling.temperature,
    top_p: sampling.top_p,
    top_k: sampling.top_k,
  };
  if (sampling.seed !== undefined) body.seed = sampling.seed;
  if (sampling.stop) body.stop = sampling.stop;
  const response = await api("POST", "v1/responses", body, { signal });
  let done = null;
  await readEvents(response, (event) => {
    if (event.type === "response.output_text.delta") onDelta(event.delta);
    else if (event.type === "response.completed" || event.type === "response.incomplete") done = event.response;
  });
  if (!done) return null;
  const session = await apiJson("GET", `v1/sessions/${encodeURIComponent(state.session.id)}`);
  const reply = done.output.map((item) => item.content.map((part) => part.text).join("")).join("");
  return { session, text: reply, tokens: done.usage.output_tokens, stopped: done.status === "completed" };
}

// A generation on the session (the Sessions API), streamed.
async function generateOnSession(text, signal, onDelta) {
  const response = await api(
    "POST",
    `v1/sessions/${encodeURIComponent(state.session.id)}/generate`,
    { text, ...samplingBody(), stream: true },
    { signal },
  );
  let done = null;
  await readEvents(response, (event) => {
    if (event.type === "token") onDelta(event.token.text);
    else if (event.type === "done") done = event;
  });
  if (!done) return null;
  const stopped = done.finish_reason === "stop";
  return { session: done.session, text: done.text, tokens: done.usage.completion_tokens, stopped };
}

async function generate() {
  if (state.controller) return;
  showError(null);
  const text = $("prompt").value;
  const controller = new AbortController();
  state.controller = controller;
  setBusy(true);
  let promptSpan = null;
  let outputSpan = null;
  let tokens = 0;
  let started = performance.now();
  try {
    if (!state.session) {
      const memory = $("memory-select").value;
      if (memory) {
        showSession(await apiJson("POST", "v1/sessions", { memory }));
      } else {
        const conversation = await apiJson("POST", "v1/conversations", {});
        setConversation(conversation.id);
        showSession(await apiJson("GET", `v1/sessions/${encodeURIComponent(conversation.id.slice(5))}`));
      }
    }
    const from = state.session;
    if (!state.texts.has(`${from.id}:${from.version}`)) remember(from);
    if (text) promptSpan = addPiece("prompt", text);
    outputSpan = addPiece("generated streaming", "");
    $("gen-status").textContent = "waiting for the first token…";
    started = performance.now();
    const onDelta = (delta) => {
      tokens += 1;
      outputSpan.textContent += delta;
      const seconds = (performance.now() - started) / 1000;
      $("gen-status").textContent = `${tokens} tokens · ${(tokens / Math.max(seconds, 1e-3)).toFixed(1)} tokens/s`;
    };
    const run = state.conversation ? respond : generateOnSession;
    const done = await run(text, controller.signal, onDelta);
    if (!done) throw new Error("the stream ended before the generation finished; nothing was added");
    outputSpan.textContent = done.text; // the committed text (identical to the joined tokens)
    outputSpan.classList.remove("streaming");
    state.lastGeneration = { version: from.version, text };
    remember(done.session);
    showSession(done.session);
    const seconds = (performance.now() - started) / 1000;
    $("gen-status").textContent =
      `${done.tokens} tokens · ${(done.tokens / Math.max(seconds, 1e-3)).toFixed(1)} tokens/s · ` +
      `finished: ${done.stopped ? "stop string" : "max tokens"}`;
    $("prompt").value = "";
  } catch (error) {
    // Nothing was committed: take the uncommitted text out again and give the prompt back.
    if (outputSpan) outputSpan.remove();
    if (promptSpan) promptSpan.remove();
    if (error.name === "AbortError") {
      $("gen-status").textContent = "stopped — nothing was added to the session";
    } else {
      $("gen-status").textContent = "";
      showError(error);
      if (error instanceof ApiError && (error.status === 404 || error.type === "gone")) {
        showSession(null);
        clearTranscript("That session is no longer available: the next generation starts a new one.");
      }
    }
  } finally {
    state.controller = null;
    setBusy(false);
  }
}

// ------------------------------------------------------------------------------------------------ history

async function refreshHistory() {
  const list = $("history");
  const session = state.session;
  if (!session) {
    state.history = [];
    const empty = document.createElement("li");
    empty.className = "muted";
    empty.textContent = "No session yet.";
    list.replaceChildren(empty);
    return;
  }
  let versions;
  try {
    versions = (await apiJson("GET", `v1/sessions/${encodeURIComponent(session.id)}/versions`)).data;
  } catch (_) {
    return; // the session went away or the server is away: the page says so where it matters
  }
  if (state.session !== session) return; // another session was shown meanwhile
  state.history = versions;
  list.replaceChildren(
    ...versions.map((v, i) => {
      const item = document.createElement("li");
      const button = document.createElement("button");
      button.type = "button";
      button.dataset.version = String(v.version);
      const head = document.createElement("span");
      head.textContent = `v${v.version} · ${v.kind} · ${v.tokens.toLocaleString()} tokens`;
      button.append(head);
      if (i === 0) {
        button.dataset.current = "yes";
        head.classList.add("current");
        head.textContent += " (current)";
        button.title = "the session's newest version";
      } else {
        button.title = `go back to version ${v.version}`;
      }
      if (v.text_tail) {
        const tail = document.createElement("span");
        tail.className = "tail";
        tail.textContent = v.text_tail.length > 80 ? `…${v.text_tail.slice(-80)}` : v.text_tail;
        button.append(tail);
      }
      button.addEventListener("click", () => rewindTo(v.version));
      item.append(button);
      return item;
    }),
  );
  setBusy(Boolean(state.controller));
}

// The session continues from `version` (a new version of its own); the transcript shows that version's text.
async function rewindTo(version, { quiet = false } = {}) {
  const session = state.session;
  if (!session || state.controller) return false;
  showError(null);
  try {
    const body = await apiJson("POST", `v1/sessions/${encodeURIComponent(session.id)}/rewind`, { version });
    setConversation(null); // the session went back: its conversation's items no longer say what it holds
    const pieces = state.texts.get(`${session.id}:${version}`);
    if (pieces) {
      showPieces(pieces);
    } else {
      const known = state.history.find((v) => v.version === version);
      clearTranscript(
        `Back at version ${version} (${known ? known.tokens.toLocaleString() : "?"} tokens), ` +
          "written before this page was opened: its text is not shown.",
      );
    }
    state.lastGeneration = null;
    remember(body.session);
    showSession(body.session);
    if (!quiet) $("gen-status").textContent = `back at version ${version}, as version ${body.session.version}`;
    return true;
  } catch (error) {
    showError(error);
    return false;
  }
}

// "Regenerate": back to where the last generation started, then the same text sampled again.
async function regenerate() {
  const last = state.lastGeneration;
  if (!last || state.controller) return;
  if (!(await rewindTo(last.version, { quiet: true }))) return;
  $("prompt").value = last.text;
  await generate();
}

async function fork() {
  if (!state.session) return;
  showError(null);
  try {
    const forked = await apiJson("POST", `v1/sessions/${encodeURIComponent(state.session.id)}/fork`);
    const from = state.session.id;
    state.lastGeneration = null;
    remember(forked);
    showSession(forked);
    $("gen-status").textContent = `forked from ${from}: the text so far is shared, what follows is not`;
  } catch (error) {
    showError(error);
  }
}

async function deleteSession() {
  if (!state.session) return;
  showError(null);
  try {
    const path = state.conversation
      ? `v1/conversations/${encodeURIComponent(state.conversation)}`
      : `v1/sessions/${encodeURIComponent(state.session.id)}`;
    await api("DELETE", path);
  } catch (error) {
    if (!(error instanceof ApiError && error.status === 404)) {
      showError(error);
      return;
    }
  }
  showSession(null);
  clearTranscript("Session deleted. The next generation starts a new session.");
  $("gen-status").textContent = "";
}

function newSession() {
  state.lastGeneration = null;
  showSession(null);
  const memory = state.memories.find((m) => m.id === $("memory-select").value);
  clearTranscript(
    memory
      ? `New session from the memory ${memoryLabel(memory)}: it continues the document, and is created with your next generation.`
      : "New session: it is created with your next generation.",
  );
  $("gen-status").textContent = "";
}

// ------------------------------------------------------------------------------------------------ memories

function memoryLabel(memory) {
  const name = memory.name || memory.id;
  return `${name} (${memory.tokens.toLocaleString()} tokens)`;
}

let memoriesLoads = 0;

async function loadMemories(select) {
  const picker = $("memory-select");
  const load = ++memoriesLoads;
  let memories;
  try {
    memories = (await apiJson("GET", "v1/memories")).data;
  } catch (_) {
    memories = []; // no key yet, or the server is away: the page says so elsewhere
  }
  // Answers can arrive out of order (the page's first load, without a key, after the one a key started): only
  // the latest load fills the picker.
  if (load !== memoriesLoads) return;
  state.memories = memories;
  const wanted = select !== undefined ? select : picker.value;
  const options = [new Option("nothing (an empty session)", "")];
  for (const memory of state.memories) options.push(new Option(memoryLabel(memory), memory.id));
  picker.replaceChildren(...options);
  picker.value = state.memories.some((m) => m.id === wanted) ? wanted : "";
}

// A new memory's name: the loaded file's, else the document's first words.
function memoryName(text) {
  return state.documentName || text.trim().split(/\s+/).slice(0, 6).join(" ").slice(0, 60);
}

async function saveMemory() {
  await streamDocument({
    buttons: ["score", "save-memory"],
    status: "reading…",
    path: "v1/memories",
    body: (text) => ({ text, name: memoryName(text), stream: true }),
    progressText: (done, total) => `read ${done} / ${total} tokens`,
    missing: "the stream ended before the memory was made",
    finish: async (memory) => {
      await loadMemories(memory.id);
      newSession();
      $("score-status").textContent = `saved as memory ${memoryLabel(memory)}: new sessions start from it`;
    },
  });
}

async function restoreSession() {
  const id = localStorage.getItem(SESSION_STORAGE);
  if (!id) return;
  const conversation = localStorage.getItem(CONVERSATION_STORAGE);
  try {
    const session = await apiJson("GET", `v1/sessions/${encodeURIComponent(id)}`);
    if (conversation === `conv_${id}`) {
      // The transcript is the conversation's items: shown again as they were.
      const items = await apiJson("GET", `v1/conversations/${encodeURIComponent(conversation)}/items?order=asc&limit=100`);
      setConversation(conversation);
      showSession(session);
      clearTranscript();
      for (const item of items.data) {
        const itemText = item.content.map((part) => part.text).join("");
        addPiece(item.role === "assistant" ? "generated" : "prompt", itemText);
      }
      if (items.has_more) addPiece("placeholder", " … (the conversation goes on: its first 100 items are shown)");
      remember(session);
      return;
    }
    setConversation(null);
    showSession(session);
    clearTranscript(`Continuing session ${id} from an earlier visit (its earlier text is not shown).`);
  } catch (_) {
    showSession(null);
  }
}

// ------------------------------------------------------------------------------------------------ score

// Light yellow (unsurprising) to dark red (surprising), by bits of surprisal.
const PALETTE = ["#fffbe6", "#fee8a8", "#fdc47d", "#f99556", "#e8603c", "#c22f2c", "#8c1028"];

function colorAt(fraction) {
  const x = Math.min(1, Math.max(0, fraction)) * (PALETTE.length - 1);
  const i = Math.min(PALETTE.length - 2, Math.floor(x));
  const mix = (a, b, t) => Math.round(a + (b - a) * t);
  const [r1, g1, b1] = rgb(PALETTE[i]);
  const [r2, g2, b2] = rgb(PALETTE[i + 1]);
  const t = x - i;
  return [mix(r1, r2, t), mix(g1, g2, t), mix(b1, b2, t)];
}

function rgb(hex) {
  return [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
}

const BYTE_TOKEN = /^\\x([0-9a-f]{2})$/;

// Groups the tokens into what to show: byte tokens (`\xNN`) of one UTF-8 character become one piece.
function pieces(texts, logprobs) {
  const out = [];
  for (let i = 0; i < texts.length; i++) {
    const match = BYTE_TOKEN.exec(texts[i]);
    if (!match) {
      out.push({ text: texts[i], bits: [-logprobs[i] / LN2] });
      continue;
    }
    const lead = parseInt(match[1], 16);
    const length = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
    const bytes = [];
    const bits = [];
    for (let j = i; j < Math.min(texts.length, i + length); j++) {
      const m = BYTE_TOKEN.exec(texts[j]);
      if (!m || (j > i && (parseInt(m[1], 16) & 0xc0) !== 0x80)) break;
      bytes.push(parseInt(m[1], 16));
      bits.push(-logprobs[j] / LN2);
    }
    out.push({ text: new TextDecoder().decode(new Uint8Array(bytes)), bits, bytes: bytes.length });
    i += bytes.length - 1;
  }
  return out;
}

function quantile(values, q) {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] : 0;
}

function renderHeatmap(result, documentText) {
  const items = pieces(result.token_texts, result.token_logprobs);
  const totals = items.map((p) => p.bits.reduce((a, b) => a + b, 0));
  // The scale's top: most pieces below it, so that the colours spread; never under 4 bits.
  const top = Math.max(4, Math.ceil(quantile(totals, 0.98)));
  // Byte (or character) tokens spell the document; word tokens do not carry their spaces.
  const contiguous = items.map((p) => p.text).join("") === documentText;
  const heatmap = $("heatmap");
  const fragment = document.createDocumentFragment();
  items.forEach((piece, i) => {
    if (!contiguous && i > 0) fragment.append(document.createTextNode(piece.text === "<eos>" ? "\n" : " "));
    const span = document.createElement("span");
    span.className = "tok";
    const bits = totals[i];
    const [r, g, b] = colorAt(bits / top);
    span.style.backgroundColor = `rgb(${r}, ${g}, ${b})`;
    if (0.299 * r + 0.587 * g + 0.114 * b < 140) span.classList.add("dark");
    span.dataset.bits = bits.toFixed(3);
    const shown = JSON.stringify(piece.text);
    const parts = piece.bits.length > 1 ? ` (${piece.bits.length} bytes: ${piece.bits.map((x) => x.toFixed(2)).join(" + ")})` : "";
    span.title = `${shown}: ${bits.toFixed(2)} bits${parts} · p = ${Math.pow(2, -bits).toPrecision(3)}`;
    span.textContent = piece.text === "\n" || piece.text === "<eos>" ? "↵\n" : piece.text;
    fragment.append(span);
  });
  heatmap.replaceChildren(fragment);
  $("legend-min").textContent = "0";
  $("legend-max").textContent = String(top);
}

function formatNumber(value, digits) {
  return Number.isFinite(value) ? value.toLocaleString(undefined, { maximumFractionDigits: digits }) : String(value);
}

async function score() {
  await streamDocument({
    buttons: ["score"],
    status: "scoring…",
    path: "v1/score",
    body: (text) => ({ text, token_logprobs: true, stream: true }),
    progressText: (done, total) => `${done} / ${total} tokens`,
    missing: "the stream ended before the result arrived",
    finish: (result, text) => {
      $("stat-tokens").textContent = formatNumber(result.tokens, 0);
      $("stat-bytes").textContent = formatNumber(result.bytes, 0);
      $("stat-perplexity").textContent = formatNumber(result.perplexity, 3);
      $("stat-bpb").textContent = formatNumber(result.bits_per_byte, 4);
      renderHeatmap(result, text);
      $("score-results").hidden = false;
      $("score-status").textContent = "done";
    },
  });
}

// Sends the document in the box on a streamed request (to score it, or to read it into a memory), one such request
// at a time: the progress bar and the status line follow the server's reading, `buttons` stay disabled meanwhile,
// and `finish(result, text)` gets the stream's result event; an error is shown instead.
async function streamDocument({ buttons, status, path, body, progressText, missing, finish }) {
  if (state.scoring) return;
  showError(null);
  const text = $("doc").value;
  if (!text) {
    showError(new Error("paste or drop a document first"));
    return;
  }
  state.scoring = true;
  for (const id of buttons) $(id).disabled = true;
  const progress = $("score-progress");
  progress.hidden = false;
  progress.value = 0;
  $("score-status").textContent = status;
  try {
    const response = await api("POST", path, body(text));
    let result = null;
    await readEvents(response, (event) => {
      if (event.type === "progress") {
        progress.max = Math.max(1, event.tokens_total);
        progress.value = event.tokens_done;
        $("score-status").textContent = progressText(event.tokens_done.toLocaleString(), event.tokens_total.toLocaleString());
      } else if (event.type === "result") {
        result = event;
      }
    });
    if (!result) throw new Error(missing);
    await finish(result, text);
  } catch (error) {
    $("score-status").textContent = "";
    showError(error);
  } finally {
    state.scoring = false;
    for (const id of buttons) $(id).disabled = false;
    progress.hidden = true;
  }
}

function loadFile(file) {
  if (!file) return;
  const reader = new FileReader();
  reader.onload = () => {
    $("doc").value = String(reader.result);
    state.documentName = file.name;
    $("score-status").textContent = `loaded ${file.name} (${file.size.toLocaleString()} bytes)`;
  };
  reader.onerror = () => showError(new Error(`cannot read ${file.name}`));
  reader.readAsText(file);
}

// ------------------------------------------------------------------------------------------------ wiring

function selectTab(name) {
  for (const tab of ["generate", "score"]) {
    const selected = tab === name;
    $(`tab-${tab}`).setAttribute("aria-selected", String(selected));
    $(`panel-${tab}`).hidden = !selected;
  }
}

async function loadModel() {
  try {
    const models = await apiJson("GET", "v1/models");
    $("model").textContent = models.data.length ? models.data[0].id : "no model";
    $("model").classList.remove("warn");
  } catch (error) {
    $("model").textContent = error instanceof ApiError && error.status === 401 ? "API key needed" : "server unreachable";
    $("model").classList.add("warn");
  }
}

function init() {
  $("api-key").value = localStorage.getItem(KEY_STORAGE) || "";
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("api-key").value.trim();
    if (key) localStorage.setItem(KEY_STORAGE, key);
    else localStorage.removeItem(KEY_STORAGE);
    showError(null);
    loadModel();
    loadMemories();
    restoreSession();
  });
  $("tab-generate").addEventListener("click", () => {
    selectTab("generate");
    loadMemories(); // another client may have added or deleted some
  });
  $("tab-score").addEventListener("click", () => selectTab("score"));

  $("generate-form").addEventListener("submit", (event) => {
    event.preventDefault();
    generate();
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      generate();
    }
  });
  $("stop").addEventListener("click", () => state.controller && state.controller.abort());
  $("fork").addEventListener("click", fork);
  $("regenerate").addEventListener("click", regenerate);
  $("delete").addEventListener("click", deleteSession);
  $("new-session").addEventListener("click", newSession);
  $("memory-select").addEventListener("change", newSession);
  $("save-memory").addEventListener("click", saveMemory);
  $("doc").addEventListener("input", () => (state.documentName = null));

  $("score-form").addEventListener("submit", (event) => {
    event.preventDefault();
    score();
  });
  $("file").addEventListener("change", (event) => loadFile(event.target.files[0]));
  const zone = $("drop-zone");
  zone.addEventListener("dragover", (event) => {
    event.preventDefault();
    zone.classList.add("over");
  });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (event) => {
    event.preventDefault();
    zone.classList.remove("over");
    loadFile(event.dataTransfer && event.dataTransfer.files[0]);
  });

  document.querySelector(".legend .ramp").style.background = `linear-gradient(to right, ${PALETTE.join(", ")})`;
  setBusy(false);
  loadModel();
  loadMemories();
  restoreSession();
}

document.addEventListener("DOMContentLoaded", init);
