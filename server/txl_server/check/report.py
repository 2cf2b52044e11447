"""The report `python -m txl_server check` prints: a line per check or figure, whether it passes, the verdict."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..engine.comparison import Comparison
from ..engine.decode_path import CheckedPath
from ..engine.device_report import DeviceReport
from .parity import Parity
from .speed import Speed


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


# ---------------------------------------------------------------------------------------------- lines


def describe_device(report: CheckReport, path: CheckedPath, seconds: float) -> None:
    d = report.device
    report.add("device", f"{d.device} ({d.device_name}), {d.dtype}")
    report.add("decode path", path.path.describe())
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


def describe_parity(report: CheckReport, parity: Parity) -> None:
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


def describe_budget(report: CheckReport, block_bytes: int) -> None:
    d = report.device
    pool, budgets = d.pool, d.budgets
    report.add(
        "memory pool",
        f"{pool.blocks:,} blocks of {pool.block_size} positions, {pool.bytes / 2**20:,.1f} MiB, "
        + ("fixed" if pool.fixed else "grows on demand"),
    )
    per_session = -(-(d.window.max_positions + pool.block_size - 1) // pool.block_size) * block_bytes
    report.add(
        "budgets",
        f"device {budgets.device / 2**20:,.0f} MiB (~{budgets.device // per_session:,} sessions at mem_len "
        f"{d.window.max_mem_len}), prefix cache {budgets.prefix_cache / 2**20:,.0f} MiB, host "
        f"{budgets.host / 2**20:,.0f} MiB ({budgets.how})",
    )


def describe_speed(report: CheckReport, speed: Speed) -> None:
    report.add("copy bandwidth", f"{speed.bandwidth / 1e9:,.1f} GB/s (read + written)")
    report.add(
        "decode, 1 session",
        f"{1 / speed.decode_one:,.0f} tokens/s, {speed.decode_one * 1000:.2f} ms per token at mem {speed.mem:,}; "
        f"floor {speed.floor_one * 1000:.3f} ms ({speed.weight_bytes / 2**20:,.1f} MiB of weights, "
        f"{_memory_bytes(speed) / 2**20:,.1f} MiB of keys, values and positions): "
        f"{speed.decode_one / speed.floor_one:,.1f}x the floor",
    )
    report.add(
        f"decode, {speed.batch} sessions",
        f"{speed.batch / speed.decode_batch:,.0f} tokens/s, {speed.decode_batch * 1000:.2f} ms per step at mem "
        f"{speed.mem:,}; floor {speed.floor_batch * 1000:.3f} ms (weights read once per step, each session's "
        f"keys and values): {speed.decode_batch / speed.floor_batch:,.1f}x the floor",
    )
    report.add(
        "scoring",
        f"{speed.scoring:,.0f} tokens/s over {speed.document:,} tokens: "
        f"{speed.scoring_floor / speed.scoring:,.2f}x the floor's time",
    )


def _memory_bytes(speed: Speed) -> float:
    """What one session's step reads beside the weights: its memory's keys and values, the positional keys."""
    return speed.floor_one * speed.bandwidth - speed.weight_bytes
