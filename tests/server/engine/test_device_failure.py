"""A CUDA error marks the device failed only when the device no longer works afterwards (`engine.device_failure`),
as start-up decides: a cuBLAS status or a refused launch configuration fails the step's requests (a batch's rows
then one by one) and the server serves on; an illegal address leaves a device that runs nothing, and the server
reports not alive. The device is a CPU here: the probe is stubbed where a test needs a device that died."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
from txl_server.engine import device_failure, selfcheck

from tests.helpers.runtimes import OWNER, generate

CUBLAS = (
    "CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasGemmEx( handle, opa, opb, m, n, k, ...)`"
)


async def test_a_non_sticky_cuda_error_in_a_step_does_not_mark_the_device_failed(runtime, monkeypatch):
    """Review round 3, finding 4 (its reproducer, `test_review_round3.py`): on main ab36bf5 the text alone marked
    the device failed, so liveness failed and the watchdog exited the process, dropping its sessions."""
    meta = await runtime.service.create(OWNER, text="hello")
    assert await runtime.ready()
    calls = []
    real = runtime.worker.runner.run

    def once(decode, chunks, **kwargs):
        if not calls:
            calls.append(1)
            raise RuntimeError(CUBLAS)
        return real(decode, chunks, **kwargs)

    monkeypatch.setattr(runtime.worker.runner, "run", once)
    monkeypatch.setattr(selfcheck, "device_works", lambda device: True)  # the device runs on after it
    with pytest.raises(RuntimeError):
        await generate(runtime.service, meta.id, max_tokens=3)
    # The device still works: the server should stay alive (the failed request got its error).
    assert runtime.worker.device_error is None, f"marked failed: {runtime.worker.device_error}"
    assert runtime.liveness() is None
    tokens, _ = await generate(runtime.service, meta.id, max_tokens=3)  # and serves on
    assert len(tokens) == 3


async def test_a_batch_hit_by_a_recoverable_cuda_error_runs_its_rows_one_by_one(runtime, monkeypatch):
    """Two sessions decoding together: the batched step raises a cuBLAS status; each row then runs alone and
    both requests end with the tokens they get without the error (a row gives the same results alone)."""
    texts = ("hello", "a tale of")
    alone = [await runtime.service.create(OWNER, text=text) for text in texts]
    expected = [[e.id for e in (await generate(runtime.service, s.id, max_tokens=8))[0]] for s in alone]
    sessions = [await runtime.service.create(OWNER, text=text) for text in texts]  # the same states again
    batched = []
    real = runtime.worker.runner.run

    def failing_once_batched(decode, chunks, **kwargs):
        if len(decode) >= 2 and not batched:
            batched.append(len(decode))
            raise RuntimeError(CUBLAS)
        if not batched:
            time.sleep(0.05)  # the first session's steps wait for the second to join them
        return real(decode, chunks, **kwargs)

    monkeypatch.setattr(runtime.worker.runner, "run", failing_once_batched)
    results = await asyncio.gather(*(generate(runtime.service, s.id, max_tokens=8) for s in sessions))
    assert batched == [2]  # the two did decode together, once
    assert [[e.id for e in tokens] for tokens, _ in results] == expected
    assert runtime.worker.device_error is None and runtime.liveness() is None


async def test_a_cuda_error_after_which_the_device_runs_nothing_marks_it_failed(runtime, monkeypatch):
    meta = await runtime.service.create(OWNER, text="hello")

    def broken(decode, chunks, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(runtime.worker.runner, "run", broken)
    monkeypatch.setattr(device_failure, "device_works", lambda device: False)
    with pytest.raises(RuntimeError):
        await generate(runtime.service, meta.id, max_tokens=3)
    assert runtime.worker.device_error.startswith("CUDA error: an illegal memory access")
    assert runtime.liveness() is not None and not await runtime.ready()


def test_an_error_of_the_request_is_never_the_devices():
    assert not device_failure.device_failed(ValueError("top_k must be positive"), torch.device("cpu"))
    assert not device_failure.device_failed(RuntimeError(CUBLAS), torch.device("cpu"))  # a CPU that works
