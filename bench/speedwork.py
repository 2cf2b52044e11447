"""Before and after: the speed work the benchmarks drove, measured side by side in one run.

Each change is measured by running the same probe against the code just before it and just after it (both
revisions are exported from git into temporary directories and imported in subprocesses), so a change's
figure is its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from txl.kernels.cpu.linear import cpu_runs_bfloat16
from txl_server.check.benchmark_docs import Section

from .common import ROOT

# (title, revision before the change, probe, what the probe prints)
CHANGES = [
    (
        "Linear layers through oneDNN with packed weights (wt103 shape, decode at batch 1 / 16, 128-token segment)",
        "7bb42e0^",
        "linear",
        "ms per step",
    ),
    (
        "Batched decode with memories of different lengths (8 layers, d_model 256; one forward per step)",
        "658d0d9^",
        "decode",
        "ms per step with 1 / 16 / 64 sessions",
    ),
    (
        "Decode attention: one-session groups read queries and positional scores as slices, AC+BD in one baddbmm",
        "679ef9f^",
        "decode",
        "ms per step with 1 / 16 / 64 sessions",
    ),
    (
        "bfloat16 decode attention on CPU: strided key and positional slices copied before bmm (wt103 shape, decode "
        "at mem 1,600 / 3,800, 128-token segment at mem 1,600)",
        "1a3067f^",
        "bf16",
        "ms per step (best of 10, of 3 interleaved rounds)",
    ),
    (
        "Sampling 64 rows of a 267,735-word distribution (temperature 0.8, top-p 0.9)",
        "e1fd393^",
        "sample",
        "ms per step",
    ),
    (
        "Training step (6.9M parameters, 16 x 128 bytes, memory 256, bf16 autocast)",
        "6bf383b^",
        "train",
        "ms per step",
    ),
    (
        "Paged memory, one forward for every row, native CPU decode kernel (wt103 shape: decode at batch 1 and "
        "mem 1,600, scoring 4,096 tokens in segments of 128 at mem 1,600; bundled shape: 64 rows at mem 512)",
        "9b4b4a8..HEAD",
        "paged",
        "ms per token / s per document / ms per step",
    ),
]

# Probes whose effect is small next to this machine's noise run several interleaved rounds (best kept).
ROUNDS = {"bf16": 3, "paged": 2}

PROBES = {
    "linear": r"""
import json, time, torch
torch.set_num_threads(2)
import txl
from txl.checkpoint import build_model
model = build_model(txl.TxlConfig.wt103())
model.init_weights(torch.Generator().manual_seed(0))
out = []
with torch.inference_mode():
    for rows, length in ((1, 1), (16, 1), (1, 128)):
        tokens = torch.randint(0, 20000, (rows, length))
        memories = [model.empty_memory(mem_len=0) for _ in range(rows)]
        for _ in range(2):
            h, _ = model(tokens, memories); model.log_probs(h[:, -1])
        t = time.perf_counter()
        for _ in range(5):
            h, _ = model(tokens, memories); model.log_probs(h[:, -1])
        out.append((time.perf_counter() - t) / 5 * 1000)
print(json.dumps(out))
""",
    "decode": r"""
import json, time, torch
torch.set_num_threads(2)
import txl
config = txl.TxlConfig(vocab_size=256, cutoffs=[], d_model=256, d_embed=256, n_head=8, d_head=32, d_inner=1024,
                       div_val=1, n_layer=8, mem_len=512, tgt_len=128, same_length=False, dropout=0.0)
torch.manual_seed(0)
model = txl.TransfoXLLMHeadModel(config).eval()
out = []
with torch.no_grad():
    for n in (1, 16, 64):
        memories = []
        for i in range(n):
            _, m = model(torch.randint(0, 256, (1, 32 + 7 * i)), model.empty_memory())
            memories.append(m)
        tokens = torch.randint(0, 256, (n, 1))
        for _ in range(3):
            h, memories = model(tokens, memories); model.log_probs(h[:, -1])
        t = time.perf_counter()
        for _ in range(20):
            h, memories = model(tokens, memories); model.log_probs(h[:, -1])
        out.append((time.perf_counter() - t) / 20 * 1000)
