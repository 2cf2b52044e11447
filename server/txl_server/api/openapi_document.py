"""The OpenAPI document the server serves (`/openapi.json`; docs/openapi.json with the default settings): FastAPI's,
with what the models alone cannot say.

- The operator's limits: a field bounded by a setting carries its name (`shared/limits.py` `operator_limit`); the
  document shows the setting's value (`maximum: 4096` for `max_tokens` with the default settings), and a default
  above it lowered to it, as the server lowers it.
- The OpenAI routes answer a body that does not match the schema with 400 (as OpenAI does), never 422: FastAPI's
  own 422 is not listed there.
- Authentication as the server has it: with API keys every `/v1` route requires one (the `ApiKey` scheme);
  without, none does (each route's `security` holds the empty requirement first: a key may be sent, and is
  ignored), so that a client generated from it, or a fuzzer checking that authentication is enforced, sees the
  server that serves it.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI

from ..settings import Settings
from .shared.limits import OPERATOR_LIMIT
from .shared.openai_errors import is_openai_path

# FastAPI's schemas of its 422, listed only where a route answers it (the OpenAI routes do not).
_VALIDATION_SCHEMAS = ("HTTPValidationError", "ValidationError")


def serve_document(app: FastAPI, settings: Settings) -> None:
    """Makes `app.openapi()` (and `/openapi.json`) the document described above, for `settings`."""
    generate = app.openapi
    finished: list[bool] = []

    def document() -> dict[str, Any]:
        spec = generate()  # FastAPI's, made once and kept
        if not finished:
            _fill_limits(spec, settings)
            _drop_openai_validation_errors(spec)
            if not settings.has_api_keys:
                _make_keys_optional(spec)
            finished.append(True)
        return spec

    app.openapi = document  # type: ignore[method-assign]


def _fill_limits(node: Any, settings: Settings) -> None:
    if isinstance(node, list):
        for item in node:
            _fill_limits(item, settings)
        return
    if not isinstance(node, dict):
        return
    for keyword, name in node.pop(OPERATOR_LIMIT, {}).items():
        node[keyword] = getattr(settings, name)
    for value in node.values():
        _fill_limits(value, settings)
    default = node.get("default")
    most = _maximum(node)
    if (
        most is not None
        and isinstance(default, int | float)
        and not isinstance(default, bool)
        and default > most
    ):
        node["default"] = most


def _maximum(schema: dict[str, Any]) -> float | None:
    """A number schema's maximum, or the largest of its alternatives' (`anyOf`, with null)."""
    if "maximum" in schema:
        return float(schema["maximum"])
    maxima = [member["maximum"] for member in schema.get("anyOf", []) if "maximum" in member]
    return float(max(maxima)) if maxima else None


def _drop_openai_validation_errors(spec: dict[str, Any]) -> None:
    for path, operations in spec.get("paths", {}).items():
        if is_openai_path(path):
            for operation in operations.values():
                operation.get("responses", {}).pop("422", None)
    schemas = spec.get("components", {}).get("schemas", {})
    if '"#/components/schemas/HTTPValidationError"' not in json.dumps(spec.get("paths", {})):
        for name in _VALIDATION_SCHEMAS:
            schemas.pop(name, None)


# The security scheme's description on a server without keys.
NO_KEYS = (
    "Not needed by this server, which has no API keys (TXL_API_KEYS): a key sent is ignored. A server started with "
    "keys requires one on every /v1 route; each key is a tenant"
)


def _make_keys_optional(spec: dict[str, Any]) -> None:
    for operations in spec.get("paths", {}).values():
        for operation in operations.values():
            security = operation.get("security")
            if security and {} not in security:
                operation["security"] = [{}, *security]
    for scheme in spec.get("components", {}).get("securitySchemes", {}).values():
        scheme["description"] = NO_KEYS
