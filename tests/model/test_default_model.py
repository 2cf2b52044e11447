"""The bundled default model: it loads, still scores its model card's figure, and writes English."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import txl
from txl.evaluate import bits_per_byte, continue_text
from txl.tokenizers import ByteTokenizer, load_tokenizer
from txl_server.settings import BUNDLED_MODEL_DIR

ROOT = Path(__file__).resolve().parents[2]
CARD = json.loads((ROOT / "docs" / "default-model.json").read_text())
TEST_BOOK = ROOT / "tests" / "data" / "gutenberg" / "chesterton-thursday.txt"


@pytest.fixture(scope="module")
def model():
    return txl.load_pretrained(BUNDLED_MODEL_DIR)


def test_bundled_model_is_small_and_describes_its_serving_lengths(model):
    size = sum(p.stat().st_size for p in BUNDLED_MODEL_DIR.iterdir())
    assert size <= 25 * 10**6
    config = json.loads((BUNDLED_MODEL_DIR / "config.json").read_text())
    assert config["tgt_len"] == model.config.segment_len and config["mem_len"] == model.config.mem_len
    assert config["train_mem_len"] > 0
    assert isinstance(load_tokenizer(BUNDLED_MODEL_DIR), ByteTokenizer)


def test_held_out_slice_scores_within_0_05_of_the_model_card(model):
    book = next(b for b in CARD["books"].values() if b["split"] == "test")
    expected = book["slice"]
    data = TEST_BOOK.read_bytes()[: expected["bytes"]]
    assert len(data) == expected["bytes"]
    measured = bits_per_byte(model, data, mem_len=expected["mem_len"], segment_len=model.config.segment_len)
    assert abs(measured - expected["bpb"]) <= 0.05, (measured, expected["bpb"])
    assert measured <= 2.1  # better than xz -9e on these books


def test_generates_english_words(model):
    text = continue_text(model, "It was a dark and stormy night", tokens=300, temperature=0.8, seed=3)
    words = re.findall(r"[A-Za-z]+", text)
    assert len(words) >= 30
    common = {
        "the",
        "and",
        "of",
        "to",
        "a",
        "in",
        "he",
        "was",
        "it",
        "that",
        "his",
        "her",
        "i",
        "you",
        "with",
    }
    assert sum(w.lower() in common for w in words) >= 5
    assert sum(c.isalpha() or c in " \n.,;:'\"!?-" for c in text) / len(text) > 0.95
