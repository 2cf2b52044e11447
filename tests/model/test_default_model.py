"""The bundled default model: it loads, still scores its model card's figures, beats xz, and writes ordinary prose."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
import txl
from txl.tokenizers import ByteTokenizer, load_tokenizer
from txl.training.evaluate import PROMPT, bits_per_byte, continue_text, sample_checks
from txl_server.settings import BUNDLED_MODEL_DIR

ROOT = Path(__file__).resolve().parents[2]
CARD = json.loads((ROOT / "docs" / "default-model.json").read_text())
HELD_OUT = ROOT / "tests" / "data" / "heldout"
GENRES = ("fiction", "technical", "encyclopedic")


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


def test_card_beats_xz_by_15_percent_on_each_held_out_genre():
    serving = str(CARD["serving_mem_len"])
    assert set(GENRES) <= set(CARD["books"])
    for genre in GENRES:
        book = CARD["books"][genre]
        assert book["split"] == "test"
        assert book["bpb"][serving] <= 0.85 * book["xz_9e"], (genre, book["bpb"][serving], book["xz_9e"])


@pytest.mark.parametrize("genre", GENRES)
def test_held_out_slice_scores_within_0_05_of_the_model_card(model, genre):
    expected = CARD["books"][genre]["slice"]
    data = (HELD_OUT / f"{genre}.txt").read_bytes()
    assert hashlib.sha256(data).hexdigest() == expected["sha256"]  # the very bytes the card scored
    measured = bits_per_byte(model, data, mem_len=expected["mem_len"], segment_len=model.config.segment_len)
    assert abs(measured - expected["bpb"]) <= 0.05, (genre, measured, expected["bpb"])


def test_card_samples_read_as_prose():
    assert len({s["temperature"] for s in CARD["samples"]}) >= 2
    for s in CARD["samples"]:
        assert sample_checks(s["prompt"] + s["text"]) == {"tokenizer_spacing": False, "repeated_line": False}


@pytest.mark.parametrize("seed", [3, 4])
def test_writes_english_without_tokenizer_spacing(model, seed):
    text = continue_text(model, PROMPT, tokens=300, temperature=0.7, top_p=0.95, seed=seed)
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
    assert not sample_checks(PROMPT + text)["tokenizer_spacing"], text


def test_sample_checks_catch_tokenizer_spacing_and_repeated_lines():
    assert sample_checks('He said , "no ."') == {"tokenizer_spacing": True, "repeated_line": False}
    assert sample_checks("``Yes''") == {"tokenizer_spacing": True, "repeated_line": False}
    assert sample_checks("One line.\nTwo.\n  One line.\n") == {
        "tokenizer_spacing": False,
        "repeated_line": True,
    }
    assert sample_checks("It was night. The rain fell.\n\nHe ran.") == {
        "tokenizer_spacing": False,
        "repeated_line": False,
    }
