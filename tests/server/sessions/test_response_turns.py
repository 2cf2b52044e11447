"""The session layer under the Responses API: its services built once by the runtime, beside the session service,
their background jobs stopped with it; a first turn's private session (read through the prefix cache, its first
version not stored: the turn's first token does not wait for Redis) whose commit stores everything; a
conversation's items and turns in Redis; background jobs interrupted by a stopped replica."""

from __future__ import annotations

import asyncio

from txl.sampling import SamplingParams
from txl_server.runtime import Runtime
from txl_server.sessions.background import BackgroundJobs
from txl_server.sessions.store.conversations import ConversationStore
from txl_server.sessions.store.jobs import JobStore
from txl_server.settings import Persistence

from tests.helpers.runtimes import OWNER, generate, running

GREEDY = SamplingParams(temperature=0)


async def test_the_runtime_builds_the_responses_services_once_and_stops_their_jobs_first(make_settings):
    runtime = Runtime(make_settings())
    assert runtime.responses is None  # nothing is built before start-up
    await runtime.start()
    try:
        responses = runtime.responses
        assert responses is not None
        service = runtime.service
        assert responses.turns.service is service and responses.conversations.service is service
        assert responses.jobs.holder == runtime.replica.id  # its jobs are this process's
        assert responses.conversations.store.replica == runtime.replica.id
        ended = asyncio.Event()

        async def work() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                assert not service.worker.stopped  # the turn's work ends while the worker still serves it
                ended.set()
                raise

        responses.jobs.start("resp_x.2", work())
        await asyncio.sleep(0)
    finally:
        await runtime.stop()
    assert ended.is_set() and responses.jobs.stopping and not responses.jobs.tasks


async def test_a_private_session_waits_for_no_block_write_and_its_first_commit_stores_every_block(
    make_settings,
):
    async with running(make_settings(persistence=Persistence.ALWAYS)) as rt:
        service = rt.service
        text = "A first turn's prompt, read through the prefix cache."
        tokens = service.tokenizer.encode(text)
        meta, cached = await service.create_reading(OWNER, text, tokens)
        first = await service.store.load_version(
            meta.id
        )  # stored ahead of its blocks: an empty memory, the tokens
        assert cached == 0 and first.header["blocks"] == [] and first.replay == (service.start_id, *tokens)
        await service.persistence.settled(30)
        assert (await service.store.load_version(meta.id)).replay == first.replay  # no blocks before the step
        control = await service.create(OWNER, text=text)
        _, outcome = await generate(service, meta.id, sampling=GREEDY)
        _, expected = await generate(service, control.id, sampling=GREEDY)
        assert outcome.result.text == expected.result.text
        await service.persistence.settled(30)
        assert [v.version for v in await service.store.versions(meta.id)] == [1, 2]
        second = await service.store.load_version(meta.id)
        assert second.replay == () and second.header["fed"] == len(tokens) + 1 + len(outcome.result.token_ids)
        # The device forgets both: each continues from what Redis holds, alike.
        for session in (meta.id, control.id):
            service.placement.forget(session)
        appended = await service.append(OWNER, meta.id, " And then?")
        assert appended.logprob == (await service.append(OWNER, control.id, " And then?")).logprob
        _, cached_again = await service.create_reading(OWNER, text, service.tokenizer.encode(text))
        assert cached_again > 0  # the prefix cache served the same prompt's start


async def test_a_conversations_pending_items_and_turns_are_kept_in_redis(make_settings):
    async with running(make_settings(persistence=Persistence.ALWAYS)) as rt:
        assert rt.responses is not None
        conversations = rt.responses.conversations
        item = {
            "id": "msg_1",
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "x"}],
        }
        record = await conversations.create(OWNER, [item], {"k": "v"})
        found = await conversations.get(OWNER, record.id)
        assert found.pending == [item] and found.fed == 0 and found.metadata == {"k": "v"}
        async with conversations.turn(OWNER, record.id) as turn:
            await conversations.commit(
                turn, turn.meta.version + 1, [{**item, "id": "msg_2"}], messages=True, turn_end=True
            )
        found = await conversations.get(OWNER, record.id)
        assert found.fed == 2 and found.pending == [] and found.turn_end and found.version == 2
        assert await conversations.get(OWNER, record.id) is not None
        assert await ConversationStore(rt.service.store).find("someone-else", record.session_id) is None


async def test_a_job_whose_replica_is_gone_is_found_failed_with_its_reason(make_settings):
    async with running(make_settings()) as rt:
        store = JobStore(rt.service.store)
        jobs = BackgroundJobs(store, rt.service.stores.heartbeats, holder=rt.service.replica.id)
        response = {"id": "resp_x.2", "status": "in_progress", "error": None}
        await store.write("resp_x.2", response=response, owner=OWNER, holder="gone-host:1#dead")
        await store.write("resp_x.2", events=[{"type": "response.created", "sequence_number": 0}])
        job = await jobs.find(OWNER, "resp_x.2")
        assert (
            job is not None and job.status == "failed" and "interrupted" in job.response["error"]["message"]
        )
        events = await store.events("resp_x.2", 0)
        assert [e["type"] for e in events] == ["response.created", "error", "response.failed"]
        assert [e["sequence_number"] for e in events] == [0, 1, 2]
        assert await jobs.find("someone-else", "resp_x.2") is None
        # Kept about ten minutes after its last write (OpenAI's retention without `store`).
        ttl = await rt.service.store.redis.pttl(store.keys.job("resp_x.2"))
        assert 590_000 < ttl <= 600_000
