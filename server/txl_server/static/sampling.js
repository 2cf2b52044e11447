// TXL Serve playground: the sampling settings (kept in localStorage, so that a reload keeps them) and the request
// fields they become.
"use strict";

const SAMPLING_STORAGE = "txl.sampling";
const SAMPLING_FIELDS = ["max-tokens", "temperature", "top-k", "top-p", "seed", "stop-strings"];

function restoreSampling() {
  let saved = {};
  try {
    saved = JSON.parse(localStorage.getItem(SAMPLING_STORAGE)) || {};
  } catch (_) {
    /* damaged: the page's defaults */
  }
  for (const id of SAMPLING_FIELDS) {
    if (typeof saved[id] === "string") $(id).value = saved[id];
  }
}

function saveSampling() {
  const values = {};
  for (const id of SAMPLING_FIELDS) values[id] = $(id).value;
  localStorage.setItem(SAMPLING_STORAGE, JSON.stringify(values));
}

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
