"""`python -m bench cpu`: what a step must read and compute, its floor, and how the sections are written.

Timings are not checked (they belong to the benchmark); the arithmetic the figures are set against is, on the
bundled model, and so is the rule that a simulated machine class never replaces one measured natively.
"""

from __future__ import annotations

import pytest
import torch
import txl

from bench import cpu

CONFIG = txl.read_config(cpu.BUNDLED)


@pytest.fixture(scope="module")
def bundled() -> txl.TransfoXLLMHeadModel:
    return txl.load_pretrained(cpu.BUNDLED)


def test_a_decode_step_reads_every_weight_once_and_each_rows_memory(bundled):
    c = CONFIG
    costs = cpu._costs(bundled, cpu.Workload("bundled", "float32", 512))
    per_layer = (
        3 * c.d_model * c.n_head * c.d_head  # qkv
        + c.n_head * c.d_head * c.d_model  # o
        + 2 * c.d_model * c.d_inner  # feed-forward
        + c.d_inner  # its biases
        + c.d_model
        + 4 * c.d_model  # two LayerNorms
        + 2 * c.n_head * c.d_head  # u and v (untie_r)
    )
    head = c.vocab_size * c.d_embed + c.vocab_size  # tied with the embedding: read whole as the output layer
    kv = 2 * c.n_layer * c.n_head * c.d_head * 4  # bytes per position of memory
    positional = c.n_layer * c.n_head * c.d_head * 4  # bytes per distance of the positional table
    weights = (c.n_layer * per_layer + head) * 4
    assert costs["decode 1"]["bytes"] == weights + 512 * kv + 513 * positional
    assert costs["decode 64"]["bytes"] == weights + 64 * 512 * kv + 513 * positional


def test_flops_count_the_products_of_every_token_and_the_attention_over_its_keys(bundled):
    c = CONFIG
    costs = cpu._costs(bundled, cpu.Workload("bundled", "float32", 100))
    matrices = c.n_layer * (4 * c.d_model * c.n_head * c.d_head + 2 * c.d_model * c.d_inner)
    attention = [c.n_layer * 6 * keys * c.n_head * c.d_head for keys in range(101, 101 + cpu.SEGMENT)]
    assert costs["segment"]["flops"] == cpu.SEGMENT * 2 * matrices + sum(attention)
    head = 2 * c.vocab_size * c.d_embed
    assert costs["decode 8"]["flops"] == 8 * (2 * matrices + head + attention[0])


def _run(simulated: bool) -> cpu.ClassRun:
    """A class run with made-up figures: 10 GB/s, 100 GFLOP/s at one thread (twice that at two)."""
    workload = cpu.Workload("bundled", "float32", 512)
    times = {
        variant: {step: 0.004 * (1 + i) for i, step in enumerate(cpu.STEPS)}
        for variant in ("before", *cpu.VARIANTS)
    }
    times["alone"] = {step: 0.002 * (1 + i) for i, step in enumerate(cpu.STEPS)}  # chosen, in its own process
    costs = {step: {"bytes": 20e6, "flops": 0.1e9 if step != "segment" else 1.2e9} for step in cpu.STEPS}
    floors = {str(t): {"read": 10e9 * t, "cached_read": 50e9, "peak": {"float32": 100e9 * t}} for t in (1, 2)}
    result = {
        "times": {"1": times, "2": times},
        "costs": costs,
        "choices": {
            "768x256 float32 rows=1 threads=1": "plain",
            "768x256 float32 rows=16 threads=1": "onednn",
        },
    }
    return cpu.ClassRun("avx2", simulated, [1, 2], floors, {workload: result})


def test_the_floor_is_the_larger_of_reading_and_computing():
    run = _run(simulated=False)
    workload = next(iter(run.results))
    assert cpu._floor(run, workload, "decode 1", 1) == pytest.approx((20e6 / 10e9, "bytes"))
    assert cpu._floor(run, workload, "segment", 1) == pytest.approx((1.2e9 / 100e9, "FLOPs"))
    assert cpu._floor(run, workload, "segment", 2) == pytest.approx((1.2e9 / 200e9, "FLOPs"))
    markdown = cpu.class_section(run).markdown()
    assert "| decode, batch 1 | 1 | 20.0 | 0.1 | 2 (bytes) | 4 | 2 | 250 | 25% |" in markdown
    assert (
        "| layer (out x in, dtype) | threads | rows 1 | rows 16 |" in markdown
    )  # buckets never measured: no column
    assert "| 768x256, float32 | 1 | plain | onednn |" in markdown
    # the speed-up over the tree before sets its process against chosen's own, not the interleaved one
    assert (
        "| bundled model, float32, memory 512 | decode, batch 1 | 1 | 4 | 4 | 4 | 4 | 4 | 2 | 2.00x |"
        in markdown
    )
    status = cpu._status(run)[0]
    assert "decode at batch 1 4.00 ms = 2.0x its floor of 2.00 ms" in status
    assert "segment at 75% of matmul peak" in status  # 1.2 GFLOP in 16 ms at 100 GFLOP/s


def test_a_simulated_class_never_replaces_one_measured_natively(tmp_path):
    native = cpu.class_section(_run(simulated=False))
    simulated = cpu.class_section(_run(simulated=True))
    assert cpu.NATIVE_MARK not in simulated.markdown()
    assert "limited to AVX2" in simulated.machine
    saved = tmp_path / "benchmarks" / f"{native.name}.md"
    simulated.save(tmp_path)  # nothing there yet: it is written
    assert saved.read_text() == simulated.markdown() + "\n"
    native.save(tmp_path)  # a native measurement replaces a simulated one
    assert cpu.NATIVE_MARK in saved.read_text()
    simulated.save(tmp_path)  # ... which a simulated one then leaves alone
    assert saved.read_text() == native.markdown() + "\n"


def test_the_best_time_is_taken_over_interleaved_rounds():
    calls: list[str] = []
    best = cpu._best({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 1, 3, 0.0)
    assert calls[:4] == ["a", "a", "b", "b"]  # two warm-up calls each
    assert calls[4:10] == ["a", "b"] * 3
    assert set(best) == {"a", "b"} and all(0 <= s < 0.01 for s in best.values())


def test_the_matmul_peak_and_bandwidth_probes_measure_this_cpu():
    threads = torch.get_num_threads()
    try:
        floors = cpu._floors({"threads": [1], "quick": True})
    finally:
        torch.set_num_threads(threads)
    assert floors["1"]["read"] > 1e9 and floors["1"]["peak"]["float32"] > 1e9


def test_the_summary_sets_the_machine_classes_side_by_side():
    markdown = cpu.summary_section([_run(simulated=False), _run(simulated=True)]).markdown()
    assert "| AVX2 only | 10.0 | 100 | no native bfloat16 |" in markdown
    assert "| AVX2 only (simulated) | 10.0 | 100 | no native bfloat16 |" in markdown
    assert "| bundled model, float32, memory 512 | decode, batch 1 | 4 | 2 | 4 | 2 |" in markdown
    assert "AVX2 only (simulated): bundled model, float32, 1 thread: decode at batch 1 4.00 ms" in markdown
