"""Renders docs/default-model.md (and its two figures) from the measurements, never from typed-in numbers.

python scripts/model_card.py --log runs/books-v2/log.jsonl --train-command "..." --wall-time "..."

Reads docs/default-model.json (python -m txl.training.evaluate), docs/default-model-corpus.json (the manifest that
scripts/prepare_corpus.py writes), docs/default-model-shapes.json (scripts/measure_shapes.py), the bundled model's
config.json and the training log.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from txl import TxlConfig
from txl.training.figures import loss_plot, memory_plot

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MODEL_DIR = ROOT / "server" / "txl_server" / "default_model"
HELD_OUT = {  # what each genre's held-out text is (the split rules live in model/txl/training/data/sources.py)
    "fiction": (
        "Chesterton, _The Man Who Was Thursday_ (test; the first 100 kB) and Austen, _Persuasion_ (validation)"
    ),
    "technical": "the Python documentation's HOWTOs, `howto/` (test) and FAQs, `faq/` (validation)",
    "encyclopedic": "the WikiText-103 test split's articles (test) and its validation split (validation)",
}


def data_section(corpus: dict) -> list[str]:
    rows = []
    for name, source in corpus["sources"].items():
        splits = source["splits"]
        read = splits.get("train copies", splits.get("train", {"bytes": 0}))["bytes"]
        version = f" {source['version']}" if source.get("version") else ""
        rows.append(
            f"| {name} | {source['genre']} | {source['licence']} | {source['origin']}{version} | "
            f"{splits.get('train', {'bytes': 0})['bytes'] / 1e6:.2f} MB | x{source['weight']:g} = {read / 1e6:.2f} MB |"
        )
    train = corpus["files"]["train.txt"]
    return [
        "| source | genre | licence | origin | training text | in train.txt |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        f"`train.txt`: {train['bytes']:,} bytes (sha256 `{train['sha256'][:16]}…`), documents shuffled with seed "
        f"{corpus['seed']}. Held out per genre, never seen by the optimiser:",
        "",
        *[f"- **{genre}**: {text}" for genre, text in HELD_OUT.items()],
    ]


def results_table(report: dict) -> list[str]:
    books = report["books"]
    mem_lens = sorted({int(m) for b in books.values() for m in b["bpb"]})
    serving = str(report["serving_mem_len"])
    rows = []
    for genre, book in books.items():
        cells = " | ".join(f"{book['bpb'][str(m)]:.3f}" for m in mem_lens)
        below = 1 - book["bpb"][serving] / book["xz_9e"]
        rows.append(f"| {genre} ({book['bytes']:,} bytes) | {cells} | {book['xz_9e']:.3f} | {below:.0%} |")
    return [
        "| held-out text | "
        + " | ".join(f"mem_len {m}" for m in mem_lens)
        + f" | xz -9e | below xz at {serving} |",
        "|---|" + "---|" * (len(mem_lens) + 2),
        *rows,
    ]


def speed_section(report: dict, shapes: dict) -> list[str]:
    rows = [
        f"| {threads} | {s['decode_bytes_per_s']:.0f} | {s['decode_bytes_per_cpu_s']:.0f} | "
        f"{s['score_bytes_per_s'] / 1e3:.1f} | {s['score_bytes_per_cpu_s'] / 1e3:.1f} |"
        for threads, s in report["speed"].items()
    ]
    shape_rows = [
        f"| {shape} | {s['params'] / 1e6:.2f}M | {s['float16_mb']:.1f} | {s['train_step_cpu_s'] * 1e3:.0f} | "
        f"{s['decode_bytes_per_cpu_s']:.0f} | {s['score_bytes_per_cpu_s'] / 1e3:.1f} |"
        for shape, s in shapes["shapes"].items()
    ]
    return [
        "| threads | decode bytes/s | decode bytes/CPU-s | scoring kB/s | scoring kB/CPU-s |",
        "|---|---|---|---|---|",
        *rows,
        "",
        "Decode: one stream, a token at a time (model step, log-probabilities, sampling) after a full serving memory;",
        "scoring: 32 kB of the fiction text at the serving memory (`python -m txl.training.evaluate`). Per CPU-second is",
        "what the process's threads got; the wall-clock rate is lower whenever other work shares the two cores.",
        "",
        f"Shapes measured for the choice of size (`scripts/measure_shapes.py`, random weights, {shapes['threads']}"
        f" thread, memory {shapes['mem_len']}; per CPU-second):",
        "",
        "| shape (layers x d_model x heads x d_inner) | parameters | float16 MB | train step ms | decode bytes/s "
        "| scoring kB/s |",
        "|---|---|---|---|---|---|",
        *shape_rows,
    ]


def sample_section(report: dict) -> list[str]:
    lines = []
    for s in report["samples"]:
        checks = s["checks"]
        verdict = (
            "no tokenizer spacing, no repeated line"
            if not (checks["tokenizer_spacing"] or checks["repeated_line"])
            else f"checks: {checks}"
        )
        lines += [
            f'Prompt "{s["prompt"]}", temperature {s["temperature"]}, top-p {s["top_p"]}, seed {s["seed"]}, '
            f"{len(s['text'].encode())} bytes ({verdict}):",
            "",
            "> " + (s["prompt"] + s["text"]).replace("\n", "\n> "),
            "",
        ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--train-command", required=True)
    parser.add_argument("--wall-time", required=True)
    parser.add_argument("--notes", default="", help="extra Markdown paragraphs")
    args = parser.parse_args()
    report = json.loads((DOCS / "default-model.json").read_text())
    corpus = json.loads((DOCS / "default-model-corpus.json").read_text())
    shapes = json.loads((DOCS / "default-model-shapes.json").read_text())
    config = json.loads((MODEL_DIR / "config.json").read_text())
    records = [json.loads(line) for line in args.log.read_text().splitlines() if line.strip()]
    evals = [r for r in records if "valid_bpb_by_genre" in r]
    steps = evals[-1]["step"]
    read = steps * 16 * config["train_tgt_len"]
    params = TxlConfig.from_dict(config).param_count()
    size = sum(p.stat().st_size for p in MODEL_DIR.iterdir()) / 1e6
    serving = report["serving_mem_len"]
    loss_plot(records, DOCS / "default-model-loss.png")
    memory_plot(report["books"], DOCS / "default-model-memory.png")
    lines = [
        "# The bundled default model: `txl-books-byte` (v2)",
        "",
        "A small byte-level Transformer-XL trained on openly licensed English of several kinds (novels, an",
        "encyclopedia, software manuals, a dictionary), shipped in the repository",
        f"(`server/txl_server/default_model/`, {size:.1f} MB) so that the server answers with a real trained model",
        "without downloading anything. `--model` (or `TXL_MODEL`) replaces it with any other model directory, such as",
        "a converted `transfo-xl-wt103`.",
        "",
        "## Data and licences",
        "",
        "Text as people write it: the NLTK Gutenberg books and WikiText-103 come tokenized (one sentence a line,",
        "punctuation set apart, `` and '' for quotes, `@-@` inside words) and `model/txl/training/data/detokenize.py` undoes",
        "that (tested in `tests/model/test_detokenize.py`); paragraphs are rebuilt from dialogue turns and headings",
        "where the books show them. Documentation is the plain text of the HTML pages (`model/txl/training/data/html_text.py`),",
        "without navigation. Left out: licence and copyright pages, indexes, changelogs and release notes (lists, and",
        "boilerplate repeated in every package), WikiText sentences holding `<unk>`, and the NLTK copies of three plays",
        "whose speakers' names are glued to their lines (tiny-shakespeare has the plays as printed). The corpus is",
        "rebuilt, byte for byte, by:",
        "",
        "```bash",
        "python scripts/prepare_corpus.py --data-dir ../shared/data --out runs/corpus --test-slices tests/data/heldout",
        "cp runs/corpus/manifest.json docs/default-model-corpus.json",
        "```",
        "",
        *data_section(corpus),
        "",
        "WikiText-103 (Merity et al., 2016, https://arxiv.org/abs/1609.07843) is derived from Wikipedia under CC BY-SA",
        "3.0; the other sources are public domain or under permissive licences (PSF, PostgreSQL, WordNet 3.0: BSD-style,",
        "notices kept in the packages). The weights are a statistical model of these texts and contain no copy of them;",
        "the held-out slices in `tests/data/heldout/` carry their licences in `tests/data/README.md`.",
        "",
        "## Architecture",
        "",
        f"Transformer-XL, attention type 0 (relative positions, learned u/v biases per layer): {config['n_layer']} layers,",
        f"d_model {config['d_model']}, {config['n_head']} heads of {config['d_head']}, d_inner {config['d_inner']},",
        "post-LayerNorm, byte-level vocabulary of 256 with a plain softmax (tied input/output embeddings),",
        f"clamp_len {config['clamp_len']}; {params / 1e6:.2f}M parameters, stored in float16 (loaded as float32 by",
        f"default). Trained with segments of `tgt_len` {config['train_tgt_len']} and a memory of",
        f"{config['train_mem_len']} positions; served with `mem_len` {config['mem_len']} and `same_length`",
        f"{str(config['same_length']).lower()} (both in `config.json`, with `train_mem_len`).",
        "",
        "## Training",
        "",
        "```bash",
        args.train_command,
        "```",
        "",
        f"{args.wall_time} ({steps:,} steps of 16 streams x {config['train_tgt_len']} bytes: {read / 1e6:.1f} MB read,",
        f"{read / corpus['files']['train.txt']['bytes']:.2f} of an epoch of `train.txt`). Adam with linear warm-up",
        "and cosine decay over a wall-clock budget, gradient clipping at 0.25, bfloat16 autocast for the matrix",
        "products, memory carried across segments without gradient, validation on 16 kB of each held-out genre",
        "every 250 steps. The same `TransfoXLLMHeadModel` code serves and trains (`model/txl/training/train.py`); the script",
        "also runs on CUDA (`--device cuda`, bfloat16 autocast there too), which was not available for this model",
        "and is not tested here.",
        "",
        "![training curve](default-model-loss.png)",
        "",
        args.notes,
        "",
        "## Held-out bits per byte against memory length",
        "",
        "Each held-out text scored as one stream, segment by segment from an empty memory primed with `\\n` (as the",
        "server scores), every byte predicted; `xz -9e` (LZMA preset 9, extreme) on the same bytes as the reference",
        "point. Command:",
        "",
        "```bash",
        report["command"],
        "```",
        "",
        *results_table(report),
        "",
        "![bits per byte against memory length](default-model-memory.png)",
        "",
        f"Longer memory lowers the loss (the paper's claim, on our own model) up to the lengths it was trained with; "
        f"the server uses mem_len {serving}. The test suite re-scores the first "
        f"{next(iter(report['books'].values()))['slice']['bytes']:,} bytes of each held-out text",
        "(`tests/data/heldout/`) and checks the card's figure to within 0.05 (`tests/model/test_default_model.py`).",
        "",
        "## Speed on a 2-core CPU",
        "",
        *speed_section(report, shapes),
        "",
        "## Samples",
        "",
        *sample_section(report),
    ]
    (DOCS / "default-model.md").write_text("\n".join(lines), encoding="utf-8")
    print("wrote docs/default-model.md")


if __name__ == "__main__":
    main()
