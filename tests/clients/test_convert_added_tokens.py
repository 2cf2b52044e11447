"""`txl convert` of an HF directory whose added-token table disagrees with its vocabulary (a tokenizer built
from scratch with HF): the converted model scores text as HF's model does on HF's ids, `<unk>` included."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.model.hf_oracle import hf_model, save_hf

pytestmark = pytest.mark.oracle

CORPUS = [
    "the cat sat on the <unk> mat .",
    "a dog , the cat and 2 @,@ 000 birds !",
    "the mat is on the cat and the <unk> .",
]


def test_convert_reads_the_added_token_table_and_scores_as_hf(tmp_path, capsys):
    from transformers import TransfoXLTokenizer
    from txl import load_pretrained
    from txl.tokenizers import load_tokenizer
    from txl_client.cli import main

    hf_dir = tmp_path / "hf"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = TransfoXLTokenizer(special=["<eos>"])  # built from scratch: `<unk>` is added token 1
        tokenizer.count_sents([line.split() for line in CORPUS])
        tokenizer.build_vocab()
        tokenizer.save_pretrained(str(hf_dir))
        reloaded = TransfoXLTokenizer.from_pretrained(str(hf_dir))
    vocab_size = len(tokenizer.idx2sym)
    reference = hf_model(vocab_size=vocab_size, cutoffs=[6], dropout=0.0)
    save_hf(reference, hf_dir, safe=True)

    assert main(["convert", str(hf_dir), str(tmp_path / "out")]) == 0
    assert "2 added tokens from HF's table" in capsys.readouterr().out  # `<unk>` and `<formula>`

    model, ours = load_pretrained(tmp_path / "out"), load_tokenizer(tmp_path / "out")
    text = "the <unk> cat sat on the <formula> mat ."
    ids = reloaded.encode(text)
    assert ours.encode(text) == ids and ids[1] == 1 != tokenizer.sym2idx["<unk>"]
    tokens = torch.tensor([ids])
    with torch.inference_mode():
        hidden, _ = model(tokens, model.empty_memory())
        ours_score = model.log_probs(hidden)[0, :-1].gather(1, tokens[0, 1:, None]).sum()
        empty = [torch.empty(0, 1, reference.config.d_model) for _ in range(reference.config.n_layer)]
        scores = reference(tokens, mems=empty).prediction_scores
        hf_score = scores[0, :-1].gather(1, tokens[0, 1:, None]).sum()
    torch.testing.assert_close(ours_score, hf_score, rtol=0, atol=1e-4)
