"""Tiny local lm-evaluation-harness tasks, written by the test that runs them: a perplexity task (whole documents,
rolling log-likelihood), a multiple-choice task and a generation task, each over a local JSON Lines file made
from tests/data (see its README for the texts' licences). Nothing is downloaded."""

from __future__ import annotations

import json
import re
from pathlib import Path

DATA = Path(__file__).parents[1] / "data"
# Three held-out documents of 8 KiB; the technical one holds multi-byte characters (quotes, dashes, accents).
DOCUMENTS = ["heldout/fiction.txt", "heldout/technical.txt", "heldout/encyclopedic.txt"]

PERPLEXITY = "txl_perplexity"
CHOICE = "txl_choice"
GENERATION = "txl_generation"


def documents() -> list[str]:
    return [(DATA / name).read_text(encoding="utf-8") for name in DOCUMENTS]


def choice_items(count: int = 12) -> list[dict]:
    """A sentence's beginning, and four endings of which the first is its own (the others: other sentences')."""
    text = (DATA / "heldout" / "fiction.txt").read_text(encoding="utf-8")
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())) if len(s.split()) >= 8][:count]
    items = []
    for i, sentence in enumerate(sentences):
        words = sentence.split()
        cut = len(words) // 2
        endings = [" " + " ".join(s.split()[len(s.split()) // 2 :]) for s in sentences]
        choices = [endings[i], endings[(i + 1) % count], endings[(i + 2) % count], endings[(i + 3) % count]]
        items.append({"context": " ".join(words[:cut]), "choices": choices, "answer": 0})
    return items


def generation_items() -> list[dict]:
    return [
        {"prompt": "The capital of France is", "answer": " Paris"},
        {"prompt": "Once upon a time", "answer": " there"},
        {"prompt": "Größe und naïve Café:", "answer": " ja"},
    ]


def write_tasks(folder: Path) -> Path:
    """The three tasks' YAML and data under `folder` (lm-eval's --include_path)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = {
        PERPLEXITY: [{"text": text} for text in documents()],
        CHOICE: choice_items(),
        GENERATION: generation_items(),
    }
    for name, rows in data.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    common = "dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {path}\ntest_split: test\n"
    tasks = {
        PERPLEXITY: "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
        "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n",
        CHOICE: "output_type: multiple_choice\ndoc_to_text: '{{context}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{answer}}'\ntarget_delimiter: ''\nmetric_list:\n  - metric: acc\n",
        GENERATION: "output_type: generate_until\ndoc_to_text: '{{prompt}}'\ndoc_to_target: '{{answer}}'\n"
        "target_delimiter: ''\ngeneration_kwargs:\n  until: [\"\\n\"]\n  max_gen_toks: 12\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n",
    }
    for name, body in tasks.items():
        path = folder / f"{name}.jsonl"
        (folder / f"{name}.yaml").write_text(f"task: {name}\n" + common.format(path=path) + body)
    return folder