print(json.dumps(out))
""",
    "bf16": r"""
import json, time, torch
torch.set_num_threads(2)
import txl
from txl.checkpoint import build_model
model = build_model(txl.TxlConfig.wt103())
model.init_weights(torch.Generator().manual_seed(0))
model = model.to(torch.bfloat16)
out = []
with torch.inference_mode():
    for length in (1600, 3800):
        state = {"memory": memory(model, 1, length)}
        def decode():
            h, state["memory"] = model(torch.tensor([[42]]), state["memory"]); model.log_probs(h[:, -1])
        out.append(best(decode, 10) * 1000)
    start = memory(model, 1, 1600)
    segment = torch.randint(0, 20000, (1, 128))
    out.append(best(lambda: model(segment, start), 3) * 1000)
print(json.dumps(out))
""",
    "paged": r"""
import json, time, torch
torch.set_num_threads(2)
import txl
from txl.checkpoint import build_model
out = []
wt103 = build_model(txl.TxlConfig.wt103())
wt103.init_weights(torch.Generator().manual_seed(0))
with torch.inference_mode():
    state = {"memory": memory(wt103, 1, 1600)}
    def decode():
        h, state["memory"] = wt103(torch.tensor([[42]]), state["memory"]); wt103.log_probs(h[:, -1])
    out.append(best(decode, 10) * 1000)
    document = torch.randint(0, 20000, (4096,))
    def score():
        m, last = wt103.empty_memory(mem_len=1600), None
        for start in range(0, 4096, 128):
            h, m = wt103(document[None, start : start + 128], m)
            predictors = h[0, :-1] if last is None else torch.cat([last[None], h[0, :-1]])
            targets = document[start + 1 : start + 128] if last is None else document[start : start + 128]
            wt103.target_log_probs(predictors, targets).sum().item()
            last = h[0, -1]
    out.append(best(score, 1))
config = txl.TxlConfig(vocab_size=256, cutoffs=[], d_model=256, d_embed=256, n_head=8, d_head=32, d_inner=1024,
                       div_val=1, n_layer=8, mem_len=512, tgt_len=128, same_length=False, dropout=0.0)
torch.manual_seed(0)
small = txl.TransfoXLLMHeadModel(config).eval()
with torch.inference_mode():
    state = {"memory": memory(small, 64, 512)}
    tokens = torch.randint(0, 256, (64, 1))
    def batched():
        h, state["memory"] = small(tokens, state["memory"]); small.log_probs(h[:, -1])
    out.append(best(batched, 10) * 1000)
print(json.dumps(out))
""",
    "sample": r"""
import json, time, torch
torch.set_num_threads(2)
from txl.sampling import SamplingParams, make_generator, sample
import txl.sampling as s
log_probs = torch.log_softmax(torch.randn(64, 267735, generator=torch.Generator().manual_seed(0)) * 3, dim=-1)
params = [SamplingParams(temperature=0.8, top_p=0.9, seed=i) for i in range(64)]
gens = [make_generator(i) for i in range(64)]
def step():
    if hasattr(s, "sample_batch"):
        s.sample_batch(log_probs, params, gens)
    else:
        for i in range(64):
            sample(log_probs[i], params[i], gens[i])
step()
t = time.perf_counter()
for _ in range(3):
    step()
print(json.dumps([(time.perf_counter() - t) / 3 * 1000]))
""",
    "train": r"""
import json, time, torch, inspect
torch.set_num_threads(2)
from txl.train import TrainConfig, Trainer
cfg = TrainConfig(data_dir=DATA, out=OUT, batch_size=16, tgt_len=128, mem_len=256, dropout=0.1)
trainer = Trainer(cfg)
args = (1000,) if len(inspect.signature(trainer.train_step).parameters) else ()
for _ in range(3):
    trainer.train_step(*args)
t = time.perf_counter()
for _ in range(6):
    trainer.train_step(*args)
print(json.dumps([(time.perf_counter() - t) / 6 * 1000]))
""",
}


def export(revision: str, into: Path) -> Path:
    """The repository's files at `revision`, in `into`."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", revision], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


