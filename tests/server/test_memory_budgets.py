"""Session-memory budgets (server/txl_server/memory_budgets.py): on a CPU sized to the machine and the model, on a
GPU fixed; what is set wins; the server reports them (`GET /v1/system`) and sizes its pool and tiers by them."""

from __future__ import annotations

from txl_server.memory_budgets import (
    CPU_PREFIX_POSITIONS,
    CPU_SESSIONS,
    CPU_SHARE,
    GPU_DEVICE_BYTES,
    GPU_HOST_BYTES,
    choose_budgets,
    machine_memory,
    memory_budgets,
    session_peak_bytes,
)
from txl_server.settings import Settings

from tests.helpers.runtimes import running

GiB = 2**30
MiB = 2**20


def test_a_cpu_takes_a_sixteenth_of_the_machine_and_no_host_tier():
    budgets = choose_budgets(
        Settings(), on_cpu=True, session_bytes=10 * MiB, position_bytes=16 * 1024, machine_bytes=16 * GiB
    )
    assert budgets.device == 16 * GiB // CPU_SHARE == GiB
    assert budgets.prefix_cache == CPU_PREFIX_POSITIONS * 16 * 1024 == 128 * MiB  # below a quarter of 1 GiB
    assert budgets.host == 0
    assert "1/16 of this machine's 16.0 GiB" in budgets.how


def test_a_large_model_on_a_small_machine_still_gets_room_for_a_few_sessions():
    budgets = choose_budgets(
        Settings(), on_cpu=True, session_bytes=300 * MiB, position_bytes=150 * 1024, machine_bytes=8 * GiB
    )
    assert budgets.device == CPU_SESSIONS * 300 * MiB > 8 * GiB // CPU_SHARE
    assert budgets.prefix_cache == budgets.device // 4  # below 8,192 positions of 150 KiB


def test_a_gpu_keeps_the_fixed_defaults_and_settings_win_everywhere():
    assert Settings().device_memory_bytes is None and Settings().host_memory_bytes is None  # chosen by device
    gpu = choose_budgets(Settings(), on_cpu=False, session_bytes=MiB, position_bytes=1024, machine_bytes=0)
    assert (gpu.device, gpu.prefix_cache, gpu.host) == (
        GPU_DEVICE_BYTES,
        GPU_DEVICE_BYTES // 4,
        GPU_HOST_BYTES,
    )
    chosen = Settings(device_memory_bytes=5 * MiB, prefix_cache_bytes=0, host_memory_bytes=7 * MiB)
    for on_cpu in (True, False):
        budgets = choose_budgets(
            chosen, on_cpu=on_cpu, session_bytes=MiB, position_bytes=1024, machine_bytes=GiB
        )
        assert (budgets.device, budgets.prefix_cache, budgets.host) == (5 * MiB, 0, 7 * MiB)
        assert budgets.how.count("TXL_") == 3
    only_device = Settings(device_memory_bytes=400 * MiB)
    cpu = choose_budgets(
        only_device, on_cpu=True, session_bytes=MiB, position_bytes=64 * 1024, machine_bytes=GiB
    )
    assert (
        cpu.prefix_cache == 100 * MiB and cpu.host == 0
    )  # a quarter of the device's: 8,192 x 64 KiB is more


def test_a_container_limit_below_the_machine_is_what_counts(tmp_path):
    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    v2.write_text("max\n")
    v1.write_text(f"{3 * GiB}\n")
    assert machine_memory((v2, v1)) == min(3 * GiB, machine_memory(()))
    assert machine_memory((v2, tmp_path / "absent")) == machine_memory(()) > 0


async def test_the_server_sizes_its_pool_and_tiers_by_them_and_reports_them(make_settings):
    async with running(make_settings()) as runtime:
        model = runtime.worker.model
        expected = memory_budgets(runtime.settings, model)
        assert runtime.budgets == expected and expected.host == 0
        assert expected.device == max(machine_memory() // CPU_SHARE, CPU_SESSIONS * session_peak_bytes(
            runtime.settings, model
        ))  # fmt: skip
        cache, prefix = runtime.service.cache, runtime.service.prefix_cache
        assert (cache.budget("device"), cache.budget("host"), prefix.budget) == (
            expected.device, 0, expected.prefix_cache
        )  # fmt: skip
        pool = runtime.worker.pool
        assert pool.growable and pool.n_blocks * pool.block_nbytes >= expected.device + expected.prefix_cache
        report = runtime.device_report()
        assert report is not None and report.budgets == expected
