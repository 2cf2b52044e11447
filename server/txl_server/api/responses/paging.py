"""A page of items, as OpenAI's list routes answer them (a response's input items, a conversation's items):
`order`, then those after the item `after`, at most `limit`; `first_id`, `last_id` and `has_more`."""

from __future__ import annotations

from typing import Any, Literal, Protocol, TypeVar

from ...errors import InvalidRequest


class Identified(Protocol):
    @property
    def id(self) -> str: ...


T = TypeVar("T", bound=Identified)


def page_of(
    items: list[T], after: str | None, limit: int, order: Literal["asc", "desc"], where: str
) -> dict[str, Any]:
    """The fields of a list object (`data`, `first_id`, `last_id`, `has_more`); `where` names what holds the
    items, for the error when `after` names none of them."""
    items = list(reversed(items)) if order == "desc" else list(items)
    if after is not None:
        ids = [item.id for item in items]
        if after not in ids:
            raise InvalidRequest(f"no item {after[:100]!r} in {where}", param="after")
        items = items[ids.index(after) + 1 :]
    shown = items[:limit]
    return {
        "data": shown,
        "first_id": shown[0].id if shown else None,
        "last_id": shown[-1].id if shown else None,
        "has_more": len(items) > limit,
    }
