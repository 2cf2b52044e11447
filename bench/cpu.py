"""CPU decode and prefill against their floors, one section per machine class (`python -m bench cpu`).

For the bundled model (float32) and the wt103 shape (random weights; float32, and bfloat16 where the CPU
computes it natively): a decode step at batch 1, 8 and 64 (every row with a full memory; the step includes the
full next-token distribution) and one 128-token segment over a full memory (transformer only), with 1 thread and
with torch's default thread count. Each figure stands beside its floor, measured in the same run: the bytes a
step must read (every weight it uses once, the rows' memories, the positional table) over the read bandwidth of
a 512 MiB buffer, or its FLOPs over this CPU's best matmul rate (torch's or oneDNN's, 2048 x 2048), whichever
is larger.

Each model runs in a subprocess per source tree: this one, on the C kernels' decode path with its linear kernels
chosen by measurement, and with every layer on one kernel wherever it can run (torch's, oneDNN's packed one, the
C loop for up to 16 rows), interleaved step by step; and the tree before kernels were chosen (`BEFORE`, oneDNN's `mkldnn_linear`
everywhere). The speed-up over the tree before compares two processes that measure one variant each, the
chosen kernels here and `BEFORE`'s, one after the other: interleaving measures four copies of every weight in
one process, and would cost the chosen one caches that `BEFORE`, alone, keeps. On a CPU with AVX-512 the
suite also measures an AVX2-only CPU, simulated by limiting oneDNN, ATen, MKL and the C kernels (built without
AVX-512) to AVX2; a simulated section never replaces one measured natively.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from txl_server.check.benchmark_docs import Section, machine

from .common import ROOT, export_revision

ROW_BUCKETS = (1, 4, 16, 64, 256)  # txl.kernels.cpu.linear_choice's, which a tree before it has not

BEFORE = "1ffa65d"  # the last commit before linear kernels were chosen by measurement
SIMULATED_AVX2 = {
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "TXL_CPU_KERNEL_ISA": "avx2",  # our C kernels built without AVX-512
}
BATCHES = (1, 8, 64)
VARIANTS = ("chosen", "torch", "onednn", "c")  # linear kernels; "before" runs in its own tree
SEGMENT = 128
BUNDLED = ROOT / "server" / "txl_server" / "default_model"
NATIVE_MARK = "Measured natively"


@dataclass(frozen=True)
class Workload:
    model: str  # "bundled" or "wt103"
    dtype: str
    mem: int  # positions in every row's memory

    @property
    def label(self) -> str:
        return f"{'bundled model' if self.model == 'bundled' else 'wt103 shape'}, {self.dtype}, memory {self.mem}"


# wt103 decodes over 128 positions: 64 rows at its own 1,600 would hold 14 GiB of float32 memory.
WORKLOADS = (
    Workload("bundled", "float32", 512),
    Workload("wt103", "float32", 128),
    Workload("wt103", "bfloat16", 128),
)


# ---------------------------------------------------------------------------------------------- in the probe


def _clock(threads: int) -> Callable[[], float]:
    """One thread: the thread's CPU time, which other processes on a shared machine do not inflate (the
    wall-clock minimum of a 50 ms segment varied 3x between runs there). More: wall-clock time."""
    return time.thread_time if threads == 1 else time.perf_counter


def _repeats(threads: int, quick: bool) -> tuple[int, float]:
    """(rounds at least, seconds at least) of a measurement: more with several threads, whose rounds a thread
    descheduled by another process spoils (every thread waits for it at the next barrier)."""
    if quick:
        return 2, 0.2
    return (5, 1.0) if threads == 1 else (10, 3.0)


def _best(runs: dict[str, Callable[[], object]], threads: int, reps: int, budget: float) -> dict[str, float]:
    """Best seconds per call of each run, in interleaved rounds, after two warm-up calls each."""
    clock = _clock(threads)
    for run in runs.values():
        run()
        run()
    best = dict.fromkeys(runs, float("inf"))
    started = time.perf_counter()
    rounds = 0
    while rounds < reps or (time.perf_counter() - started < budget and rounds < 100):
        for name, run in runs.items():
            t0 = clock()
            run()
            best[name] = min(best[name], clock() - t0)
        rounds += 1
    return best


def _read_bandwidth(mib: int) -> float:
    """Bytes/s of a sum over a buffer of `mib` MiB (read once per pass)."""
    src = torch.ones(mib * 2**20 // 4)
    threads = torch.get_num_threads()
    seconds = _best({"read": lambda: src.sum()}, threads, *_repeats(threads, False))["read"]
    return src.numel() * 4 / seconds


def _matmul_peak(dtype: torch.dtype, n: int) -> float:
    """FLOP/s of the faster of torch's matmul and oneDNN's packed inner product on n x n matrices."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    runs: dict[str, Callable[[], object]] = {"torch": lambda: a @ b}
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(b, None)
        runs["onednn"] = lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], "")
    except (AttributeError, RuntimeError):
        pass
    threads = torch.get_num_threads()
    seconds = min(_best(runs, threads, *_repeats(threads, False)).values())
    return 2 * n**3 / seconds


