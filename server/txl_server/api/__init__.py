"""The HTTP layer: FastAPI routes that validate, call the session service and shape JSON or SSE.

One package per endpoint family (completions, chat, responses, sessions, memories, score, system), each with its
`protocol` (pydantic schemas), `serving` (the logic) and a thin `router`; `shared/` holds what the routes share
(dependencies, limits, error shapes, streams, idempotency, the chat template) and imports no endpoint package.
`app.py` builds the application with the ASGI layers in front of every route (`middleware`, `replica`,
`shutdown`) and the `fallback` for what no route serves.
"""
