// TXL Serve playground: the transcript (the session's text, your pieces and the model's), and the text of every
// version this browser made, kept in localStorage so that a reload shows the session's text again after a
// Regenerate, a History click or a Fork (which leave the conversation the text was read from). The server keeps
// each version's memory and the end of its text (`text_tail`), not the text itself: a version this browser did not
// make shows that end.
"use strict";

const TRANSCRIPTS_STORAGE = "txl.transcripts";
// localStorage holds about 5 MB a site: the newest versions' texts, within both limits.
const KEPT_VERSIONS = 100;
const KEPT_CHARACTERS = 1_000_000;
const PLACEHOLDER =
  "Type a prompt below and press Generate. Each generation continues the same session, so you can keep extending it.";

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

function addPiece(className, text) {
  const transcript = $("transcript");
  transcript.querySelectorAll(".placeholder").forEach((p) => p.remove());
  const span = document.createElement("span");
  span.className = className;
  span.textContent = text;
  if (className === "earlier") span.title = "the end of the text before this browser's, which the server keeps";
  transcript.append(span);
  return span;
}

// The transcript as pieces (yours, generated, and the end of text written elsewhere), to show again.
function transcriptPieces() {
  return Array.from($("transcript").children)
    .filter((el) => !el.classList.contains("placeholder"))
    .map((el) => ({ className: el.className.replace(/\s*streaming\b/, ""), text: el.textContent }));
}

function showPieces(pieces) {
  clearTranscript(pieces.length ? null : PLACEHOLDER);
  for (const piece of pieces) addPiece(piece.className, piece.text);
  followTranscript(true);
}

// What this browser keeps: {order: ["SESSION:VERSION", ...] oldest first, texts: {"SESSION:VERSION": pieces}}.
function keptTranscripts() {
  try {
    const kept = JSON.parse(localStorage.getItem(TRANSCRIPTS_STORAGE));
    if (kept && Array.isArray(kept.order) && kept.texts && typeof kept.texts === "object") return kept;
  } catch (_) {
    /* not ours, or damaged: start again */
  }
  return { order: [], texts: {} };
}

function characters(pieces) {
  return pieces.reduce((sum, piece) => sum + piece.text.length, 0);
}

function keepTranscript(key, pieces) {
  const kept = keptTranscripts();
  kept.order = kept.order.filter((k) => k !== key && kept.texts[k]);
  kept.order.push(key);
  kept.texts[key] = pieces;
  let total = kept.order.reduce((sum, k) => sum + characters(kept.texts[k]), 0);
  while (kept.order.length > 1 && (kept.order.length > KEPT_VERSIONS || total > KEPT_CHARACTERS)) {
    const oldest = kept.order.shift();
    total -= characters(kept.texts[oldest]);
    delete kept.texts[oldest];
  }
  for (;;) {
    try {
      localStorage.setItem(TRANSCRIPTS_STORAGE, JSON.stringify(kept));
      return;
    } catch (_) {
      if (kept.order.length <= 1) return; // the browser's storage is full of other things: keep nothing
      delete kept.texts[kept.order.shift()];
    }
  }
}

function recallTranscript(session, version) {
  return keptTranscripts().texts[`${session}:${version}`] || null;
}

// Keeps what the transcript shows as the text of `session`'s current version.
function remember(session) {
  keepTranscript(`${session.id}:${session.version}`, transcriptPieces());
}

// The pieces of a version this browser did not make: the end of its text, as the versions list has it.
function earlierText(version) {
  const tail = version && version.text_tail ? version.text_tail : "";
  return tail ? [{ className: "earlier", text: `…${tail}` }] : [];
}

// Keeps the transcript's end in view while text streams in, unless the reader scrolled up to read.
function followTranscript(force = false) {
  const transcript = $("transcript");
  const atEnd = transcript.scrollHeight - transcript.scrollTop - transcript.clientHeight < 48;
  if (force || atEnd) transcript.scrollTop = transcript.scrollHeight;
}

// The transcript whole in the window (Ctrl+Enter in the prompt below it must not leave it scrolled away); the
// page is laid out so that it and the prompt fit together (style.css), and moves only where they do not.
function revealTranscript() {
  const transcript = $("transcript");
  const box = transcript.getBoundingClientRect();
  if (box.top < 0 || box.bottom > window.innerHeight) transcript.scrollIntoView({ block: "nearest" });
  followTranscript(true);
}