def _floors(spec: dict) -> dict:
    from txl.kernels.cpu import linear

    out: dict[str, dict] = {}
    for threads in spec["threads"]:
        torch.set_num_threads(threads)
        peaks = {"float32": _matmul_peak(torch.float32, 1024 if spec["quick"] else 2048)}
        if linear.cpu_runs_bfloat16():
            peaks["bfloat16"] = _matmul_peak(torch.bfloat16, 1024 if spec["quick"] else 2048)
        out[str(threads)] = {
            "read": _read_bandwidth(128 if spec["quick"] else 512),
            "cached_read": _read_bandwidth(16),
            "peak": peaks,
        }
    return out


def _model(workload: Workload):
    import txl
    from txl.checkpoint import build_model

    if workload.model == "bundled":
        return txl.load_pretrained(BUNDLED, dtype=workload.dtype)
    model = build_model(txl.TxlConfig.wt103())
    model.init_weights(torch.Generator().manual_seed(0))
    return model.to(getattr(torch, workload.dtype))


def _memory(model, rows: int, length: int):
    import txl

    layout = model.memory_layout()
    shape = (rows, layout.n_head, length, layout.d_head)
    tensors = {}
    for i in range(layout.n_layer):
        tensors[f"keys.{i}"] = torch.randn(shape).to(layout.dtype)
        tensors[f"values.{i}"] = torch.randn(shape).to(layout.dtype)
    return txl.Memory.from_tensors(layout, tensors, mem_len=length)


def _costs(model, workload: Workload) -> dict[str, dict[str, float]]:
    """Bytes read and FLOPs of each measured step: decode at each batch, and one segment."""
    c = model.config
    element = torch.empty((), dtype=model.dtype).element_size()
    seen: set[int] = set()

    def unique(params) -> list[torch.Tensor]:
        kept = [p for name, p in params if id(p) not in seen and "r_net" not in name]
        seen.update(id(p) for p in kept)
        return kept

    layer_params = unique(model.transformer.layers.named_parameters())
    positional_nets = [attention.r_net for attention in model.transformer.attentions]  # served by a table
    head_params = unique(model.crit.named_parameters())  # read whole for a full distribution (tied or not)
    layer_bytes = sum(p.numel() for p in layer_params) * element
    head_bytes = sum(p.numel() for p in head_params) * element
    linears = [m for name, m in model.transformer.layers.named_modules() if isinstance(m, torch.nn.Linear)]
    matrix_flops = 2 * sum(m.weight.numel() for m in linears if m not in positional_nets)  # per token
    head_flops = 2 * sum(p.numel() for p in head_params if p.dim() == 2)  # per token, full distribution
    attention = c.n_head * c.d_head

    def attention_flops(keys: int) -> int:  # per query, every layer: AC, BD and the weighted sum of values
        return c.n_layer * 6 * keys * attention

    per_position = model.memory_layout().bytes_per_position()
    positional = c.n_layer * attention * element  # bytes per distance of the positional table
    mem = workload.mem
    costs = {}
    for batch in BATCHES:
        costs[f"decode {batch}"] = {
            "bytes": layer_bytes + head_bytes + batch * mem * per_position + (mem + 1) * positional,
            "flops": batch * (matrix_flops + head_flops + attention_flops(mem + 1)),
        }
    costs["segment"] = {
        "bytes": layer_bytes + mem * per_position + (mem + SEGMENT) * positional,
        "flops": SEGMENT * matrix_flops + sum(attention_flops(mem + i + 1) for i in range(SEGMENT)),
    }
    return costs


