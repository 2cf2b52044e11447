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


async def test_a_step_computes_only_after_the_last_steps_events_went_out(make_settings):
    """Every token event of a generation is put in the outbox, stays there through the rest of its step's
    bookkeeping, and goes out in the flush right before the next step computes: the loop handles it meanwhile."""
    async with running(make_settings()) as rt:
        worker = rt.worker
        log: list[tuple[str, int]] = []
        outbox, run = worker._outbox, worker.runner.run
        put, flush = outbox.put, outbox.flush

        def logged_put(job, event):
            log.append(("put", isinstance(event, TokenEvent)))
            put(job, event)

        def logged_flush():
            log.append(("flush", len(outbox._held)))
            flush()

        def logged_run(*args, **kwargs):
            log.append(("run", len(outbox._held)))
            return run(*args, **kwargs)

        outbox.put, outbox.flush, worker.runner.run = logged_put, logged_flush, logged_run
        meta = await rt.service.create(OWNER, text="It was")
        log.clear()
        tokens, outcome = await generate(
            rt.service, meta.id, max_tokens=10, sampling=SamplingParams(temperature=0)
        )
        assert len(tokens) == 10 and outcome is not None
        runs = [i for i, entry in enumerate(log) if entry[0] == "run"]
        assert len(runs) >= 10
        assert all(log[i][1] == 0 for i in runs)  # nothing held when a step computes
        token_puts = [i for i, entry in enumerate(log) if entry == ("put", True)]
        assert len(token_puts) >= 9
        for i in token_puts:
            after = log[i + 1 :]
            # held past the rest of its own step: the next flush is the one right before the next step computes
            # (or, for the last token, the one before the worker waits)
            first_flush = next(k for k, entry in enumerate(after) if entry[0] == "flush")
            assert all(entry[0] == "put" for entry in after[:first_flush])
            follows = after[first_flush + 1 : first_flush + 2]
            assert follows in ([("run", 0)], []) or i == token_puts[-1]
