"""`POST /v1/chat/completions`."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from ..completions.sources import CompletionSources
from ..shared.chat_template import ChatTemplate
from ..shared.event_stream import json_or_stream_post
from ..shared.json_body import JsonBodyRoute
from ..shared.openai_errors import OPENAI_ERROR_RESPONSES
from . import serving
from .protocol import ChatCompletion, ChatCompletionRequest

router = APIRouter(tags=["openai"], responses=OPENAI_ERROR_RESPONSES, route_class=JsonBodyRoute)

Template = Annotated[ChatTemplate, Depends(serving.chat_template)]


@json_or_stream_post(router, "/v1/chat/completions", ChatCompletion, "JSON, or SSE chunks with stream")
async def create_chat_completion(
    body: ChatCompletionRequest, template: Template, sources: CompletionSources
) -> Any:
    """A reply to `messages`, written out with the server's chat template and continued by the model."""
    return await serving.create_chat_completion(body, template, sources)
