"""`python -m txl_server check`: the configured model on the configured device, checked and measured.

Loads the model as the server would (the same TXL_* settings and flags), runs the server's own start-up checks
(`engine.selfcheck`: the attention kernel against the torch path, every decoding graph against the eager path),
starts the server's worker, and through it:

- parity: a prompt and a greedy continuation of a few hundred tokens through the engine (prompt segments, then
  one token per step, through the graphs where they are on) against the reference: the model's hidden-state
  path (HF's function: no pool, no kernels, no graphs) over the same tokens in segments of the session window
  grid, where the two compute the same function (txl.window); on a GPU or in half precision, both also against
  that reference in float32 on the CPU;
- a seeded generation run twice (the same tokens);
- the memory pool and the budgets;
- decoding and scoring speed against the memory-bandwidth floor measured in the same run.

Prints a report. Exit status 1 on any correctness failure, 2 when the settings or the model cannot be used.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from pydantic import ValidationError

from .check_measures import Parity, Speed, check_parity, measure_speed, repeated_generation
from .engine.device_report import DeviceReport, describe
from .engine.selfcheck import Comparison, ServingPath
from .settings import Settings

log = logging.getLogger("txl_server.check")


@dataclass(frozen=True)
class Line:
    """One line of the report: a name, what was found, and whether it passes (None: information only)."""

    name: str
    text: str
    ok: bool | None = None


@dataclass
class CheckReport:
    device: DeviceReport
    lines: list[Line] = field(default_factory=list)
    parity: Parity | None = None
    speed: Speed | None = None

    def add(self, name: str, text: str, ok: bool | None = None) -> None:
        self.lines.append(Line(name, text, ok))

    @property
    def failures(self) -> list[Line]:
        return [line for line in self.lines if line.ok is False]

    def render(self) -> str:
        width = max(len(line.name) for line in self.lines)
        out = []
        for line in self.lines:
            mark = {True: "ok  ", False: "FAIL", None: "    "}[line.ok]
            out.append(f"{mark} {line.name.ljust(width)}  {line.text}")
        verdict = (
            f"{len(self.failures)} check(s) failed: the server would run, but this device's fast path is wrong"
            if self.failures
            else "every check passed"
        )
        return "\n".join([*out, "", verdict])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m txl_server check",
        description="Check the configured model on the configured device (TXL_* settings; flags win) and "
        "measure it. Exit status 1 on a correctness failure.",
    )
    parser.add_argument("--model", type=Path, help="model directory (TXL_MODEL, default: the bundled model)")
    parser.add_argument("--device", help="torch device, e.g. cuda:0 (TXL_DEVICE, default cpu)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="TXL_DTYPE")
    parser.add_argument("--tokens", type=int, default=300, help="tokens compared for parity (default 300)")
    parser.add_argument("--log-level", default="warning", help="default warning: start-up fallbacks only")
    parser.add_argument(
        "--write-benchmarks",
        action="store_true",
        help="on a GPU, from the repository root: write the GPU section of docs/benchmarks.md",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    overrides = {k: getattr(args, k) for k in ("model", "device", "dtype") if getattr(args, k) is not None}
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        print(f"invalid settings: {exc}", file=sys.stderr)
        return 2
    if args.tokens < 16:
        print("--tokens must be at least 16", file=sys.stderr)
        return 2
    if args.write_benchmarks and not settings.device.startswith("cuda"):
        print("--write-benchmarks writes the GPU section: run it with --device cuda", file=sys.stderr)
        return 2
    from .runtime import load_model, worker_threads

    torch.set_num_threads(worker_threads(settings))
    try:
        loaded = load_model(settings)
    except Exception as exc:
        print(f"cannot load the model in {settings.model_dir}: {exc}", file=sys.stderr)
        return 2
    print(
        f"checking {loaded[2]} from {settings.model_dir} ({settings.dtype} on {settings.device})", flush=True
    )
    report = run_check(settings, loaded, tokens=args.tokens)
    print(report.render())
    if args.write_benchmarks:
        from .check_section import write_section

        print(f"wrote {write_section(report)}")
    return 1 if report.failures else 0


def run_check(settings: Settings, loaded: tuple, *, tokens: int = 300) -> CheckReport:
    """Every check and measurement, on a worker made and prepared as the server makes it."""
    from .runtime import make_worker, prepare_worker

    worker = make_worker(settings, loaded)
    started = time.perf_counter()
    path = prepare_worker(settings, worker)
    prepared = time.perf_counter() - started
    mem_len, max_mem_len = settings.mem_lens(worker.model.config.mem_len)
    report = CheckReport(describe(worker, path, mem_len=mem_len, max_mem_len=max_mem_len))
    _describe_device(report, path, prepared)
    if not report.device.device_ok:
        report.add("device", f"failed at start-up: {worker.device_error}", False)
        return report
    worker.start()
    try:
        report.parity = asyncio.run(check_parity(worker, settings, tokens=tokens))
        _describe_parity(report, report.parity)
        same = asyncio.run(repeated_generation(worker, mem_len))
        report.add("seeded generation", "the same tokens twice" if same else "different tokens", same)
        _describe_budget(report, settings, worker.pool.block_nbytes)
        report.speed = asyncio.run(measure_speed(worker, mem_len))
        _describe_speed(report, report.speed)
    finally:
        worker.stop()
    if worker.device_error is not None:
        report.add("device", f"failed while checking: {worker.device_error}", False)
    return report


# ---------------------------------------------------------------------------------------------- report lines


def _describe_device(report: CheckReport, path: ServingPath, seconds: float) -> None:
    d = report.device
    report.add("device", f"{d.device} ({d.device_name}), {d.dtype}")
    attention = d.attention + (f" ({d.attention_reason})" if d.attention_reason else "")
    report.add("attention", attention)
    for check in path.checks:
        if "kernel" in check.what:
            report.add("kernel vs torch", _comparison(check), check.ok)
    graphs = [c for c in path.checks if c.what.startswith("the graph")]
    if graphs:
        worst_logprob = max(c.logprob for c in graphs)
        worst_hidden = max(c.hidden for c in graphs)
        failed = [c for c in graphs if not c.ok]
        text = (
            f"{len(graphs)} graphs replayed against eager: worst |delta log p| {worst_logprob:.2g}, "
            f"|delta hidden| {worst_hidden:.2g}" + (f"; {failed[0].problem()}" if failed else "")
        )
        report.add("graphs vs eager", text, not failed)
    if d.cuda_graphs == "on":
        report.add(
            "cuda graphs", f"on: {d.graphs}" + (f" ({d.cuda_graphs_reason})" if d.cuda_graphs_reason else "")
        )
    else:
        report.add("cuda graphs", f"off ({d.cuda_graphs_reason})", None if not graphs else False)
    report.add("start-up checks", f"{seconds:.1f} s")


def _comparison(check: Comparison) -> str:
    if check.error is not None:
        return check.problem()
    return (
        f"{check.what}: tokens {'equal' if check.tokens_equal else 'differ'}, |delta log p| {check.logprob:.2g}, "
        f"|delta hidden| {check.hidden:.2g}"
    )


def _describe_parity(report: CheckReport, parity: Parity) -> None:
    report.add(
        "parity",
        f"{parity.positions} positions ({parity.prompt} prompt, {parity.generated} generated), window grid "
        f"{parity.grid}, mem_len {parity.mem_len}: max |delta log p| {parity.same:.2g} against the reference "
        f"in {parity.dtype}",
        parity.same_ok,
    )
    if parity.fp32 is not None:
        report.add(
            "parity vs cpu fp32",
            f"max |delta log p| {parity.fp32:.2g} (mean {parity.fp32_mean:.2g}); the reference in "
            f"{parity.dtype} is off by {parity.reference_fp32:.2g} (mean {parity.reference_fp32_mean:.2g})",
            parity.fp32_ok,
        )
    report.add(
        "greedy tokens",
        f"{parity.far_tokens} of {parity.generated} ranked below the reference's best by more than a near tie",
        parity.far_tokens == 0,
    )


def _describe_budget(report: CheckReport, settings: Settings, block_bytes: int) -> None:
    d = report.device
    pool = d.pool
    report.add(
        "memory pool",
        f"{pool.blocks:,} blocks of {pool.block_size} positions, {pool.bytes / 2**20:,.1f} MiB, "
        + ("fixed" if pool.fixed else "grows on demand"),
    )
    per_session = -(-(d.window.max_positions + pool.block_size - 1) // pool.block_size) * block_bytes
    report.add(
        "budgets",
        f"device {settings.device_memory_bytes / 2**20:,.0f} MiB (~{settings.device_memory_bytes // per_session:,} "
        f"sessions at mem_len {d.window.max_mem_len}), host {settings.host_memory_bytes / 2**20:,.0f} MiB",
    )


def _describe_speed(report: CheckReport, speed: Speed) -> None:
    report.add("copy bandwidth", f"{speed.bandwidth / 1e9:,.1f} GB/s (read + written)")
    report.add(
        "decode, 1 session",
        f"{1 / speed.decode_one:,.0f} tokens/s, {speed.decode_one * 1000:.2f} ms per token; floor "
        f"{speed.floor_one * 1000:.3f} ms ({speed.weight_bytes / 2**20:,.1f} MiB of weights): "
        f"{speed.decode_one / speed.floor_one:,.1f}x the floor",
    )
    report.add(
        f"decode, {speed.batch} sessions",
        f"{speed.batch / speed.decode_batch:,.0f} tokens/s, {speed.decode_batch * 1000:.2f} ms per step: "
        f"{speed.decode_batch / speed.floor_one:,.1f}x the floor (weights read once per step)",
    )
    report.add(
        "scoring",
        f"{speed.scoring:,.0f} tokens/s over {speed.document:,} tokens: "
        f"{speed.scoring_floor / speed.scoring:,.2f}x the floor's time",
    )
