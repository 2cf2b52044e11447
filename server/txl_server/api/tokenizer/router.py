"""`POST /tokenize`, `POST /detokenize` and `GET /tokenizer_info`: vLLM's tokenizer routes, at the server's root."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from ..shared.dependencies import AppSettings, ModelId, Service, Tenant
from ..shared.json_body import JsonBodyRoute
from ..shared.openai_errors import OPENAI_ERROR_RESPONSES
from . import serving
from .protocol import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse, TokenizerInfo

router = APIRouter(tags=["tokenizer"], responses=OPENAI_ERROR_RESPONSES, route_class=JsonBodyRoute)


@router.post("/tokenize", response_model=TokenizeResponse)
async def tokenize(
    body: TokenizeRequest, tenant: Tenant, service: Service, settings: AppSettings, model_id: ModelId
) -> TokenizeResponse:
    """A text's token ids, as the completions routes encode a prompt (no token is added)."""
    return serving.tokenize(body, service.tokenizer, settings, model_id)


@router.post("/detokenize", response_model=DetokenizeResponse)
async def detokenize(
    body: DetokenizeRequest, tenant: Tenant, service: Service, settings: AppSettings, model_id: ModelId
) -> DetokenizeResponse:
    """The text of token ids."""
    return serving.detokenize(body, service.tokenizer, settings, model_id)


@router.get("/tokenizer_info", response_model=TokenizerInfo)
async def tokenizer_info(tenant: Tenant, service: Service, settings: AppSettings) -> Any:
    """The tokenizer's HF configuration: its class, special tokens, longest input and chat template."""
    return serving.tokenizer_info(service.tokenizer, service.start_id, settings)
