"""vLLM's tokenizer routes (`/tokenize`, `/detokenize`, `/tokenizer_info`) on a byte-level and a word-level model:
the same ids as the completions routes count, vLLM's JSON, the limits and errors of the OpenAI routes; and
completions of as many prompts as lm-evaluation-harness sends in one batch."""

from __future__ import annotations

from pathlib import Path

import pytest
from txl.tokenizers import load_tokenizer
from txl_server.api.completions.protocol import MAX_CHOICES

from tests.helpers.live_server import client_fixture, live_server_fixture, serve
from tests.helpers.tiny_models import make_word_model_dir

KEY = "key-tokenizer"
WIKITEXT = Path(__file__).parents[2] / "data" / "wikitext-103" / "wiki.valid.tokens"

server = live_server_fixture("tokenizer", api_keys=KEY, chat_template="transcript", max_text_chars=4096)
client = client_fixture(KEY)


@pytest.fixture(scope="module")
def word_model_dir(tmp_path_factory) -> Path:
    lines = WIKITEXT.read_text(encoding="utf-8").splitlines()[:400]
    return make_word_model_dir(tmp_path_factory.mktemp("models") / "tiny-word", lines)


@pytest.fixture(scope="module")
def word_server(word_model_dir, redis_server):
    yield from serve(word_model_dir, redis_server.url, "tokenizer-word")


@pytest.fixture
def word_client(word_server):
    with word_server.client() as c:
        yield c


def completion_usage(client, prompt) -> int:
    body = {"prompt": prompt, "max_tokens": 0}
    return client.post("/v1/completions", json=body).json()["usage"]["prompt_tokens"]


# ---------------------------------------------------------------------------------------------- /tokenize


def test_tokenize_gives_the_ids_completions_count(client):
    text = "Café — naïve 日本 🎉\nend"
    answer = client.post("/tokenize", json={"prompt": text, "return_token_strs": True})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["tokens"] == list(text.encode("utf-8"))
    assert body["count"] == len(body["tokens"]) == completion_usage(client, text)
    assert body["max_model_len"] == 4096
    assert body["token_strs"][:4] == ["C", "a", "f", "\\xc3"]
    # The token-form prompt of those ids is the same prompt.
    assert completion_usage(client, body["tokens"]) == body["count"]


def test_tokenize_adds_no_special_token_either_way(client):
    with_special = client.post("/tokenize", json={"prompt": "hi", "add_special_tokens": True}).json()
    without = client.post("/tokenize", json={"prompt": "hi", "add_special_tokens": False}).json()
    assert with_special["tokens"] == without["tokens"] == [104, 105]
    assert with_special["token_strs"] is None


def test_tokenize_messages_writes_them_out_with_the_chat_template(client):
    messages = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi."}]
    body = client.post("/tokenize", json={"messages": messages}).json()
    assert bytes(body["tokens"]).decode() == "User: Hello\nAssistant: Hi.\nAssistant:"
    chat = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1}).json()
    assert chat["usage"]["prompt_tokens"] == body["count"]
    plain = client.post("/tokenize", json={"messages": messages, "add_generation_prompt": False}).json()
    assert bytes(plain["tokens"]).decode() == "User: Hello\nAssistant: Hi.\n"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({}, 400, "prompt"),
        ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, 400, "prompt"),
        ({"prompt": "x" * 4097}, 413, "prompt"),
        ({"prompt": 5}, 400, "prompt"),
        ({"prompt": "a", "model": "other"}, 404, "model"),
    ],
)
def test_tokenize_refuses_bad_requests_in_openai_shape(client, body, status, param):
    answer = client.post("/tokenize", json=body)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and error["type"] in ("invalid_request_error",)
    if status == 404:
        assert error["code"] == "model_not_found"


def test_tokenizer_routes_need_the_api_key(server):
    with server.client() as anonymous:
        for answer in (
            anonymous.post("/tokenize", json={"prompt": "a"}),
            anonymous.post("/detokenize", json={"tokens": [97]}),
            anonymous.get("/tokenizer_info"),
        ):
            assert answer.status_code == 401
            assert answer.json()["error"]["code"] == "invalid_api_key"


# ---------------------------------------------------------------------------------------------- /detokenize


def test_detokenize_writes_ids_as_completions_write_them(client):
    text = "Größe 🎉"
    ids = client.post("/tokenize", json={"prompt": text}).json()["tokens"]
    assert client.post("/detokenize", json={"tokens": ids}).json() == {"prompt": text}
    # A window that starts inside a character: the stray bytes are U+FFFD, as in generated text.
    assert client.post("/detokenize", json={"tokens": ids[3:]}).json()["prompt"] == "\ufffdße 🎉"


