"""A downloaded HF word-level model directory (config.json, pytorch_model.bin, vocab.pkl) serves as it is."""

from __future__ import annotations

import warnings

import pytest
from txl.sampling import SamplingParams
from txl_server.runtime import Runtime
from txl_server.sessions.service import GenerateOutcome

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.oracle

CORPUS = [
    "the quick brown fox jumps over the lazy dog .",
    "it was the best of times , it was the worst of times .",
    "the whale , the sea and the ship were all one to him .",
    'he said " yes " and 1 @,@ 000 people came on 3 @.@ 5 days .',
]


@pytest.fixture(scope="module")
def hf_word_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf-word")
    vocab = ["<eos>", "<unk>", *sorted({w for line in CORPUS for w in line.split()})]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = transformers.TransfoXLTokenizer(vocab_file=str(folder / "vocab.txt"))
        tokenizer.save_vocabulary(str(folder))
        config = transformers.TransfoXLConfig(
            vocab_size=len(vocab), cutoffs=[10], d_model=32, d_embed=32, n_head=4, d_head=8, d_inner=64,
            n_layer=2, div_val=2, mem_len=24, tgt_len=8, clamp_len=100,
        )  # fmt: skip
        model = transformers.TransfoXLLMHeadModel(config).eval()
        model.save_pretrained(str(folder), safe_serialization=False)
    (folder / "vocab.txt").unlink()
    return folder, tokenizer


async def test_hf_word_model_directory_serves_generation_and_scoring(make_settings, hf_word_dir):
    folder, hf_tokenizer = hf_word_dir
    runtime = Runtime(make_settings(model=folder))
    await runtime.start()
    try:
        service = runtime.service
        text = "it was the best of times"
        meta = await service.create("t", text=text)
        assert meta.tokens == len(hf_tokenizer.encode(text))
        pieces, outcome = [], None
        async for event in service.generate(
            "t", meta.id, max_tokens=12, sampling=SamplingParams(temperature=0)
        ):
            if isinstance(event, GenerateOutcome):
                outcome = event
            else:
                pieces.append(event.text)
        assert outcome is not None and "".join(pieces) == outcome.result.text
        assert (
            outcome.result.text.startswith(" ") or outcome.result.text[:1] in ",.;:!?'\n"
        )  # spaced after "times"
        scored = await runtime.stateless.score("the quick brown fox", owner="t")
        assert scored.tokens == 4 and scored.logprob < 0
    finally:
        await runtime.stop()