def _measure(spec: dict) -> dict:
    workload = Workload(**spec["workload"])
    variants = spec["variants"]
    if variants == ["before"]:  # a tree of its own, from before the linear kernels and the decode path
        try:
            from txl.kernels.cpu.allocator import keep_freed_memory
        except ImportError:  # a tree from before it: its allocator as it was
            pass
        else:
            keep_freed_memory()  # as the server does on a CPU
        paths: dict[str, dict] = {"before": {}}  # keyword arguments of every call: none there
    else:
        from txl.kernels import DecodePath, fastest
        from txl.kernels.cpu import linear
        from txl.kernels.cpu.allocator import keep_freed_memory

        keep_freed_memory()
        chosen = fastest("cpu")  # the C kernels, each linear layer taking the fastest kernel measured
        paths = {v: {"path": chosen if v == "chosen" else DecodePath.c(linear=(v,))} for v in variants}
    model = _model(workload)

    quick = spec["quick"]
    results: dict[str, dict] = {}
    vocab = model.config.vocab_size
    with torch.inference_mode():
        for threads in spec["threads"]:
            torch.set_num_threads(threads)
            reps, budget = _repeats(threads, quick)
            timings: dict[str, dict[str, float]] = {}
            for batch in BATCHES:
                state = {"memory": _memory(model, batch, workload.mem)}
                tokens = torch.randint(0, vocab, (batch, 1))

                def decode(variant: str, state=state, tokens=tokens) -> None:
                    hidden, state["memory"] = model(tokens, state["memory"], **paths[variant])
                    model.log_probs(hidden[:, -1], **paths[variant])

                best = _best({v: (lambda v=v, d=decode: d(v)) for v in variants}, threads, reps, budget)
                for variant, seconds in best.items():
                    timings.setdefault(variant, {})[f"decode {batch}"] = seconds
                del state
            start = _memory(model, 1, workload.mem)
            segment = torch.randint(0, vocab, (1, SEGMENT))

            def prefill(variant: str, segment=segment, start=start) -> None:
                model(segment, start, **paths[variant])

            best = _best({v: (lambda v=v: prefill(v)) for v in variants}, threads, reps, budget)
            for variant, seconds in best.items():
                timings[variant]["segment"] = seconds
            results[str(threads)] = timings
    out = {"times": results, "costs": _costs(model, workload)}
    if "chosen" in variants:
        out["choices"] = linear.chosen_kernels(model)
    return out


def probe_main(spec_json: str) -> None:
    """Entry point of a probe subprocess: prints one JSON line."""
    spec = json.loads(spec_json)
    result = _floors(spec) if spec["kind"] == "floors" else _measure(spec)
    print(json.dumps(result))


# ---------------------------------------------------------------------------------------------- in the parent


