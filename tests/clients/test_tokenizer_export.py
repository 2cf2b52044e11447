"""`txl tokenizer export DIR`: the model's tokenizer as a directory HF transformers loads, encoding as the server
does, with the server's settings (the bundled model by default, TXL_MAX_TEXT_CHARS, TXL_CHAT_TEMPLATE)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from txl.tokenizers import load_tokenizer
from txl_client.cli import main
from txl_server.api.shared.chat_template import ChatMessage, ChatTemplate
from txl_server.settings import BUNDLED_MODEL_DIR, TRANSCRIPT_TEMPLATE

from tests.helpers.tiny_models import make_word_model_dir
from tests.model.hf_oracle import transformers

pytestmark = pytest.mark.oracle

TEXT = "Chapter 1 .\nThe game 's 1 @,@ 000 players — naïve 🎉 <formula>"


def test_export_of_the_bundled_model_encodes_as_the_server(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TXL_MODEL", raising=False)
    monkeypatch.setenv("TXL_MAX_TEXT_CHARS", "5000")
    monkeypatch.delenv("TXL_CHAT_TEMPLATE", raising=False)  # the bundled model's own template: the transcript
    assert main(["tokenizer", "export", str(tmp_path)]) == 0
    assert "tokenizer.json" in capsys.readouterr().out
    hf = transformers().AutoTokenizer.from_pretrained(str(tmp_path))
    assert hf.encode(TEXT) == load_tokenizer(BUNDLED_MODEL_DIR).encode(TEXT)
    assert hf.model_max_length == 5000
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    server_prompt = ChatTemplate(TRANSCRIPT_TEMPLATE).prompt([ChatMessage(**m) for m in messages])
    assert hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == server_prompt
    assert hf.apply_chat_template(messages, add_generation_prompt=True) == list(server_prompt.encode())


def test_export_of_a_word_model_replaces_a_byte_export(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TXL_CHAT_TEMPLATE", raising=False)
    lines = (Path(__file__).parents[1] / "data/wikitext-103/wiki.valid.tokens").read_text().splitlines()[:300]
    model_dir = make_word_model_dir(tmp_path / "word", lines)
    out = tmp_path / "out"
    assert main(["tokenizer", "export", str(out), "--model", str(BUNDLED_MODEL_DIR)]) == 0
    # Files are there: a second export needs --force, and replaces the first whole.
    assert main(["tokenizer", "export", str(out), "--model", str(model_dir)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["tokenizer", "export", str(out), "--model", str(model_dir), "--force"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["tokenizer_config.json", "vocab.txt"]
    assert "chat_template" not in json.loads((out / "tokenizer_config.json").read_text())
    hf = transformers().AutoTokenizer.from_pretrained(str(out))
    served = load_tokenizer(model_dir)
    for line in TEXT.split("\n"):
        assert hf.encode(line) == served.encode(line)


def test_export_refuses_a_missing_model_directory(tmp_path, capsys):
    assert main(["tokenizer", "export", str(tmp_path / "out"), "--model", str(tmp_path / "nowhere")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
