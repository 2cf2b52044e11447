"""FastAPI's own answer to a JSON body it cannot read ("There was an error parsing the body", 400) replaced by
the documented ones, naming the field where it can:

- a body that is not UTF-8: 400 with the first bad byte's offset and, where it can be told, the field that holds
  it (`the body is not valid UTF-8: byte 13 (0xff), in text`);
- a body nested too deeply to read (a 100,000-deep array): 422, `param` `body`, as any body that is not JSON.

Routers that let FastAPI read their JSON bodies use `route_class=JsonBodyRoute`; a route that reads its body
itself (scoring) calls `utf8_error`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from starlette.exceptions import HTTPException

from ...errors import InvalidBody, InvalidRequest
from .disconnect import WatchedRoute

# What a byte that cannot be decoded becomes with errors="surrogateescape".
_UNDECODABLE = re.compile("[\udc80-\udcff]")


def utf8_error(body: bytes, *, json_body: bool = True) -> InvalidRequest | None:
    """The error for a body that is not UTF-8 (None if it is): the offset of its first bad byte and, for JSON,
    the field (dotted, as in validation errors) whose string or key holds it."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        field = _field_holding_bad_bytes(body) if json_body else None
        where = f", in {field}" if field else ""
        return InvalidRequest(
            f"the body is not valid UTF-8: byte {exc.start} (0x{body[exc.start]:02x}){where}",
            param=field or "body",
        )
    return None


def _field_holding_bad_bytes(body: bytes) -> str | None:
    try:
        value = json.loads(body.decode("utf-8", "surrogateescape"))
    except (ValueError, RecursionError):  # not JSON either: the offset is all there is to say
        return None
    return _find(value, [])


def _find(value: Any, path: list[str]) -> str | None:
    """The dotted path of the first string (or key) holding an undecodable byte, in document order."""
    if isinstance(value, str):
        return (".".join(path) or None) if _UNDECODABLE.search(value) else None
    children: list[tuple[str, Any]] = []
    if isinstance(value, dict):
        for key, child in value.items():
            if _UNDECODABLE.search(key):  # a key: the object holding it is the field
                return ".".join(path) or None
            children.append((key, child))
    elif isinstance(value, list):
        children = [(str(i), child) for i, child in enumerate(value)]
    for name, child in children:
        if (found := _find(child, [*path, name])) is not None:
            return found
    return None


class JsonBodyRoute(WatchedRoute):
    """A route whose JSON body, when it is not UTF-8, is refused with `utf8_error`'s message (400), and when it
    nests too deeply to read, as a body that is not JSON (422)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def checked(request: Request) -> Response:
            try:
                return await handler(request)
            except HTTPException as exc:
                # FastAPI's answer to a body it could not decode; the cause says why.
                if isinstance(exc.__cause__, UnicodeDecodeError):
                    error = utf8_error(await request.body())
                    if error is not None:
                        raise error from exc
                if isinstance(exc.__cause__, RecursionError):
                    raise InvalidBody(
                        "the body is not valid JSON (it nests too deeply to read)", param="body"
                    ) from exc
                raise

        return checked
