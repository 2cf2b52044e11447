// TXL Serve playground: the session the page works on (its card, the buttons it allows), and the session and
// conversation a later visit continues (localStorage).
"use strict";

const SESSION_STORAGE = "txl.sessionId";
const CONVERSATION_STORAGE = "txl.conversationId";
const LAST_GENERATION_STORAGE = "txl.lastGeneration";

// What Regenerate repeats: the version a generation started from, its text, and the version it made (it holds
// for as long as the session is at that version, a reload included).
function setLastGeneration(last) {
  state.lastGeneration = last;
  if (last) localStorage.setItem(LAST_GENERATION_STORAGE, JSON.stringify(last));
  else localStorage.removeItem(LAST_GENERATION_STORAGE);
}

function storedLastGeneration(session) {
  try {
    const last = JSON.parse(localStorage.getItem(LAST_GENERATION_STORAGE));
    if (last && last.session === session.id && last.made === session.version) return last;
  } catch (_) {
    /* damaged: nothing to regenerate */
  }
  return null;
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
  if (!session || !state.session || session.id !== state.session.id) setLastGeneration(null);
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

// A later visit: the session of the last one, its text rebuilt from its conversation's items (the server's), or
// from the text this browser kept of its version (after a rewind or a fork), or else the end of its text.
async function restoreSession() {
  const id = localStorage.getItem(SESSION_STORAGE);
  if (!id) return;
  const conversation = localStorage.getItem(CONVERSATION_STORAGE);
  try {
    const session = await apiJson("GET", `v1/sessions/${encodeURIComponent(id)}`);
    const last = storedLastGeneration(session); // read before showSession, which forgets another session's
    if (conversation === `conv_${id}`) {
      const items = await apiJson("GET", `v1/conversations/${encodeURIComponent(conversation)}/items?order=asc&limit=100`);
      setConversation(conversation);
      showSession(session);
      setLastGeneration(last);
      setBusy(Boolean(state.controller));
      clearTranscript();
      for (const item of items.data) {
        const itemText = item.content.map((part) => part.text).join("");
        addPiece(item.role === "assistant" ? "generated" : "prompt", itemText);
      }
      if (items.has_more) addPiece("placeholder", " … (the conversation goes on: its first 100 items are shown)");
      followTranscript(true);
      remember(session);
      return;
    }
    setConversation(null);
    showSession(session);
    setLastGeneration(last);
    setBusy(Boolean(state.controller));
    const kept = recallTranscript(session.id, session.version);
    if (kept) {
      showPieces(kept);
      return;
    }
    const versions = (await apiJson("GET", `v1/sessions/${encodeURIComponent(id)}/versions`)).data;
    showPieces(earlierText(versions[0]));
    $("gen-status").textContent =
      `session ${id}, version ${session.version}: written outside this browser, which shows only its text's end`;
  } catch (_) {
    showSession(null);
  }
}