@pytest.mark.parametrize("tokens", [[256], [-1], [1.5], "abc"])
def test_detokenize_refuses_ids_outside_the_vocabulary(client, tokens):
    answer = client.post("/detokenize", json={"tokens": tokens})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"].startswith("tokens")


# ---------------------------------------------------------------------------------------------- /tokenizer_info


def test_tokenizer_info_of_the_byte_model(client):
    info = client.get("/tokenizer_info").json()
    assert info["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert info["model_max_length"] == 4096
    # No end-of-text token; the start token, which lm-eval puts before a document, is the newline.
    assert info["eos_token"] is None and info["bos_token"] == "\n" and info["pad_token"] is None


def test_tokenizer_info_chat_template_renders_as_the_server_writes_chats(client):
    jinja2 = pytest.importorskip("jinja2")
    template = jinja2.Environment().from_string(client.get("/tokenizer_info").json()["chat_template"])
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo {{x}}"}]},
    ]
    rendered = template.render(messages=messages, add_generation_prompt=True)
    tokens = client.post("/tokenize", json={"messages": messages}).json()["tokens"]
    assert rendered == bytes(tokens).decode() == "System: Be brief.\nUser: Hello {{x}}\nAssistant:"


def test_tokenizer_routes_of_a_word_model(word_client, word_model_dir):
    tokenizer = load_tokenizer(word_model_dir)
    info = word_client.get("/tokenizer_info").json()
    assert info["tokenizer_class"] == "TransfoXLTokenizer"
    assert (info["eos_token"], info["bos_token"], info["unk_token"]) == ("<eos>", "<eos>", "<unk>")
    assert "chat_template" not in info or info["chat_template"] is None
    text = "The game 's 1 @,@ 000 players <formula>\nsecond line"
    body = word_client.post("/tokenize", json={"prompt": text, "return_token_strs": True}).json()
    assert body["tokens"] == tokenizer.encode(text)
    assert "<eos>" in body["token_strs"] and "<formula>" in body["token_strs"]
    # lm-eval reads the start token's id as the id of `bos_token`'s text.
    bos = word_client.post("/tokenize", json={"prompt": info["bos_token"]}).json()["tokens"]
    assert bos == [tokenizer.eos_id]
    decoded = word_client.post("/detokenize", json={"tokens": body["tokens"]}).json()["prompt"]
    assert tokenizer.encode(decoded) == body["tokens"]
    answer = word_client.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "messages"


# ---------------------------------------------------------------------------------------------- batches


def test_completions_score_a_batch_as_large_as_lm_eval_sends(client):
    """lm-eval's log-likelihood requests: token-form prompts, echo, logprobs 1, max_tokens 1, batch_size 64.
    Each choice's log-probs equal those of the same prompt sent alone."""
    prompts = [list(f"Document {i}: the tide comes in.".encode()) for i in range(MAX_CHOICES)]
    body = {"prompt": prompts, "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0}
    answer = client.post("/v1/completions", json=body)
    assert answer.status_code == 200, answer.text
    choices = sorted(answer.json()["choices"], key=lambda c: c["index"])
    assert len(choices) == MAX_CHOICES
    for i in (0, 17, MAX_CHOICES - 1):
        alone = client.post("/v1/completions", json={**body, "prompt": prompts[i]}).json()["choices"][0]
        got, want = choices[i]["logprobs"]["token_logprobs"], alone["logprobs"]["token_logprobs"]
        assert got[0] is None and want[0] is None
        assert got[1:] == pytest.approx(want[1:], abs=1e-4)
        assert len(got) == len(prompts[i]) + 1  # the prompt's, then the generated token's


def test_completions_refuse_more_prompts_than_a_batch_holds(client):
    body = {"prompt": [[97, 98]] * (MAX_CHOICES + 1), "max_tokens": 1}
    answer = client.post("/v1/completions", json=body)
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "prompt"
    answer = client.post("/v1/completions", json={"prompt": [[97]] * 16, "n": 8, "max_tokens": 1})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "n"


def test_a_tokenizer_route_called_with_another_method_is_405_not_a_file(client):
    answer = client.get("/tokenize")
    assert answer.status_code == 405 and answer.headers["allow"] == "POST"
    assert client.post("/tokenizer_info").status_code == 405


@pytest.mark.parametrize(("path", "field"), [("/detokenize", "tokens"), ("/v1/completions", "prompt")])
def test_true_is_not_a_token_id(client, path, field):
    answer = client.post(path, json={field: [True, 98], "max_tokens": 1})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"].startswith(field)
