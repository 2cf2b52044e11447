"""lm-evaluation-harness' `local-completions` model (in process) on a word-level model: its remote tokenizer reads
`<eos>` as the start token, and its rolling perplexity, log-likelihoods and generations are the server's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.live_server import serve
from tests.helpers.tiny_models import make_word_model_dir

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed (the `eval` extra)")
pytestmark = pytest.mark.evaluation

WIKITEXT = Path(__file__).parents[1] / "data" / "wikitext-103" / "wiki.valid.tokens"


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return [line.strip() for line in WIKITEXT.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def word_server(tmp_path_factory, redis_server, lines):
    model_dir = make_word_model_dir(tmp_path_factory.mktemp("models") / "tiny-word", lines[:300])
    yield from serve(model_dir, redis_server.url, "lm-eval-word")


@pytest.fixture(scope="module")
def lm(word_server, monkeypatch_module):
    monkeypatch_module.setenv("HF_HUB_OFFLINE", "1")
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    with word_server.client() as c:
        model_id = c.get("/v1/models").json()["data"][0]["id"]
    return LocalCompletionsAPI(
        base_url=f"{word_server.url}/v1/completions",
        model=model_id,
        tokenizer_backend="remote",
        batch_size=16,
        max_length=1048577,
    )


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def score(client, text: str) -> float:
    answer = client.post("/v1/score", json={"text": text})
    assert answer.status_code == 200, answer.text
    return answer.json()["logprob"]


def requests(kind: str, arguments: list[tuple]):
    from lm_eval.api.instance import Instance

    return [Instance(request_type=kind, doc={}, arguments=args, idx=i) for i, args in enumerate(arguments)]


def test_the_start_token_is_eos(lm, word_server):
    with word_server.client() as c:
        eos = c.post("/tokenize", json={"prompt": "<eos>"}).json()["tokens"]
    assert lm.prefix_token_id == eos[0] and lm.eos_string == "<eos>"


def test_rolling_perplexity_is_the_servers(lm, word_server, lines):
    documents = ["\n".join(lines[i : i + 40]) for i in (300, 400, 500)]  # held out from the vocabulary
    loglikelihoods = lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(d,) for d in documents]))
    with word_server.client() as c:
        for document, loglikelihood in zip(documents, loglikelihoods, strict=True):
            assert loglikelihood == pytest.approx(score(c, "<eos>" + document) - score(c, "<eos>"), abs=0.05)
            assert loglikelihood == pytest.approx(score(c, document), rel=1e-3)


def test_log_likelihoods_and_generations_are_the_servers(lm, word_server, lines):
    pairs = [(lines[i], " " + lines[i + 1]) for i in range(600, 620)]
    results = lm.loglikelihood(requests("loglikelihood", pairs))
    generations = lm.generate_until(
        requests("generate_until", [(c, {"until": ["\n"]}) for c, _ in pairs[:3]])
    )
    with word_server.client() as c:
        for (context, continuation), (loglikelihood, _) in zip(pairs[:5], results, strict=False):
            expected = score(c, context + continuation) - score(c, context)
            assert loglikelihood == pytest.approx(expected, abs=0.05)
        for (context, _), generation in zip(pairs, generations, strict=False):
            body = {"prompt": context, "max_tokens": 256, "temperature": 0, "stop": ["<eos>", "\n"]}
            assert generation == c.post("/v1/completions", json=body).json()["choices"][0]["text"]
