// TXL Serve playground: scoring a document (streamed progress, then a per-token surprisal heatmap), and the
// streamed requests the Score tab sends (scoring, saving a memory).
"use strict";

const LN2 = Math.log(2);

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
function heatmapPieces(texts, logprobs) {
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
  const items = heatmapPieces(result.token_texts, result.token_logprobs);
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

