"""The worker's events are held back until its next step starts computing (or it waits), then delivered in one
wake-up of the loop: in order, none lost, none late past the worker's next wait, and the loop's share of a
token's handling done while the worker is inside an operation, off the GIL (engine.jobs.Outbox)."""

from __future__ import annotations

import asyncio
import threading

from txl.sampling import SamplingParams
from txl_server.engine.jobs import DoneEvent, Job, Outbox, TokenEvent

from tests.helpers.runtimes import OWNER, generate, running


def _emit_on_a_thread(body) -> None:
    thread = threading.Thread(target=body)
    thread.start()
    thread.join()


async def test_held_events_reach_their_jobs_in_order_only_once_flushed():
    first, second = Job(), Job()
    outbox = Outbox()
    flushed = threading.Event()

    def worker() -> None:
        with outbox.holding():
            for i in range(3):
                first.emit(TokenEvent(i, "a", -1.0))
                second.emit(TokenEvent(10 + i, "b", -1.0))
            assert Outbox.current() is outbox
        assert Outbox.current() is None  # leaving flushes, and emits go straight out again
        flushed.set()
        first.emit(DoneEvent("first"))

    _emit_on_a_thread(lambda: Outbox().put(first, TokenEvent(-1, "x", 0.0)))
    assert first._events.empty()  # put without a flush: nothing delivered
    _emit_on_a_thread(worker)
    assert flushed.is_set()
    await asyncio.sleep(0)  # the one wake-up
    ids = [first._events.get_nowait().id for _ in range(3)]
    assert ids == [0, 1, 2]
    assert [second._events.get_nowait().id for _ in range(3)] == [10, 11, 12]
    assert (await first._events.get()).result == "first"
    assert first._events.empty() and second._events.empty()


async def test_the_last_steps_events_go_out_when_the_next_steps_layers_start(make_settings, monkeypatch):
    """Every token event of a generation is put in the outbox, stays there through the rest of its step and the
    next step's preparation (its sampling and planning), and goes out right before that step's layers run, in
    native code off the GIL: the loop handles it meanwhile. (Handed out before the preparation, the loop's share ran
    between the preparation's many small operations, each of which gave it the GIL, and held up every one.)"""
    import txl.kernels.cpu.decode_layer as decode_layer

    async with running(make_settings()) as rt:
        worker = rt.worker
        log: list[tuple[str, int]] = []
        outbox, run, sample = worker._outbox, worker.runner.run, worker.runner._sample
        put, flush = outbox.put, outbox.flush
        layers = decode_layer.DecodeLayerKernel.layers

        def logged_put(job, event):
            log.append(("put", isinstance(event, TokenEvent)))
            put(job, event)

        def logged_flush():
            log.append(("flush", len(outbox._held)))
            flush()

        def logged_run(*args, **kwargs):
            log.append(("run", len(outbox._held)))
            return run(*args, **kwargs)

        def logged_sample(*args, **kwargs):
            log.append(("sample", len(outbox._held)))
            return sample(*args, **kwargs)

        def logged_layers(self, *args, **kwargs):
            log.append(("layer", len(outbox._held)))
            return layers(self, *args, **kwargs)

        outbox.put, outbox.flush = logged_put, logged_flush
        assert worker.runner.before_layers == flush  # the worker's runner hands out its events so
        worker.runner.before_layers = logged_flush
        worker.runner.run, worker.runner._sample = logged_run, logged_sample
        monkeypatch.setattr(decode_layer.DecodeLayerKernel, "layers", logged_layers)
        meta = await rt.service.create(OWNER, text="It was")
        log.clear()
        tokens, outcome = await generate(
            rt.service, meta.id, max_tokens=10, sampling=SamplingParams(temperature=0)
        )
        assert len(tokens) == 10 and outcome is not None
        assert any(entry[0] == "layer" for entry in log), (
            "the native decode layer did not run: nothing checked"
        )
        steps = [i for i, entry in enumerate(log) if entry[0] == "run"]
        assert len(steps) >= 10
        for start, end in zip(steps, [*steps[1:], len(log)], strict=True):
            inside = [name for name, _ in log[start:end]]
            if "sample" not in inside or "layer" not in inside:
                continue  # a step that fed a prompt: no sampling, no native decode layer
            # prepared first, then the flush, then the layers: nothing held when they run
            assert inside.index("sample") < inside.index("flush") < inside.index("layer"), inside
            assert all(held == 0 for name, held in log[start:end] if name == "layer")
        token_puts = [i for i, entry in enumerate(log) if entry == ("put", True)]
        assert len(token_puts) >= 9
        for i in token_puts[:-1]:  # held through the next step's preparation, out before its layers
            after = [name for name, _ in log[i + 1 :]]
            assert after.index("flush") < after.index("layer")
            assert "sample" in after[: after.index("flush")]
