"""How a linear layer's kernel is chosen: by timing the candidates this CPU can run, once per machine and shape.

The machines are faked (an AVX2-only EPYC without native bfloat16, an AVX-512 one with it) and so is the
timer, so that these tests check the choice logic on any machine, not the timings of this one.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from txl.kernels.cpu import linear
from txl.kernels.cpu.linear_choice import (
    FORMAT,
    KERNELS,
    ROUNDS,
    Entry,
    KernelChoices,
    Machine,
    last_level_cache_bytes,
    measure,
    rows_bucket,
    this_machine,
)

AVX2 = Machine(
    cpu="AMD EPYC", vector="AVX2 avx2", onednn_isa="", mkl_isa="", bfloat16=False, torch=torch.__version__
)
AVX512 = dataclasses.replace(AVX2, vector="AVX512 avx2 avx512f avx512_bf16", bfloat16=True)
needs_onednn = pytest.mark.skipif(not linear.onednn_available(), reason="this torch has no oneDNN")
needs_c = pytest.mark.skipif(
    linear.cpu_rows_linear() is None, reason="no C compiler here: the C kernel could not be built"
)


class FakeTimer:
    """Seconds per call, as on the EPYCs these figures come from: the C kernel wins at one row, oneDNN's
    fixed cost per call loses at a few rows and wins from more on; every question asked is recorded."""

    def __init__(self, onednn_wins_from_rows: int = 4) -> None:
        self.asked: list[Entry] = []
        self.wins_from = onednn_wins_from_rows

    def __call__(self, entry, candidates):
        self.asked.append(entry)
        plain = 1e-5 * entry.rows
        seconds = {
            "torch": plain,
            "onednn": plain * (0.5 if entry.rows >= self.wins_from else 2.0),
            "c": plain * (0.3 if entry.rows == 1 else 3.0),
        }
        return {name: seconds[name] for name in candidates}


class Spy:
    """Records which kernel computed each linear call."""

    def __init__(self, monkeypatch) -> None:
        self.calls: list[tuple[str, int, torch.dtype]] = []
        onednn, c, plain = linear._onednn, linear._c, torch.nn.functional.linear

        def spied_onednn(x, packed, bias, activation="none"):
            self.calls.append(("onednn", x.numel() // x.size(-1), x.dtype))
            return onednn(x, packed, bias, activation)

        def spied_c(x, weight, bias):
            self.calls.append(("c", x.numel() // x.size(-1), x.dtype))
            return c(x, weight, bias)

        def spied_plain(x, weight, bias=None):
            self.calls.append(("torch", x.numel() // x.size(-1), x.dtype))
            return plain(x, weight, bias)

        monkeypatch.setattr(linear, "_onednn", spied_onednn)
        monkeypatch.setattr(linear, "_c", spied_c)
        monkeypatch.setattr(linear.nn.functional, "linear", spied_plain)

    @property
    def kernels(self) -> list[str]:
        return [kernel for kernel, _, _ in self.calls]


def on_machine(
    monkeypatch, machine: Machine, directory, timer=None, *, compiler: bool = True
) -> KernelChoices:
    """This process behaves as `machine`: its bfloat16 support, its cache file, and whether it has a C compiler
    (without one, no C kernel)."""
    choices = KernelChoices(machine, directory, timer=timer or FakeTimer())
    monkeypatch.setattr(linear, "cpu_runs_bfloat16", lambda: machine.bfloat16)
    monkeypatch.setattr(linear, "kernel_choices", lambda: choices)
    if not compiler:
        monkeypatch.setattr(linear, "cpu_rows_linear", lambda: None)
    return choices


def run_layer(
    layer: torch.nn.Linear, rows: int, dtype: torch.dtype = torch.float32, kernels: tuple[str, ...] = KERNELS
) -> torch.Tensor:
    """The layer over `rows` rows, its kernel the fastest of `kernels` (a decode path's `linear`)."""
    with torch.inference_mode():
        return linear.linear(torch.randn(rows, layer.in_features).to(dtype), layer, kernels)


def test_rows_fall_in_the_nearest_measured_bucket():
    assert [rows_bucket(n) for n in (0, 1, 2, 7, 8, 31, 32, 127, 128, 4096)] == [
        1,
        1,
        4,
        4,
        16,
        16,
        64,
        64,
        256,
        256,
    ]


@needs_onednn
@needs_c
def test_each_rows_bucket_takes_the_faster_kernel_and_is_measured_once(monkeypatch, tmp_path):
    timer = FakeTimer(onednn_wins_from_rows=16)
    on_machine(monkeypatch, AVX512, tmp_path, timer)
    spy = Spy(monkeypatch)
    layer = torch.nn.Linear(32, 48)
    for rows in (1, 1, 3, 20, 20, 130):
        run_layer(layer, rows)
    assert spy.kernels == ["c", "c", "torch", "onednn", "onednn", "onednn"]
    assert [(e.rows, e.out_features, e.in_features) for e in timer.asked] == [
        (1, 48, 32),
        (4, 48, 32),
        (16, 48, 32),
        (256, 48, 32),
    ]


@needs_onednn
def test_without_a_c_compiler_the_choice_is_between_torchs_kernels(monkeypatch, tmp_path):
    timer = FakeTimer(onednn_wins_from_rows=16)
    on_machine(monkeypatch, AVX2, tmp_path, timer, compiler=False)
    spy = Spy(monkeypatch)
    layer = torch.nn.Linear(32, 48)
    for rows in (1, 20):
        run_layer(layer, rows)
    assert spy.kernels == ["torch", "onednn"]


@needs_c
def test_the_c_kernel_is_a_candidate_for_a_few_rows_only(monkeypatch, tmp_path):
    asked: list[tuple[int, tuple[str, ...]]] = []

    def timer(entry, candidates):
        asked.append((entry.rows, tuple(candidates)))
        return dict.fromkeys(candidates, 1.0)

    on_machine(monkeypatch, AVX2, tmp_path, timer)
    for rows in (1, 5, 17, 40):
        run_layer(torch.nn.Linear(32, 48), rows)
    with_onednn = ("onednn",) if linear.onednn_available() else ()
    assert asked == [
        (1, ("torch", *with_onednn, "c")),
        (4, ("torch", *with_onednn, "c")),
        (16, ("torch", *with_onednn, "c")),
        (64, ("torch", *with_onednn)),
    ]


@needs_onednn
def test_the_packed_copy_is_kept_only_where_onednn_won(monkeypatch, tmp_path):
    on_machine(monkeypatch, AVX512, tmp_path, FakeTimer(onednn_wins_from_rows=16))
    layer = torch.nn.Linear(32, 48)
    run_layer(layer, 1)
    assert layer._kernels.packed is None  # measured, lost: not worth its memory
    run_layer(layer, 64)
    assert layer._kernels.packed is not None


@needs_onednn
def test_avx2_without_native_bfloat16_never_times_onednn_in_bfloat16(monkeypatch, tmp_path):
    timer = FakeTimer()
    on_machine(monkeypatch, AVX2, tmp_path, timer, compiler=False)
    spy = Spy(monkeypatch)
    layer = torch.nn.Linear(32, 48).to(torch.bfloat16)
    for rows in (1, 64):
        run_layer(layer, rows, torch.bfloat16)
    assert timer.asked == []  # one candidate: nothing to measure
    assert spy.kernels == ["torch", "torch"]
    run_layer(torch.nn.Linear(32, 48), 64)  # float32 still has oneDNN there
    assert [e.dtype for e in timer.asked] == [torch.float32]
    assert spy.kernels[-1] == "onednn"


@needs_onednn
def test_avx512_with_native_bfloat16_times_both_kernels_in_bfloat16(monkeypatch, tmp_path):
    timer = FakeTimer()
    on_machine(monkeypatch, AVX512, tmp_path, timer)
    if not linear.onednn_available() or not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("this CPU cannot run oneDNN in bfloat16, whatever the fake machine says")
    spy = Spy(monkeypatch)
    run_layer(torch.nn.Linear(32, 48).to(torch.bfloat16), 64, torch.bfloat16)
    assert [(e.dtype, e.rows) for e in timer.asked] == [(torch.bfloat16, 64)]
    assert spy.calls == [("onednn", 64, torch.bfloat16)]


@needs_onednn
def test_choices_are_saved_and_a_later_process_on_the_same_machine_reuses_them(monkeypatch, tmp_path):
    on_machine(monkeypatch, AVX512, tmp_path, compiler=False)
    run_layer(torch.nn.Linear(32, 48), 1)
    run_layer(torch.nn.Linear(32, 48), 64)
    (saved,) = tmp_path.glob("linear-*.json")
    choices = json.loads(saved.read_text())["choices"]
    assert choices == {_key(1): "torch", _key(64): "onednn"}

    later = FakeTimer()
    on_machine(monkeypatch, AVX512, tmp_path, later, compiler=False)
    spy = Spy(monkeypatch)
    run_layer(torch.nn.Linear(32, 48), 64)
    assert later.asked == [] and spy.kernels == ["onednn"]


@needs_onednn
def test_another_machine_or_thread_count_measures_afresh(monkeypatch, tmp_path):
    on_machine(monkeypatch, AVX512, tmp_path)
    run_layer(torch.nn.Linear(32, 48), 64)

    other = FakeTimer()
    on_machine(monkeypatch, AVX2, tmp_path, other)  # the same directory (a shared home), another CPU
    run_layer(torch.nn.Linear(32, 48), 64)
    assert len(other.asked) == 1
    assert len(list(tmp_path.glob("linear-*.json"))) == 2  # one file per machine

    more_threads = FakeTimer()
    on_machine(monkeypatch, AVX512, tmp_path, more_threads)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        run_layer(torch.nn.Linear(32, 48), 64)
    finally:
        torch.set_num_threads(threads)
    assert [e.threads for e in more_threads.asked] == [threads + 1]


def _key(rows: int, among: str = "torch/onednn") -> str:
    """A cache entry's key: a 32 -> 48 float32 layer at this thread count, chosen among `among`."""
    return f"48x32 float32 rows={rows} threads={torch.get_num_threads()} of {among}"


def _cache_file(fmt: object, machine: str, choices: object) -> str:
    return json.dumps({"format": fmt, "machine": machine, "choices": choices})


@needs_onednn
@pytest.mark.parametrize(
    "content",
    [
        lambda key: "{not json",
        lambda key: "[1, 2]",
        lambda key: _cache_file(99, AVX512.key, {key: "torch"}),  # another format
        lambda key: _cache_file(FORMAT, AVX2.key, {key: "torch"}),  # another machine's, under this one's name
        lambda key: _cache_file(FORMAT, AVX512.key, [key, "torch"]),
    ],
)
def test_a_corrupt_or_foreign_cache_file_is_ignored_and_replaced(monkeypatch, tmp_path, content):
    key = _key(64)
    path = tmp_path / AVX512.file_name
    path.write_text(content(key))  # each would say "torch" if it were believed
    timer = on_machine(monkeypatch, AVX512, tmp_path, compiler=False).timer
    run_layer(torch.nn.Linear(32, 48), 64)
    assert len(timer.asked) == 1
    assert json.loads(path.read_text())["choices"] == {key: "onednn"}


@needs_onednn
def test_unknown_kernels_in_the_cache_are_ignored_entry_by_entry(monkeypatch, tmp_path):
    entries = {_key(64): "turbo", _key(1): "onednn"}
    (tmp_path / AVX512.file_name).write_text(_cache_file(FORMAT, AVX512.key, entries))
    timer = on_machine(monkeypatch, AVX512, tmp_path, compiler=False).timer
    spy = Spy(monkeypatch)
    run_layer(torch.nn.Linear(32, 48), 1)  # cached: oneDNN, although the fake timer would say plain
    run_layer(torch.nn.Linear(32, 48), 64)
    assert [e.rows for e in timer.asked] == [64]
    assert spy.kernels == ["onednn", "onednn"]


@needs_onednn
@needs_c
def test_a_choice_made_among_fewer_kernels_is_measured_again_when_another_appears(monkeypatch, tmp_path):
    """A C compiler installed since: the C kernel is a candidate now, and the old entry does not hide it."""
    on_machine(monkeypatch, AVX512, tmp_path, compiler=False)
    run_layer(torch.nn.Linear(32, 48), 1)
    monkeypatch.undo()  # the compiler arrives
    timer = on_machine(monkeypatch, AVX512, tmp_path).timer
    spy = Spy(monkeypatch)
    run_layer(torch.nn.Linear(32, 48), 1)
    assert [e.rows for e in timer.asked] == [1] and spy.kernels == ["c"]
    choices = json.loads((tmp_path / AVX512.file_name).read_text())["choices"]
    assert choices == {_key(1): "torch", _key(1, "torch/onednn/c"): "c"}


def test_an_unwritable_cache_directory_costs_only_a_measurement(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    choices = KernelChoices(AVX512, blocker / "cache", timer=FakeTimer())
    entry = Entry(48, 32, torch.float32, 64, 1)
    assert choices.choose(entry, {"torch": lambda: None, "onednn": lambda: None}) == "onednn"


def test_torchs_kernel_is_kept_unless_another_is_clearly_faster(tmp_path):
    entry = Entry(48, 32, torch.float32, 64, 1)
    runs = {"torch": lambda: None, "onednn": lambda: None}
    close = KernelChoices(AVX512, tmp_path, timer=lambda e, c: {"torch": 1.0, "onednn": 0.97})
    assert close.choose(entry, runs) == "torch"
    clear = KernelChoices(AVX2, tmp_path, timer=lambda e, c: {"torch": 1.0, "onednn": 0.9})
    assert clear.choose(entry, runs) == "onednn"


@needs_onednn
@needs_c
def test_a_path_allowing_fewer_kernels_measures_among_them_and_one_kernel_is_taken_unmeasured(
    monkeypatch, tmp_path
):
    """TXL_LINEAR_KERNEL or TXL_CPU_KERNELS=0 allow fewer kernels (the decode path's `linear`): the choice is
    among them, kept apart from the choice among all; one kernel runs wherever it can, without measuring."""
    asked: list[tuple[str, ...]] = []

    def timer(entry, candidates):
        asked.append(tuple(candidates))
        return {name: {"torch": 3.0, "onednn": 2.0, "c": 1.0}[name] for name in candidates}

    on_machine(monkeypatch, AVX512, tmp_path, timer)
    spy = Spy(monkeypatch)
    layer = torch.nn.Linear(32, 48)
    run_layer(layer, 1)
    run_layer(layer, 1, kernels=("torch", "onednn"))
    run_layer(layer, 1, kernels=("c",))
    run_layer(layer, 1, kernels=("torch",))
    assert asked == [("torch", "onednn", "c"), ("torch", "onednn")]
    assert spy.kernels == ["c", "onednn", "c", "torch"]


def test_this_machine_names_its_vector_units_as_torch_dispatches_them():
    machine = this_machine(bfloat16=False)
    assert machine.vector.split()[0] == torch.backends.cpu.get_cpu_capability()
    assert machine.torch == torch.__version__
    assert this_machine(bfloat16=True).file_name != machine.file_name


def test_measuring_interleaves_rounds_after_a_warm_up_run_each():
    calls: list[str] = []
    runs = {"torch": lambda: calls.append("torch"), "c": lambda: calls.append("c")}
    seconds = measure(Entry(48, 32, torch.float32, 1, 1), runs)
    assert calls == ["torch", "c"] * (1 + ROUNDS)
    assert set(seconds) == {"torch", "c"} and all(0 <= s < 0.01 for s in seconds.values())
    assert last_level_cache_bytes() >= 2**20


@pytest.mark.parametrize(
    ("shape", "rows", "count"),
    [
        ((256, 256), 1, 64),  # 256 KiB each: 64 copies, 16 MiB (less than twice the cache)
        ((1024, 1024), 1, 16),  # 4 MiB each: twice the cache of 32 MiB
        ((4096, 4096), 1, 1),  # 64 MiB: larger than the cache by itself
        ((1024, 1024), 256, 1),  # 537 MFLOP a call: the products dominate, one copy
        ((256, 256), 16, 23),  # 2.1 MFLOP a call: 50 MFLOP a pass
    ],
)
def test_kernels_are_timed_over_enough_copies_to_come_from_memory(monkeypatch, shape, rows, count):
    """A pass over copies of the layer outgrows the last-level cache, as a decode step's layers do, unless
    the products dominate; the layer itself is the first copy (its kernels' weights are made as it runs)."""
    monkeypatch.setattr(linear, "last_level_cache_bytes", lambda: 32 * 2**20)
    layer = linear._LayerKernels((), torch.zeros(shape), torch.zeros(shape[0]))
    copies = layer._copies(rows)
    assert len(copies) == count and copies[0] is layer
    assert all(c.weight.data_ptr() != layer.weight.data_ptr() for c in copies[1:])


def test_processes_measuring_one_entry_at_once_agree_on_its_kernel(tmp_path):
    """Two servers started together on a new machine: the second waits for the first's measurement and takes
    its choice, even where its own timing would have chosen otherwise (so both compute bit for bit alike). Two
    KernelChoices over one directory stand for the two processes: their locks are separate open files, which
    flock keeps apart as it keeps processes apart."""
    import threading
    import time

    entry = Entry(48, 32, torch.float32, 1, 1)
    candidates = {"torch": lambda: None, "c": lambda: None}
    asked: list[str] = []
    first_measuring = threading.Event()

    def timer_preferring(kernel: str):
        def timer(entry, candidates):
            asked.append(kernel)
            first_measuring.set()
            time.sleep(0.3)  # the other process asks meanwhile
            return {name: (1.0 if name == kernel else 2.0) for name in candidates}

        return timer

    first = KernelChoices(AVX2, tmp_path, timer=timer_preferring("c"))
    second = KernelChoices(AVX2, tmp_path, timer=timer_preferring("torch"))
    chosen: dict[str, str] = {}
    thread = threading.Thread(target=lambda: chosen.update(first=first.choose(entry, candidates)))
    thread.start()
    first_measuring.wait(5)
    chosen["second"] = second.choose(entry, candidates)
    thread.join()
    assert chosen == {"first": "c", "second": "c"}
    assert asked == ["c"]  # measured once, on the machine
