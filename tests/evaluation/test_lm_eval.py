"""lm-evaluation-harness (pinned in the `eval` extra) against a live server, as docs/evaluation.md runs it:
`--model local-completions` with `tokenizer_backend=remote` (the server's /tokenize, /detokenize and
/tokenizer_info), `--batch_size 16`, offline, on local tasks. Its numbers are the server's own: the perplexity of
whole documents equals /v1/score's within 0.1%, each multiple-choice log-likelihood is /v1/score's difference
of two texts, and each generation is /v1/completions' at temperature 0."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.evaluation.tasks import CHOICE, GENERATION, PERPLEXITY, choice_items, documents, write_tasks
from tests.helpers.live_server import client_fixture, live_server_fixture

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed (the `eval` extra)")
pytestmark = pytest.mark.evaluation

server = live_server_fixture("lm-eval")
client = client_fixture()


def lm_eval_command(base_url: str, model_id: str, tasks: Path, out: Path) -> list[str]:
    """docs/evaluation.md's command. max_length: every document in one window (the server's longest prompt)."""
    model_args = (
        f"model={model_id},base_url={base_url}/v1/completions,tokenizer_backend=remote,max_length=1048577"
    )
    return [
        sys.executable, "-m", "lm_eval", "run", "--model", "local-completions", "--model_args", model_args,
        "--tasks", f"{PERPLEXITY},{CHOICE},{GENERATION}", "--include_path", str(tasks), "--batch_size", "16",
        "--output_path", str(out), "--log_samples",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def evaluation(server, tmp_path_factory):
    """lm-eval's results and samples, from one run of the documented command."""
    folder = tmp_path_factory.mktemp("lm-eval")
    tasks = write_tasks(folder / "tasks")
    with server.client() as c:
        model_id = c.get("/v1/models").json()["data"][0]["id"]
    offline = {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(folder / "hf"),
        "TOKENIZERS_PARALLELISM": "false",
    }
    command = lm_eval_command(server.url, model_id, tasks, folder / "out")
    run = subprocess.run(command, env={**os.environ, **offline}, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    results_file = next((folder / "out").rglob("results_*.json"))
    samples = {
        task: [json.loads(line) for line in next((folder / "out").rglob(f"samples_{task}_*.jsonl")).open()]
        for task in (PERPLEXITY, CHOICE, GENERATION)
    }
    return json.loads(results_file.read_text())["results"], samples


def score(client, text: str) -> float:
    answer = client.post("/v1/score", json={"text": text})
    assert answer.status_code == 200, answer.text
    return answer.json()["logprob"]


def test_perplexity_of_whole_documents_equals_the_servers(client, evaluation):
    results, samples = evaluation
    texts = documents()
    assert any(len(t.encode()) > len(t) for t in texts)  # multi-byte characters
    logprob = sum(score(client, text) for text in texts)
    nbytes = sum(len(text.encode()) for text in texts)
    expected_bpb = -logprob / nbytes / math.log(2)
    got_bpb = results[PERPLEXITY]["bits_per_byte,none"]
    assert got_bpb == pytest.approx(expected_bpb, rel=1e-3)
    # Document by document, exactly: lm-eval puts the tokenizer's bos_token (the start token, a newline here)
    # before a document, so its first token follows two of them where /v1/score's follows one.
    bos = client.get("/tokenizer_info").json()["bos_token"]
    by_text = {s["doc"]["text"]: float(s["resps"][0][0]) for s in samples[PERPLEXITY]}
    for text in texts:
        assert by_text[text] == pytest.approx(score(client, bos + text) - score(client, bos), abs=0.05)


def test_multiple_choice_log_likelihoods_are_the_servers(client, evaluation):
    results, samples = evaluation
    items = choice_items()
    assert len(samples[CHOICE]) == len(items) and 0 <= results[CHOICE]["acc,none"] <= 1
    for sample in samples[CHOICE][:4]:
        context = sample["doc"]["context"]
        for choice, response in zip(sample["doc"]["choices"], sample["resps"], strict=True):
            loglikelihood = float(response[0][0])
            assert loglikelihood == pytest.approx(
                score(client, context + choice) - score(client, context), abs=2e-3
            )


def test_generations_are_the_servers_at_temperature_0(client, evaluation):
    results, samples = evaluation
    assert "exact_match,none" in results[GENERATION]
    for sample in samples[GENERATION]:
        body = {"prompt": sample["doc"]["prompt"], "max_tokens": 12, "temperature": 0, "stop": ["\n"]}
        expected = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
        assert sample["resps"][0][0] == expected
