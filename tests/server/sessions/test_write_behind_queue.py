"""The write-behind queue on its own (sessions/write_behind.py): a session's newest version waits a moment, then is
written once; an older one still waiting is left unwritten, and every state it held is let go; a flush writes what
waits at once; a failed write is logged, the others go on."""

from __future__ import annotations

import asyncio

from txl_server.sessions.write_behind import Pending, WriteBehind

from tests.helpers.session_fakes import pool, state, summary


def _pending(session_id: str, version: int, block_pool) -> Pending:
    return Pending(session_id, summary(version), state(block_pool, 8), 60)


async def test_a_burst_of_versions_of_a_session_writes_only_the_newest_after_the_delay():
    written: list[tuple[str, int]] = []

    async def settle(p: Pending) -> None:
        written.append((p.session_id, p.summary.version))

    behind = WriteBehind(settle, delay=0.05)
    block_pool = pool()
    behind.add(_pending("a", 2, block_pool))
    behind.add(_pending("b", 2, block_pool))
    await asyncio.sleep(0.01)
    behind.add(_pending("a", 3, block_pool))
    behind.add(_pending("a", 4, block_pool))
    assert written == []  # nothing before the delay: the answer's own work comes first
    await asyncio.sleep(0.15)
    assert sorted(written) == [("a", 4), ("b", 2)]
    assert len(behind) == 0 and block_pool.used_blocks == 0  # every state let go


async def test_a_flush_writes_what_waits_at_once_and_a_failure_stays_alone(caplog):
    written: list[int] = []

    async def settle(p: Pending) -> None:
        if p.session_id == "broken":
            raise OSError("disk full")
        written.append(p.summary.version)

    behind = WriteBehind(settle, delay=60)
    block_pool = pool()
    behind.add(_pending("broken", 2, block_pool))
    behind.add(_pending("fine", 7, block_pool))
    await behind.flush(5)
    assert written == [7] and len(behind) == 0
    assert "version 2 of session broken were not written (disk full)" in caplog.text
    assert block_pool.used_blocks == 0


async def test_a_deleted_sessions_version_waiting_is_never_written_and_lets_go_at_once():
    written: list[str] = []
    started, finish = asyncio.Event(), asyncio.Event()

    async def settle(p: Pending) -> None:
        if p.session_id == "slow":
            started.set()
            await finish.wait()
        written.append(p.session_id)

    behind = WriteBehind(settle, delay=0.01)
    block_pool = pool()
    behind.add(_pending("gone", 2, block_pool))
    await behind.forget("gone")
    assert block_pool.used_blocks == 0 and len(behind) == 0
    behind.add(_pending("slow", 2, block_pool))
    await started.wait()  # its write under way: forgetting it waits for its end
    forgetting = asyncio.ensure_future(behind.forget("slow"))
    await asyncio.sleep(0.05)
    assert not forgetting.done()
    finish.set()
    await forgetting
    assert written == ["slow"] and block_pool.used_blocks == 0
