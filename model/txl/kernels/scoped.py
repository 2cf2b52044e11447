"""A setting for a block of code: a context variable set when the block starts and put back when it ends, seen
only by the thread or task that runs the block (how tests and benchmarks pick a kernel)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TypeVar

Value = TypeVar("Value")


@contextlib.contextmanager
def scoped(variable: ContextVar[Value], value: Value) -> Iterator[None]:
    """Inside this block `variable` is `value`; after it, what it was before."""
    token = variable.set(value)
    try:
        yield
    finally:
        variable.reset(token)
