"""JSON as every answer of this server writes it: compact (no spaces after `,` and `:`), UTF-8, and ending with a
newline, so that `curl`'s output ends its line before the shell's prompt and a log of answers holds one a line.
The routes' answers (`JSONResponse`, the app's default) and the bodies the middlewares write themselves
(`json_bytes`) are written alike, in both error shapes."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse as StarletteJSONResponse


def json_bytes(content: Any) -> bytes:
    """`content` as this server writes JSON."""
    text = json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":"))
    return text.encode("utf-8") + b"\n"


class JSONResponse(StarletteJSONResponse):
    def render(self, content: Any) -> bytes:
        return json_bytes(content)