def _probe(spec: dict, source: Path, env: dict[str, str]) -> dict:
    code = (
        f"import sys; sys.path.insert(0, {str(source / 'model')!r}); sys.path.insert(1, {str(ROOT)!r})\n"
        f"from bench.cpu import probe_main; probe_main({json.dumps(spec)!r})\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True
    )
    if done.returncode:
        raise RuntimeError(f"a cpu probe failed ({spec['kind']}, {source}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _vector_class(env: dict[str, str]) -> str:
    if env.get("ATEN_CPU_CAPABILITY") == "avx2":
        return "avx2"
    return "avx512" if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else "avx2"


@dataclass
class ClassRun:
    """Everything measured for one machine class."""

    name: str  # "avx2" or "avx512"
    simulated: bool
    threads: list[int]
    floors: dict
    results: dict[Workload, dict]
    load: tuple[float, float] = (0.0, 0.0)  # the 1-minute load average when the class started and ended


def _measure_class(env: dict[str, str], simulated: bool, before: Path, quick: bool) -> ClassRun:
    load = os.getloadavg()[0]
    threads = sorted({1, _default_threads(env)})
    floors = _probe({"kind": "floors", "threads": threads, "quick": quick}, ROOT, env)
    bfloat16 = "bfloat16" in floors[str(threads[0])]["peak"]
    results = {}
    for workload in WORKLOADS:
        if workload.dtype == "bfloat16" and not bfloat16:
            continue
        spec = {"workload": workload.__dict__, "threads": threads, "quick": quick}
        print(f"  {workload.label}", flush=True)
        now = _probe({**spec, "kind": "model", "variants": list(VARIANTS)}, ROOT, env)
        # the comparison across trees: one variant a process, each alone, one right after the other
        alone = _probe({**spec, "kind": "model", "variants": ["chosen"]}, ROOT, env)
        then = _probe({**spec, "kind": "model", "variants": ["before"]}, before, env)
        for count, timings in then["times"].items():
            now["times"][count].update(timings, alone=alone["times"][count]["chosen"])
        results[workload] = now
    return ClassRun(_vector_class(env), simulated, threads, floors, results, (load, os.getloadavg()[0]))


def _default_threads(env: dict[str, str]) -> int:
    """torch's own thread count in a fresh process (the suite's parent sets its own)."""
    code = "import torch; print(torch.get_num_threads())"
    done = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True
    )
    return int(done.stdout.strip() or 1)


# ---------------------------------------------------------------------------------------------- rendering

STEPS = [*(f"decode {b}" for b in BATCHES), "segment"]
CLASS_TITLES = {"avx512": "AVX-512", "avx2": "AVX2 only"}


def _step_label(step: str) -> str:
    return f"decode, batch {step.split()[1]}" if step.startswith("decode") else f"{SEGMENT}-token segment"


def _floor(run: ClassRun, workload: Workload, step: str, threads: int) -> tuple[float, str]:
    """(seconds, what bounds it) for one step."""
    floors = run.floors[str(threads)]
    cost = run.results[workload]["costs"][step]
    reading = cost["bytes"] / floors["read"]
    computing = cost["flops"] / floors["peak"][workload.dtype]
    return (reading, "bytes") if reading >= computing else (computing, "FLOPs")


def _tokens(step: str) -> int:
    return SEGMENT if step == "segment" else int(step.split()[1])


