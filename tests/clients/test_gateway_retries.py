"""The SDK behind a proxy: 502/503/504 retried with the same Idempotency-Key (counted and logged), and the
X-TXL-Session header on requests that name their session in the body, so that a proxy can keep them on its
replica."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from txl_client import AsyncClient, Client, Unavailable, calls, operations

from .conftest import API_KEY
from .proxy import Exchange, LoopbackProxy, Request

SESSION_ID = "kQ2-x_9AbCdEfGhIjKlMnOpQrStUvW-_"


class FlakyGateway(LoopbackProxy):
    """A loopback HTTP/1.1 gateway in front of one server that fails as a proxy does when a replica fails.

    `refuse(part, status)`: answers the next request whose path contains `part` with `status` without passing it
    on (the replica was unreachable). `lose(part)`: passes it on, lets the server finish it, then answers 502
    (the replica died before its answer came back). Every request it sees is kept in `seen` (method, path,
    lower-cased headers)."""

    def __init__(self, target_port: int) -> None:
        super().__init__(target_port)
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self._faults: list[tuple[str, int, bool]] = []  # (path part, status, passed on first)

    def refuse(self, part: str, status: int, times: int = 1) -> None:
        with self._lock:
            self._faults += [(part, status, False)] * times

    def lose(self, part: str) -> None:
        with self._lock:
            self._faults.append((part, 502, True))

    def _fault(self, path: str) -> tuple[int, bool] | None:
        with self._lock:
            for i, (part, status, passed_on) in enumerate(self._faults):
                if part in path:
                    del self._faults[i]
                    return status, passed_on
        return None

    def relay(self, exchange: Exchange, request: Request) -> bool:
        self.seen.append((request.method, request.path, request.message[1]))
        fault = self._fault(request.path)
        if fault is None:
            return super().relay(exchange, request)
        status, passed_on = fault
        if passed_on and exchange.forward(request) is None:
            return False
        # Stock nginx answers with an HTML page; deploy/nginx answers in the API's error shape.
        page = json.dumps({"error": {"type": "unavailable", "message": "gateway", "param": None}})
        exchange.answer(
            f"HTTP/1.1 {status} Gateway\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(page)}\r\n\r\n{page}".encode()
        )
        return True

    def requests_to(self, part: str) -> list[tuple[str, str, dict[str, str]]]:
        return [s for s in self.seen if part in s[1]]


@pytest.fixture
def gateway(server):
    proxy = FlakyGateway(server.port)
    yield proxy
    proxy.close()


def test_a_step_whose_answer_the_gateway_lost_is_sent_again_and_applied_once(server, gateway, caplog):
    with Client(gateway.url, api_key=API_KEY) as client:
        session = client.create_session(text="Lost and")
        gateway.lose("/append")
        with caplog.at_level(logging.INFO, logger="txl_client"):
            result = client.append(session.id, " found")
        appends = gateway.requests_to("/append")
        assert len(appends) == 2
        assert appends[0][2]["idempotency-key"] == appends[1][2]["idempotency-key"]
        # The first attempt committed; the retry got its stored answer instead of appending again.
        assert result.session.version == session.version + 1
        assert client.get_session(session.id).tokens == session.tokens + len(" found")
        assert client.retries.by_reason() == {"502": 1} and client.retries.total == 1
    (record,) = [r for r in caplog.records if r.name == "txl_client"]
    assert record.levelno == logging.WARNING
    assert f"retrying POST /v1/sessions/{session.id}/append" in record.getMessage()
    assert "same Idempotency-Key" in record.getMessage() and "502" in record.getMessage()


def test_reads_and_scoring_are_sent_again_after_503_and_504(gateway):
    with Client(gateway.url, api_key=API_KEY) as client:
        gateway.refuse("/v1/sessions", 503)
        assert isinstance(client.list_sessions(), list)
        gateway.refuse("/v1/score", 504)
        assert client.score("Scoring changes nothing.").tokens > 0
        assert client.retries.by_reason() == {"503": 1, "504": 1}


def test_a_gateway_that_keeps_failing_ends_in_unavailable(gateway):
    with Client(gateway.url, api_key=API_KEY, max_retries=2) as client:
        gateway.refuse("/v1/models", 502, times=3)
        with pytest.raises(Unavailable) as caught:
            client.models()
        assert caught.value.status == 502
        assert client.retries.count("502") == 2 and len(gateway.requests_to("/v1/models")) == 3


def test_a_call_that_could_change_something_twice_is_not_repeatable():
    assert not calls.Call("POST", "/v1/anything", {"x": 1}).repeatable
    assert calls.Call("POST", "/v1/anything", {"x": 1}, idempotency_key="k").repeatable
    assert operations.score("text").call.repeatable
    assert calls.Call("GET", "/v1/sessions").repeatable


def test_the_async_client_retries_a_lost_step_alike(server, gateway):
    async def run():
        async with AsyncClient(gateway.url, api_key=API_KEY) as client:
            session = await client.create_session(text="Async")
            gateway.lose("/generate")
            result = await client.generate(session.id, max_tokens=3, temperature=0)
            again = await client.get_session(session.id)
            return session, result, again, client.retries.by_reason()

    session, result, again, retries = asyncio.run(run())
    assert retries == {"502": 1}
    assert result.session.version == again.version == session.version + 1


def test_session_requests_carry_the_session_for_the_router(gateway):
    completion = calls.Call("POST", "/v1/completions", {"prompt": "x", "session_id": SESSION_ID})
    assert completion.request_headers()[calls.SESSION_HEADER] == SESSION_ID
    response = calls.Call(
        "POST", "/v1/responses", {"input": "x", "previous_response_id": f"resp_{SESSION_ID}_7"}
    )
    assert response.request_headers()[calls.SESSION_HEADER] == SESSION_ID
    for body in (None, {"prompt": "x"}, {"session_id": "a b"}, {"previous_response_id": "resp_short"}):
        assert calls.SESSION_HEADER not in calls.Call("POST", "/v1/completions", body).request_headers()
    # Routes with the id in the path carry it too, for routers that do not parse paths (endpoint pickers).
    step = calls.step_call(SESSION_ID, "append", {"text": "x"}, None)
    assert step.request_headers()[calls.SESSION_HEADER] == SESSION_ID
    assert calls.session_call("GET", SESSION_ID).request_headers()[calls.SESSION_HEADER] == SESSION_ID
    for call in (calls.Call("GET", "/v1/sessions"), operations.score("x").call):
        assert calls.SESSION_HEADER not in call.request_headers()

    # On the wire, through the SDK's transport, to a real server.
    with Client(gateway.url, api_key=API_KEY) as client:
        session = client.create_session(text="Routed by")
        body = {"model": client.models()[0].id, "prompt": " body", "session_id": session.id, "max_tokens": 2}
        answer = client.transport.run(
            operations.json_answer(
                calls.Call("POST", "/v1/completions", body, idempotency_key="route-1"), dict
            )
        )
        assert answer["choices"][0]["text"] is not None
    ((_, _, headers),) = gateway.requests_to("/v1/completions")
    assert headers["x-txl-session"] == session.id
