"""Comparing model states by what they hold, not by object: a holder of a state keeps its own hold
(`ModelState.retain`), a new object over the same rows."""

from __future__ import annotations

from txl_server.engine.state import ModelState


def same_state(a: ModelState, b: ModelState) -> bool:
    """The same rows of the same block tables, the same last hidden state and tail."""
    return a.memory.rows == b.memory.rows and a.last_hidden is b.last_hidden and a.tail == b.tail