def class_section(run: ClassRun) -> Section:
    title = CLASS_TITLES[run.name]
    kind = SimulatedClassSection if run.simulated else Section
    section = kind(f"cpu-{run.name}", f"CPU decode and prefill: {title}", "python -m bench cpu")
    if run.simulated:
        section.machine = (
            f"{machine()}, limited to AVX2 ({', '.join(f'{k}={v}' for k, v in SIMULATED_AVX2.items())})"
        )
        section.note(
            "Simulated: an AVX-512 CPU with oneDNN, ATen, MKL and the C kernels (attention, the native linear "
            "loop, the fused decode layer) limited to AVX2; caches and memory are the real CPU's: a native AVX2 "
            "run replaces this section."
        )
    else:
        section.note(f"{NATIVE_MARK} on this CPU.")
    section.note(
        f"Load average {run.load[0]:.1f} when this class started and {run.load[1]:.1f} when it ended, on "
        f"{os.cpu_count()} cores. With 1 thread the figures are the thread's CPU time (best of several rounds), "
        f"which other processes do not inflate by taking the core; with more, they are wall-clock minima, which a "
        f"thread descheduled by another process spoils at every barrier: on a shared machine they are upper "
        f"bounds, and the kernels chosen for them partly chance."
    )
    floor_rows = []
    for threads in run.threads:
        f = run.floors[str(threads)]
        floor_rows.append(
            [
                threads,
                f["read"] / 1e9,
                f["cached_read"] / 1e9,
                f["peak"]["float32"] / 1e9,
                f["peak"]["bfloat16"] / 1e9 if "bfloat16" in f["peak"] else "no native bfloat16",
            ]
        )
    section.table(
        "This CPU: read bandwidth and matmul peak",
        [
            "threads",
            "read, 512 MiB (GB/s)",
            "read, 16 MiB (GB/s)",
            "fp32 matmul (GFLOP/s)",
            "bf16 matmul (GFLOP/s)",
        ],
        floor_rows,
    )
    for workload, result in run.results.items():
        rows = []
        for threads in run.threads:
            times = result["times"][str(threads)]["chosen"]
            for step in STEPS:
                floor, bound = _floor(run, workload, step, threads)
                cost = result["costs"][step]
                seconds = times[step]
                peak = run.floors[str(threads)]["peak"][workload.dtype]
                rows.append(
                    [
                        _step_label(step),
                        threads,
                        cost["bytes"] / 1e6,
                        cost["flops"] / 1e9,
                        f"{floor * 1000:.3g} ({bound})",
                        seconds * 1000,
                        seconds / floor,
                        _tokens(step) / seconds,
                        f"{100 * cost['flops'] / seconds / peak:.0f}%",
                    ]
                )
        section.table(
            f"{workload.label}: against the floor",
            [
                "step",
                "threads",
                "MB read",
                "GFLOP",
                "floor (ms)",
                "measured (ms)",
                "x floor",
                "tokens/s",
                "of matmul peak",
            ],
            rows,
        )
    compare = []
    for workload, result in run.results.items():
        for threads in run.threads:
            times = result["times"][str(threads)]
            for step in STEPS:
                compare.append(
                    [
                        workload.label,
                        _step_label(step),
                        threads,
                        *(times[v][step] * 1000 for v in ("before", *VARIANTS[1:], "chosen", "alone")),
                        f"{times['before'][step] / times['alone'][step]:.2f}x",
                    ]
                )
    section.table(
        f"Linear kernels compared, ms per step (before: `{BEFORE}`, oneDNN's `mkldnn_linear` everywhere, in a "
        f"process of its own; torch, oneDNN, C and chosen interleaved in one process; chosen, alone: in a "
        f"process of its own, for the speed-up over before)",
        [
            "workload",
            "step",
            "threads",
            "before",
            "torch",
            "oneDNN",
            "C",
            "chosen",
            "chosen, alone",
            "speed-up",
        ],
        compare,
    )
    choices = _choice_rows(run)
    measured = [i for i, rows in enumerate(ROW_BUCKETS) if any(row[2 + i] != "–" for row in choices)]
    section.table(
        "Kernels chosen on this CPU, by rows bucket (threads)",
        ["layer (out x in, dtype)", "threads", *(f"rows {ROW_BUCKETS[i]}" for i in measured)],
        [[*row[:2], *(row[2 + i] for i in measured)] for row in choices],
    )
    return section


def _choice_rows(run: ClassRun) -> list[list[object]]:
    table: dict[tuple[str, str], dict[str, str]] = {}
    for result in run.results.values():
        for key, kernel in result.get("choices", {}).items():
            shape, dtype, rows, threads = key.split()
            if int(threads.removeprefix("threads=")) in run.threads:
                table.setdefault((f"{shape}, {dtype}", threads.removeprefix("threads=")), {})[rows] = kernel
    return [
        [layer, threads, *(kernels.get(f"rows={r}", "–") for r in ROW_BUCKETS)]
        for (layer, threads), kernels in sorted(table.items())
    ]


