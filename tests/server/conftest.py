"""Server test fixtures: a tiny byte-level model saved for real, and a real Redis server."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import torch
import txl
from txl.tokenizers import ByteTokenizer, save_tokenizer
from txl_server.runtime import Runtime
from txl_server.sessions.redis_server import EmbeddedRedis
from txl_server.settings import Settings


def make_byte_model_dir(path: Path, *, seed: int = 0, **overrides) -> Path:
    config = dict(
        vocab_size=256,
        cutoffs=[],
        div_val=1,
        d_model=32,
        d_embed=32,
        n_head=4,
        d_head=8,
        d_inner=64,
        n_layer=2,
        mem_len=32,
        tgt_len=8,
        same_length=False,
        dropout=0.0,
    )
    config.update(overrides)
    model = txl.TransfoXLLMHeadModel(txl.TxlConfig(**config))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = 0.3 * torch.randn(param.shape, generator=generator)
            param.copy_(1 + noise if "layer_norm.weight" in name else noise)
    txl.save_pretrained(model, path)
    save_tokenizer(ByteTokenizer(), path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return make_byte_model_dir(tmp_path_factory.mktemp("models") / "tiny-byte")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def make_settings(tiny_model_dir, redis_server):
    """Settings for a runtime on the shared Redis, isolated by a fresh key prefix."""

    def make(**overrides) -> Settings:
        values = dict(
            model=tiny_model_dir,
            redis_url=redis_server.url,
            redis_prefix=f"test-{uuid.uuid4().hex[:8]}:",
            max_batch_size=16,
        )
        values.update(overrides)
        return Settings(**values)

    return make


@pytest.fixture
async def runtime(make_settings):
    rt = Runtime(make_settings())
    await rt.start()
    yield rt
    await rt.stop()
