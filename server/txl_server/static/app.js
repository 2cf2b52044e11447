// TXL Serve playground: generation on a session (streamed over SSE), started from nothing or from a preloaded
// memory, and a per-token surprisal heatmap (whose document can be saved as a memory). This file wires the page;
// the rest, loaded before it (index.html): api.js (the API, the page's state), transcript.js (the session's text,
// kept per version), sampling.js, session.js, generate.js, history.js, memories.js, score.js.
"use strict";

function selectTab(name) {
  for (const tab of ["generate", "score"]) {
    const selected = tab === name;
    $(`tab-${tab}`).setAttribute("aria-selected", String(selected));
    $(`panel-${tab}`).hidden = !selected;
  }
}

// The model's name, and, for the bundled demonstration model, what it is (its text makes little sense).
async function loadModel() {
  try {
    const models = await apiJson("GET", "v1/models");
    const model = models.data[0];
    $("model").textContent = model ? model.id : "no model";
    $("model").classList.remove("warn");
    $("model-note").hidden = !(model && model.bundled);
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
  for (const id of SAMPLING_FIELDS) $(id).addEventListener("input", saveSampling);
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
  restoreSampling();
  setBusy(false);
  loadModel();
  loadMemories();
  restoreSession();
}

document.addEventListener("DOMContentLoaded", init);