def _status(run: ClassRun) -> list[str]:
    """Issue 25's targets, against this class's figures (1 thread)."""
    lines = []
    bundled = next((w for w in run.results if w.model == "bundled"), None)
    if bundled is not None:
        times = run.results[bundled]["times"]["1"]["chosen"]
        floor, _ = _floor(run, bundled, "decode 1", 1)
        cost = run.results[bundled]["costs"]["segment"]
        share = cost["flops"] / times["segment"] / run.floors["1"]["peak"]["float32"]
        lines.append(
            f"bundled model, float32, 1 thread: decode at batch 1 {times['decode 1'] * 1000:.2f} ms = "
            f"{times['decode 1'] / floor:.1f}x its floor of {floor * 1000:.2f} ms (target: at most 2x); a "
            f"{SEGMENT}-token segment at {100 * share:.0f}% of matmul peak (target: at least 60%)"
        )
    for workload, result in run.results.items():
        if workload.model != "wt103":
            continue
        times = result["times"]["1"]
        ratios = [times["before"][s] / times["alone"][s] for s in STEPS]
        lines.append(
            f"{workload.label}, 1 thread: {min(ratios):.2f}-{max(ratios):.2f}x the speed of `{BEFORE}` "
            f"(target: at least 1x)"
        )
    return lines


def summary_section(runs: list[ClassRun]) -> Section:
    section = Section("cpu", "CPU decode and prefill against their floors", "python -m bench cpu")
    section.note(__doc__.split("\n\n", 1)[1].strip())
    for run in runs:
        kind = "simulated" if run.simulated else "native"
        for line in _status(run):
            section.note(f"{CLASS_TITLES[run.name]} ({kind}): {line}.")
    section.table(
        "Read bandwidth and matmul peak per machine class (1 thread)",
        ["class", "read, 512 MiB (GB/s)", "fp32 matmul (GFLOP/s)", "bf16 matmul (GFLOP/s)"],
        [
            [
                CLASS_TITLES[run.name] + (" (simulated)" if run.simulated else ""),
                run.floors["1"]["read"] / 1e9,
                run.floors["1"]["peak"]["float32"] / 1e9,
                run.floors["1"]["peak"]["bfloat16"] / 1e9
                if "bfloat16" in run.floors["1"]["peak"]
                else "no native bfloat16",
            ]
            for run in runs
        ],
    )
    if len(runs) > 1:
        rows = []
        for workload in runs[0].results:
            for step in STEPS:
                row: list[object] = [workload.label, _step_label(step)]
                for run in runs:
                    if workload in run.results:
                        seconds = run.results[workload]["times"]["1"]["chosen"][step]
                        row += [seconds * 1000, seconds / _floor(run, workload, step, 1)[0]]
                    else:
                        row += ["–", "–"]
                rows.append(row)
        header = ["workload", "step"]
        for run in runs:
            label = CLASS_TITLES[run.name] + (" (simulated)" if run.simulated else "")
            header += [f"{label} ms", f"{label} x floor"]
        section.table("How the machine classes compare (1 thread, kernels chosen on each)", header, rows)
    return section


class SimulatedClassSection(Section):
    """A machine class's section measured under a simulated instruction set: it does not replace the same class's
    section measured natively where it is saved."""

    def save(self, docs: Path) -> None:
        path = docs / "benchmarks" / f"{self.name}.md"
        if path.exists() and NATIVE_MARK in path.read_text(encoding="utf-8"):
            print(f"kept {path}: it was measured natively")
            return
        super().save(docs)


def run(quick: bool = False) -> list[Section]:
    """Each machine class's section, then the summary."""
    classes = [({}, False)]
    if _vector_class({}) == "avx512":
        classes.append((SIMULATED_AVX2, True))
    runs = []
    with tempfile.TemporaryDirectory(prefix="txl-cpu-") as tmp:
        before = export_revision(BEFORE, Path(tmp) / "before")
        for env, simulated in classes:
            name = CLASS_TITLES[_vector_class(env)] + (" (simulated)" if simulated else "")
            print(f"{name}:", flush=True)
            runs.append(_measure_class(env, simulated, before, quick))
    return [class_section(measured) for measured in runs] + [summary_section(runs)]
