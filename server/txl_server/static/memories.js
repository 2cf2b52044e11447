// TXL Serve playground: preloaded memories (documents the server has read once), listed for new sessions to
// start from, and saved from the Score tab.
"use strict";

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
