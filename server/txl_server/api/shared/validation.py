"""Pydantic's (and FastAPI's) validation errors as one sentence naming the field, for the error body."""

from __future__ import annotations

import re
from typing import Any

_LOCATIONS = ("body", "query", "path", "header")
# Pydantic names the member of a union it tried in the location (`prompt.list[int].0`): not a field.
_TYPE_TAG = re.compile(r"^([a-z]+(-[a-z]+)*(\[.*\])?)$")
_TYPE_NAMES = {"str", "int", "float", "bool", "none", "dict", "list", "constrained-str", "constrained-int"}


def validation_status(errors: list[Any]) -> int:
    """422 for a request that does not match the schema; but a lone surrogate in a string, which the schema
    cannot tell from text, is 400 as everywhere else (`limits.check_unicode`)."""
    return 400 if errors and errors[0].get("type") == "string_unicode" else 422


def validation_message(errors: list[Any], content_type: str | None) -> tuple[str, str | None]:
    """One sentence naming the field, and the field, for the first of pydantic's (or FastAPI's) errors."""
    if not errors:
        return "the request is invalid", None
    first = errors[0]
    kind = first.get("type", "")
    loc = list(first.get("loc", ()))
    if kind == "json_invalid":  # FastAPI: loc ("body", offset), ctx {"error": json's message}
        detail = (first.get("ctx") or {}).get("error") or first.get("msg", "")
        where = f" at character {loc[1]}" if len(loc) > 1 and isinstance(loc[1], int) else ""
        return f"the body is not valid JSON ({detail}{where})", "body"
    path = [str(p) for p in loc if p not in _LOCATIONS and not (isinstance(p, str) and _is_type_tag(p))]
    field = ".".join(path)
    if not field and loc[:1] == ["body"] and kind == "missing":
        return "this request needs a JSON body (Content-Type: application/json)", "body"
    if not field and loc[:1] == ["body"]:
        media = (content_type or "").split(";")[0].strip().lower()
        if media != "application/json":
            sent = f"Content-Type {media}" if media else "no Content-Type"
            return f"send the body as JSON with Content-Type: application/json (this request had {sent})", (
                "Content-Type"
            )
        return "the body must be a JSON object", "body"
    message = str(first.get("msg", "invalid value"))
    if not field:
        return f"the request is invalid: {message}", None
    if kind == "missing":
        return f"{field} is required", field
    if kind == "extra_forbidden":
        return f"{field} is not a known field", field
    if kind == "string_unicode":  # as `limits.check_unicode` says it
        return f"{field} is not valid Unicode (a lone surrogate)", field
    if kind == "string_pattern_mismatch":
        return f"{field} should match the pattern {(first.get('ctx') or {}).get('pattern')}", field
    if message.startswith("Input should "):
        return f"{field} should {message.removeprefix('Input should ')}", field
    return f"{field}: {message.removeprefix('Value error, ')}", field


def _is_type_tag(part: str) -> bool:
    return part in _TYPE_NAMES or ("[" in part and _TYPE_TAG.match(part) is not None)
