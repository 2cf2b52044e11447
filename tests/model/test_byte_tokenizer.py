"""Byte-level tokenizer: any text round-trips; streaming pieces join to the full decode."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from txl.tokenizers import ByteTokenizer, load_tokenizer, save_tokenizer

tokenizer = ByteTokenizer()


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_any_text_round_trips(text):
    ids = tokenizer.encode(text)
    assert all(0 <= i < 256 for i in ids)
    assert tokenizer.decode(ids) == text


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 255), max_size=64))
def test_streaming_pieces_join_to_the_full_decode_even_for_invalid_utf8(ids):
    decoder = tokenizer.decoder()
    streamed = "".join(decoder.push(i) for i in ids) + decoder.flush()
    assert streamed == tokenizer.decode(ids)


def test_incomplete_characters_are_held_back_until_complete():
    decoder = tokenizer.decoder()
    euro = "€".encode()
    assert [decoder.push(b) for b in euro] == ["", "", "€"]
    assert decoder.flush() == ""


def test_description_round_trips_through_a_model_directory(tmp_path):
    save_tokenizer(tokenizer, tmp_path)
    assert isinstance(load_tokenizer(tmp_path), ByteTokenizer)
