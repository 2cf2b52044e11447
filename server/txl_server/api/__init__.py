"""The HTTP layer: FastAPI routes that validate, call the session service and shape JSON or SSE."""
