"""The chat template in force: the operator's TXL_CHAT_TEMPLATE, else the one the model directory declares in its
`chat_template.json` (the bundled model does), unless the operator says "none"; a model that declares none keeps
chat's 404. `/v1/models` and `/v1/system` say which template is in force and where it comes from."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
from txl_server.api.shared.chat_template import TEMPLATE_FILE, declared_chat_template, served_settings
from txl_server.settings import BUNDLED_MODEL_DIR, TRANSCRIPT_TEMPLATE, Settings

from tests.helpers.live_server import serve

CHAT = {"model": "declaring", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}


@pytest.fixture(scope="module")
def declaring_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model with the bundled model's template file beside it."""
    path = tmp_path_factory.mktemp("declaring") / "declaring"
    shutil.copytree(tiny_model_dir, path)
    shutil.copy(BUNDLED_MODEL_DIR / TEMPLATE_FILE, path / TEMPLATE_FILE)
    return path


def in_force(server) -> tuple[dict | None, dict | None]:
    """What /v1/models and /v1/system say of the template."""
    with server.client() as client:
        model = client.get("/v1/models").json()["data"][0]["chat_template"]
        system = client.get("/v1/system").json()["chat_template"]
    return model, system


def test_the_bundled_model_declares_the_transcript_template():
    assert declared_chat_template(BUNDLED_MODEL_DIR) == TRANSCRIPT_TEMPLATE
    served = served_settings(Settings())
    assert (served.chat_template, served.chat_template_source) == (TRANSCRIPT_TEMPLATE, "model")


def test_a_model_that_declares_a_template_answers_chat_and_message_items(declaring_model_dir, redis_server):
    for server in serve(declaring_model_dir, redis_server.url, "declared"):
        expected = {"format": TRANSCRIPT_TEMPLATE, "source": "model"}
        assert in_force(server) == (expected, expected)
        with server.client() as client:
            chat = client.post("/v1/chat/completions", json=CHAT)
            assert chat.status_code == 200, chat.text
            assert chat.json()["choices"][0]["message"]["role"] == "assistant"
            items = [{"type": "message", "role": "user", "content": "Hello"}]
            conversation = client.post("/v1/conversations", json={"items": items})
            assert conversation.status_code == 200, conversation.text
            reply = client.post(
                "/v1/responses",
                json={"conversation": conversation.json()["id"], "input": items, "max_output_tokens": 3},
            )
            assert reply.status_code == 200, reply.text


def test_the_operators_template_wins_and_none_turns_chat_off(declaring_model_dir, redis_server):
    for server in serve(
        declaring_model_dir, redis_server.url, "operator", chat_template="{role}> {content}\\n"
    ):
        expected = {"format": "{role}> {content}\n", "source": "TXL_CHAT_TEMPLATE"}
        assert in_force(server) == (expected, expected)
    for server in serve(declaring_model_dir, redis_server.url, "refused", chat_template="none"):
        assert in_force(server) == (None, None)
        with server.client() as client:
            refused = client.post("/v1/chat/completions", json=CHAT)
        assert refused.status_code == 404 and "base language model" in refused.json()["error"]["message"]


def test_a_model_that_declares_none_keeps_the_refusal(tiny_model_dir, redis_server):
    for server in serve(tiny_model_dir, redis_server.url, "undeclared"):
        assert in_force(server) == (None, None)
        with server.client() as client:
            refused = client.post("/v1/chat/completions", json=CHAT)
            items = [{"type": "message", "role": "user", "content": "Hello"}]
            conversation = client.post("/v1/conversations", json={"items": items})
        assert refused.status_code == 404
        assert conversation.status_code == 400 and "chat template" in conversation.json()["error"]["message"]


def test_a_declaration_that_cannot_be_used_stops_the_start_naming_the_file(tmp_path):
    (tmp_path / TEMPLATE_FILE).write_text(json.dumps({"format": "{Role}: no content field\n"}))
    with pytest.raises(ValueError, match=f"{TEMPLATE_FILE}: chat_template must hold {{content}} once"):
        served_settings(Settings(model=tmp_path))
    (tmp_path / TEMPLATE_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="is not a JSON file"):
        declared_chat_template(tmp_path)


def test_a_jinja_template_alone_is_not_used_and_the_log_says_how_to_serve_chat(tmp_path, caplog):
    """Hugging Face's processors keep a Jinja template in a file of this name: this server does not render Jinja."""
    (tmp_path / TEMPLATE_FILE).write_text(
        json.dumps({"chat_template": "{% for m in messages %}{% endfor %}"})
    )
    with caplog.at_level(logging.WARNING):
        assert declared_chat_template(tmp_path) is None
    assert "TXL_CHAT_TEMPLATE" in caplog.text
