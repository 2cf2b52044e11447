"""What no route serves: the playground's files, 405 for a route called with another method, else 404."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Mount
from starlette.types import Receive, Scope, Send

_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


class Fallback:
    """What no route serves: the playground's files for GET and HEAD outside /v1 and the routes; else 405 (with Allow) for
    a route called with another method, and 404 `not_found` for everything else. (A plain StaticFiles mount
    at `/` would answer every POST to an unknown route with its own 405.)"""

    def __init__(self, app: FastAPI, directory: Path) -> None:
        self.app = app
        self.files = StaticFiles(directory=directory, html=True) if directory.is_dir() else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        api = scope["path"] == "/v1" or scope["path"].startswith("/v1/")
        allowed = [
            method
            for method in _METHODS
            if any(
                not isinstance(route, Mount) and route.matches({**scope, "method": method})[0] is Match.FULL
                for route in self.app.router.routes
            )
        ]
        # A route outside /v1 (`/tokenize`) called with GET is a 405 too, not a file.
        if scope["method"] in ("GET", "HEAD") and not api and not allowed and self.files is not None:
            await self.files(scope, receive, send)
            return
        if allowed:
            raise StarletteHTTPException(
                405,
                f"{scope['method']} is not allowed on {scope['path']}; use {' or '.join(allowed)}",
                headers={"Allow": ", ".join(allowed)},
            )
        raise StarletteHTTPException(404)
