// TXL Serve playground: a generation on the session, streamed. A session started from nothing is a
// conversation's: each generation is a response in it (/v1/responses with `conversation`), so that its transcript
// is the conversation's items, shown again on a later visit; after a rewind or a fork the session goes on with the
// Sessions API. While a generation waits (for its first token, or the next), the status line says for how long and
// what the server runs meanwhile (GET v1/system), so that a request waiting beside long work does not look hung.
"use strict";

const QUIET_MS = 1000; // a token this late makes the status line say that it waits
const ASK_MS = 2000; // between two questions to the server about its work

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

// A generation on the session (the Sessions API), streamed; a long prompt reports its reading (onProgress).
async function generateOnSession(text, signal, onDelta, onProgress) {
  const response = await api(
    "POST",
    `v1/sessions/${encodeURIComponent(state.session.id)}/generate`,
    { text, ...samplingBody(), stream: true },
    { signal },
  );
  let done = null;
  await readEvents(response, (event) => {
    if (event.type === "token") onDelta(event.token.text);
    else if (event.type === "progress") onProgress(event.tokens_done, event.tokens_total);
    else if (event.type === "done") done = event;
  });
  if (!done) return null;
  const stopped = done.finish_reason === "stop";
  return { session: done.session, text: done.text, tokens: done.usage.completion_tokens, stopped };
}

// The status line of a running generation: its rate, or, while it waits, how long and beside what.
class GenerationStatus {
  constructor() {
    this.started = performance.now();
    this.lastNews = this.started;
    this.tokens = 0;
    this.reading = null; // [done, total] of a long prompt being read
    this.work = null; // what the server's worker runs and has waiting (GET v1/system), while this one waits
    this.asked = 0;
    this.timer = setInterval(() => this.tick(), 500);
    this.show("waiting for the first token…");
  }

  token() {
    this.tokens += 1;
    this.lastNews = performance.now();
    const seconds = (this.lastNews - this.started) / 1000;
    this.show(`${this.tokens} tokens · ${(this.tokens / Math.max(seconds, 1e-3)).toFixed(1)} tokens/s`);
  }

  progress(done, total) {
    this.reading = [done, total];
    this.lastNews = performance.now();
    this.show(`reading your text: ${done.toLocaleString()} / ${total.toLocaleString()} tokens`);
  }

  async tick() {
    const now = performance.now();
    if (now - this.lastNews < QUIET_MS) return;
    if (now - this.asked >= ASK_MS) {
      this.asked = now;
      try {
        this.work = (await apiJson("GET", "v1/system")).work;
      } catch (_) {
        this.work = null; // no answer: say only how long
      }
    }
    if (this.timer === null) return; // ended while the server was asked
    const waited = Math.round((performance.now() - this.lastNews) / 1000);
    const what = this.tokens ? "the next token" : this.reading ? "the server to read on" : "the first token";
    let line = `waiting for ${what}: ${waited} s`;
    const work = this.work;
    if (work && work.requests_running + work.requests_waiting) {
      const running = work.requests_running;
      line += `; the server is running ${running} ${running === 1 ? "request" : "requests"}`;
      if (work.requests_waiting) line += `, ${work.requests_waiting} more waiting to start`;
      line += " (long work such as scoring shares the device)";
    }
    if (this.tokens) line = `${this.tokens} tokens · ${line}`;
    this.show(line);
  }

  show(line) {
    $("gen-status").textContent = line;
  }

  end() {
    clearInterval(this.timer);
    this.timer = null;
  }
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
  let status = null;
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
      remember(state.session);
    }
    const from = state.session;
    if (!recallTranscript(from.id, from.version)) remember(from);
    if (text) promptSpan = addPiece("prompt", text);
    outputSpan = addPiece("generated streaming", "");
    revealTranscript();
    status = new GenerationStatus();
    const onDelta = (delta) => {
      status.token();
      outputSpan.textContent += delta;
      followTranscript();
    };
    const onProgress = (done, total) => status.progress(done, total);
    const run = state.conversation ? respond : generateOnSession;
    const done = await run(text, controller.signal, onDelta, onProgress);
    if (!done) throw new Error("the stream ended before the generation finished; nothing was added");
    status.end();
    outputSpan.textContent = done.text; // the committed text (identical to the joined tokens)
    outputSpan.classList.remove("streaming");
    followTranscript();
    setLastGeneration({ session: from.id, version: from.version, text, made: done.session.version });
    remember(done.session);
    showSession(done.session);
    const seconds = (performance.now() - status.started) / 1000;
    $("gen-status").textContent =
      `${done.tokens} tokens · ${(done.tokens / Math.max(seconds, 1e-3)).toFixed(1)} tokens/s · ` +
      `finished: ${done.stopped ? "stop string" : "max tokens"}`;
    $("prompt").value = "";
  } catch (error) {
    if (status) status.end();
    // Nothing was committed: take the uncommitted text out again and give the prompt back.
    if (outputSpan) outputSpan.remove();
    if (promptSpan) promptSpan.remove();
    if (!$("transcript").children.length) clearTranscript(PLACEHOLDER);
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