# Helpers every probe may use: a memory of random keys and values, and the best time of a few runs.
PRELUDE = r"""
import time, torch
def memory(model, rows, length):
    import txl
    layout = model.memory_layout()
    shape = (rows, layout.n_head, length, layout.d_head)
    tensors = {}
    for i in range(layout.n_layer):
        tensors[f"keys.{i}"] = torch.randn(shape, dtype=layout.dtype)
        tensors[f"values.{i}"] = torch.randn(shape, dtype=layout.dtype)
    return txl.Memory.from_tensors(layout, tensors, mem_len=length)
def best(step, repeat):
    for _ in range(2):
        step()
    times = []
    for _ in range(repeat):
        t = time.perf_counter(); step(); times.append(time.perf_counter() - t)
    return min(times)
"""


def probe(name: str, source: Path, data_dir: str) -> list[float]:
    code = f"import sys; sys.path.insert(0, {str(source / 'model')!r})\nDATA = {data_dir!r}\n"
    code += f"OUT = {tempfile.mkdtemp(prefix='txl-speed-')!r}\n" + PRELUDE + PROBES[name]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"the {name} probe failed at {source.name}:\n{result.stderr[-2000:]}")
    return list(json.loads(result.stdout.strip().splitlines()[-1]))


def run(quick: bool = False) -> Section:
    section = Section("speedwork", "Speed work: before and after", "python -m bench speedwork")
    section.note(__doc__.split("\n\n", 1)[1].strip())
    data_dir = str(ROOT.parent / "shared" / "data")
    rows, skipped = [], []
    with tempfile.TemporaryDirectory(prefix="txl-rev-") as tmp:
        for title, revision, name, unit in CHANGES:
            if name == "train" and not Path(data_dir, "gutenberg").is_dir():
                continue  # the training probe reads the shared books
            if name in ("bf16", "train") and not cpu_runs_bfloat16():  # both compute in bfloat16
                skipped.append(title)  # oneDNN refuses bfloat16 on CPUs without AVX-512 or AVX-NE-CONVERT
                continue
            first, last = revision.split("..") if ".." in revision else (revision, revision.removesuffix("^"))
            sources = (
                export(first, Path(tmp) / f"{name}-before"),
                export(last, Path(tmp) / f"{name}-after"),
            )
            # Rounds alternate before and after, so a slow spell on a shared machine hits both sides.
            runs: list[list[list[float]]] = [[], []]
            for _ in range(ROUNDS.get(name, 1)):
                for side, source in enumerate(sources):
                    runs[side].append(probe(name, source, data_dir))
            before, after = ([min(values) for values in zip(*side, strict=True)] for side in runs)
            rows.append(
                [
                    title,
                    f"`{revision.removesuffix('^')}`",
                    " / ".join(f"{v:.3g}" for v in before),
                    " / ".join(f"{v:.3g}" for v in after),
                    " / ".join(f"{b / a:.1f}x" for b, a in zip(before, after, strict=True)),
                    unit,
                ]
            )
    section.table(
        "Each change, measured before and after in this run",
        ["change", "commit", "before", "after", "speed-up", "unit"],
        rows,
    )
    section.note(
        "What the changes were: (0) oneDNN inner products with packed weights instead of MKL's (which reads "
        "weights at half the bandwidth for one row and a third for a few rows); (1) batched attention over memory views with `bmm` (torch.matmul's 4-d path copied "
        "each session's whole memory every step) and one positional product for all rows; (2) sampling every row "
        "with one vectorised inverse-CDF draw from its own generator, and the nucleus found among the best "
        "candidates instead of sorting the whole vocabulary; (3) the relative shift as pad-and-reshape when "
        "gradients flow (the strided view's backward was 38% of a training step); (4) in bfloat16 on CPU, "
        "copying the memory's key slice (decode) and the positional table's slice into a reused buffer before `bmm`: the kernel "
        "copies such batch-strided transposed operands itself, several times slower (float32 reads them in place); "
        "(5) memory in one pool of 16-position blocks per device (sessions as block tables), one forward for every "
        "row whatever its memory length, and decoding attention through a native kernel that reads the blocks "
        "in place (`9b4b4a8` is the last commit before it)."
    )
    for title in skipped:
        section.note(f"Not measured on this CPU (no native bfloat16): {title}.")
    return section
