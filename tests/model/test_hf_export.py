"""The tokenizer exported for HF transformers (`txl.tokenizers.hf_export`): `AutoTokenizer.from_pretrained(DIR)`
loads it and encodes as the server does, for the byte-level model and for word-level vocabularies (ours, and an
HF directory's with its added-token table)."""

from __future__ import annotations

import json
import random
import warnings

import pytest
from txl.tokenizers import ByteTokenizer, TokenizerError, load_tokenizer
from txl.tokenizers.hf_export import export_hf_tokenizer, gpt2_byte_characters
from txl.tokenizers.word import WordTokenizer

from tests.model.hf_oracle import transformers
from tests.model.test_word_tokenizer import (
    ADDED_PROBES,
    EDGE_CASES,
    WIKI_TRAIN_HEAD,
    WIKI_VALID,
    data_file,
    hf_directory_with_added_tokens,
)

pytestmark = pytest.mark.oracle

TEXTS = [
    "",
    "hello world",
    "  two  spaces\tand a tab\r\nwindows line\n\nblank line above",
    "Café — naïve Größe 日本語 🎉 \u200b zero width",
    "<|endoftext|> <s> </s> <eos> [CLS] look like special tokens",
    "\x00\x01\x7f control bytes",
]


def auto_tokenizer(directory):
    hf = transformers()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hf.AutoTokenizer.from_pretrained(str(directory))


def test_the_byte_alphabet_is_gpt2s():
    chars = gpt2_byte_characters()
    assert len(set(chars)) == 256 and chars[ord("A")] == "A" and chars[ord(" ")] == "Ġ" and chars[10] == "Ċ"


def test_byte_export_encodes_every_text_as_the_server(tmp_path):
    export_hf_tokenizer(ByteTokenizer(), tmp_path, model_max_length=1000)
    hf = auto_tokenizer(tmp_path)
    assert type(hf).__name__ == "PreTrainedTokenizerFast" and hf.model_max_length == 1000
    rng = random.Random(0)
    every_character = "".join(chr(c) for c in range(1, 0x3000) if not 0xD800 <= c < 0xE000)
    randoms = ["".join(chr(rng.randrange(1, 0x10FFFF)) for _ in range(50)) for _ in range(20)]
    randoms = [t for t in randoms if not any(0xD800 <= ord(c) < 0xE000 for c in t)]
    for text in [*TEXTS, every_character, *randoms]:
        ids = hf.encode(text)
        assert ids == ByteTokenizer().encode(text), text[:40]
        assert hf.decode(ids) == text
    assert hf(["ab", "c"], add_special_tokens=True)["input_ids"] == [[97, 98], [99]]


@pytest.fixture(scope="module")
def wiki_tok() -> WordTokenizer:
    return WordTokenizer.build_vocab(data_file(WIKI_TRAIN_HEAD), special=("<eos>", "<formula>"))


def lines_of_text() -> list[str]:
    wiki = data_file(WIKI_VALID).read_text(encoding="utf-8").splitlines()
    return [line for line in wiki[:3000:3] if line.strip()] + EDGE_CASES + TEXTS


def test_word_export_encodes_each_line_as_the_server(tmp_path, wiki_tok):
    export_hf_tokenizer(wiki_tok, tmp_path, model_max_length=4096)
    hf = auto_tokenizer(tmp_path)
    assert type(hf).__name__ == "TransfoXLTokenizer" and hf.eos_token == "<eos>"
    lines = [line for line in lines_of_text() if "\n" not in line]
    for line in lines:
        assert hf.encode(line) == wiki_tok.encode(line), line
    # The server writes each line break as <eos>; HF's tokenizer drops them: a text is its lines joined by it.
    text = "\n".join(lines[:50])
    joined = [
        i for k, line in enumerate(lines[:50]) for i in ([wiki_tok.eos_id] if k else []) + hf.encode(line)
    ]
    assert joined == wiki_tok.encode(text)


@pytest.mark.parametrize("lower_case", [False, True])
def test_word_export_keeps_an_hf_directory_added_token_table(tmp_path, lower_case):
    wiki = data_file(WIKI_VALID).read_text(encoding="utf-8").split("\n")[:1500]
    hf_dir, _ = hf_directory_with_added_tokens(tmp_path / "hf", wiki, lower_case, "as saved")
    served = load_tokenizer(hf_dir)
    assert isinstance(served, WordTokenizer) and served.added_tokens
    export_hf_tokenizer(served, tmp_path / "out", model_max_length=4096)
    hf = auto_tokenizer(tmp_path / "out")
    for line in [*ADDED_PROBES, *EDGE_CASES]:
        # As for HF's own directory: an added token with an id past the vocabulary is the unknown word's here.
        expected = [i if i < served.vocab_size else served.unk_id for i in hf.encode(line)]
        assert served.encode(line) == expected, line


def test_word_export_writes_no_pickle_and_refuses_unreadable_symbols(tmp_path, wiki_tok):
    written = export_hf_tokenizer(wiki_tok, tmp_path / "ok", model_max_length=10, chat_template="{{ 'x' }}")
    assert sorted(p.name for p in written) == ["tokenizer_config.json", "vocab.txt"]
    config = json.loads((tmp_path / "ok" / "tokenizer_config.json").read_text())
    assert config["chat_template"] == "{{ 'x' }}" and config["model_max_length"] == 10
    with pytest.raises(TokenizerError, match="whitespace"):
        export_hf_tokenizer(WordTokenizer(["<unk>", "a b"]), tmp_path / "bad", model_max_length=10)
