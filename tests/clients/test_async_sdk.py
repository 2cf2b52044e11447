"""The asyncio SDK against a real server: the same results, streams, errors and retries as the sync client."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from txl_client import AsyncClient, AsyncGenerateStream, InvalidRequest, NotFound, ScoreResult, Unauthorized

from .conftest import API_KEY
from .proxy import DroppingProxy

CHAUCER = "Whan that Aprille with his shoures soote the droghte of March hath perced to the roote. " * 4


def coroutine_recorder() -> tuple[list[tuple[int, int]], Callable[[int, int], Awaitable[None]]]:
    """A progress callback that is a coroutine function, and the (done, total) pairs it was called with."""
    calls: list[tuple[int, int]] = []

    async def on_progress(done: int, total: int) -> None:
        await asyncio.sleep(0)
        calls.append((done, total))

    return calls, on_progress


async def test_async_lifecycle_streaming_and_errors(server):
    async with AsyncClient(server.url, API_KEY) as client:
        base = await client.create_session(text="The whale", metadata={"async": True})
        assert base.metadata == {"async": True} and (await client.get_session(base.id)) == base
        one, two = await asyncio.gather(client.fork_session(base.id), client.fork_session(base.id))
        plain, stream = await asyncio.gather(
            client.generate(one.id, " is", max_tokens=20, temperature=0),
            client.generate(two.id, " is", max_tokens=20, temperature=0, stream=True),
        )
        assert isinstance(stream, AsyncGenerateStream)
        async with stream:
            texts = [token.text async for token in stream]
        assert len(texts) == 20 and "".join(texts) == stream.result.text == plain.text
        assert stream.result.session.version == plain.session.version == 2

        appended = await client.append(one.id, " again")
        assert appended.session.version == 3 and appended.tokens == 6
        assert base.id in {s.id for s in await client.list_sessions()}
        await client.delete_session(base.id)
        with pytest.raises(NotFound):
            await client.get_session(base.id)
        with pytest.raises(InvalidRequest) as bad:
            await client.generate(one.id, temperature=-1)
        assert bad.value.param == "temperature"
        assert [m.id for m in await client.models()] == ["tiny-byte"]
        assert (await client.health()).status == "ok"
    async with AsyncClient(server.url, "wrong") as wrong:
        with pytest.raises(Unauthorized):
            await wrong.list_sessions()


async def test_async_score_progress_accepts_coroutine_callbacks(server):
    text = CHAUCER
    calls, on_progress = coroutine_recorder()
    async with AsyncClient(server.url, API_KEY) as client:
        result = await client.score(text, token_logprobs=True, on_progress=on_progress)
        plain = await client.score(text)
    assert isinstance(result, ScoreResult) and result.tokens == len(text) == len(result.token_logprobs)
    assert result.logprob == pytest.approx(plain.logprob, rel=1e-6)
    assert calls and calls[-1] == (len(text), len(text))


async def test_async_lost_response_is_retried_once_with_the_same_key(server):
    with DroppingProxy(server.port) as proxy:
        async with AsyncClient(proxy.url, API_KEY) as client:
            session = await client.create_session(text="async once")
            proxy.drop("/generate")
            stream = await client.generate(session.id, max_tokens=5, stream=True)
            result = await stream.finish()
            sent = proxy.requests_to("/generate")
            assert [s.dropped for s in sent] == [True, False]
            assert sent[0].headers["idempotency-key"] == sent[1].headers["idempotency-key"]
            assert result.session.version == session.version + 1
            assert (await client.get_session(session.id)).version == session.version + 1


async def test_async_generate_reports_a_long_prompts_progress_to_a_coroutine(server):
    prompt = CHAUCER
    calls, on_progress = coroutine_recorder()
    async with AsyncClient(server.url, API_KEY) as client:
        one, two = (await client.create_session(), await client.create_session())
        result = await client.generate(one.id, prompt, max_tokens=6, temperature=0, on_progress=on_progress)
        plain = await client.generate(two.id, prompt, max_tokens=6, temperature=0)
    assert calls and calls[-1] == (len(prompt), len(prompt))
    assert result.text == plain.text and result.usage == plain.usage
