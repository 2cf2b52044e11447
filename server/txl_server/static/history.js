// TXL Serve playground: the session's versions (going back to one, Regenerate), fork, delete and a new session.
// Going back or forking is a step of the session (a new version, or a new session): the transcript shows the text
// of the version it continues, which this browser kept (transcript.js) or else the end of it the server keeps.
"use strict";

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
  list.replaceChildren(...versions.map((v, i) => versionItem(v, i === 0)));
  setBusy(Boolean(state.controller));
}

function versionItem(v, current) {
  const item = document.createElement("li");
  const button = document.createElement("button");
  button.type = "button";
  button.dataset.version = String(v.version);
  const head = document.createElement("span");
  head.textContent = `v${v.version} · ${v.kind} · ${v.tokens.toLocaleString()} tokens`;
  button.append(head);
  if (current) {
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
}

// The session continues from `version` (a new version of its own); the transcript shows that version's text.
async function rewindTo(version, { quiet = false } = {}) {
  const session = state.session;
  if (!session || state.controller) return false;
  showError(null);
  try {
    const body = await apiJson("POST", `v1/sessions/${encodeURIComponent(session.id)}/rewind`, { version });
    setConversation(null); // the session went back: its conversation's items no longer say what it holds
    const kept = recallTranscript(session.id, version);
    showPieces(kept || earlierText(state.history.find((v) => v.version === version)));
    setLastGeneration(null);
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
    setLastGeneration(null);
    remember(forked); // the fork holds the same text
    showSession(forked);
    $("gen-status").textContent = `forked ${from} into ${forked.id}: the text so far is shared, what follows is not`;
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
  setLastGeneration(null);
  showSession(null);
  const memory = state.memories.find((m) => m.id === $("memory-select").value);
  clearTranscript(
    memory
      ? `New session from the memory ${memoryLabel(memory)}: it continues the document, and is created with your next generation.`
      : "New session: it is created with your next generation.",
  );
  $("gen-status").textContent = "";
}
