"""Preloaded memories from the SDK (sync and async) and the `txl` command line, against a real server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from txl_client import AsyncClient, Client, Memory, NotFound

from .conftest import API_KEY
from .proxy import DroppingProxy
from .test_cli import TXL, run

DOC = "Call me Ishmael. Some years ago, never mind how long precisely, I went to sea. " * 12


@pytest.fixture
def client(server):
    with Client(server.url, API_KEY) as client:
        yield client


def test_memories_are_created_with_progress_used_changed_and_deleted(client):
    seen: list[tuple[int, int]] = []
    memory = client.memories.create(
        DOC, name="moby", metadata={"k": 1}, on_progress=lambda d, t: seen.append((d, t))
    )
    assert isinstance(memory, Memory) and memory.id.startswith("mem_") and memory.tokens == len(DOC)
    assert seen and seen[-1] == (len(DOC), len(DOC))
    assert client.memories.get(memory.id) == memory and memory.id in {m.id for m in client.memories.list()}

    session = client.create_session(" Call me", memory=memory.id)
    assert session.tokens == len(DOC) + len(" Call me")
    reader = client.create_session(DOC + " Call me")
    expected = client.generate(reader.id, max_tokens=16, temperature=0).text
    assert client.generate(session.id, max_tokens=16, temperature=0).text == expected

    changed = client.memories.update(memory.id, ttl_seconds=5000, name=None)
    assert (
        changed.name is None
        and changed.metadata == {"k": 1}
        and changed.expires_at >= memory.created_at + 5000
    )
    client.memories.delete(memory.id)
    with pytest.raises(NotFound):
        client.memories.get(memory.id)
    assert client.generate(session.id, max_tokens=2).session.version == 3  # its session goes on


def test_a_lost_create_is_retried_with_its_key_and_makes_one_memory(server):
    with DroppingProxy(server.port) as proxy, Client(proxy.url, API_KEY) as client:
        before = {m.id for m in client.memories.list()}
        for on_progress in (None, lambda done, total: None):
            proxy.drop("/v1/memories")
            memory = client.memories.create("a short document", on_progress=on_progress)
            sent = [s for s in proxy.requests_to("/v1/memories") if s.method == "POST"][-2:]
            assert [s.dropped for s in sent] == [True, False]
            assert sent[0].headers["idempotency-key"] == sent[1].headers["idempotency-key"]
            before |= {memory.id}
            assert {m.id for m in client.memories.list()} == before


async def test_async_memories(server):
    async with AsyncClient(server.url, API_KEY) as client:
        progress: list[int] = []

        async def report(done: int, total: int) -> None:
            progress.append(done)

        memory = await client.memories.create(DOC, on_progress=report, ttl_seconds=600)
        assert progress[-1] == len(DOC) and memory.expires_at - memory.created_at in (600, 601)
        session = await client.create_session(memory=memory.id)
        assert session.tokens == len(DOC)
        assert (await client.memories.update(memory.id, metadata={"a": 2})).metadata == {"a": 2}
        assert memory.id in {m.id for m in await client.memories.list()}
        await client.memories.delete(memory.id)
        with pytest.raises(NotFound):
            await client.memories.get(memory.id)


@pytest.mark.skipif(not Path(TXL).exists(), reason="the txl console script is not installed")
def test_cli_adds_lists_uses_and_removes_a_memory(server, tmp_path, client):
    env = {"TXL_URL": server.url, "TXL_API_KEY": API_KEY}
    document = tmp_path / "moby.txt"
    document.write_text(DOC)
    added = run("memories", "add", str(document), "--ttl", "900", env=env)
    assert added.returncode == 0, added.stderr
    memory_id = added.stdout.strip()
    assert (
        memory_id.startswith("mem_") and f"memory {memory_id} (moby.txt): {len(DOC)} tokens" in added.stderr
    )

    listed = run("memories", "ls", env=env)
    assert memory_id in listed.stdout and "moby.txt" in listed.stdout
    shown = json.loads(run("memories", "show", memory_id, env=env).stdout)
    assert shown["name"] == "moby.txt" and shown["expires_at"] - shown["created_at"] in (900, 901)

    new = run("sessions", "new", " Call me", "--memory", memory_id, env=env)
    assert new.returncode == 0, new.stderr
    session = client.get_session(new.stdout.strip())
    assert session.tokens == len(DOC) + len(" Call me")
    as_json = json.loads(run("sessions", "new", "--memory", memory_id, "--json", env=env).stdout)
    assert as_json["tokens"] == len(DOC)

    removed = run("memories", "rm", memory_id, env=env)
    assert removed.returncode == 0 and f"deleted {memory_id}" in removed.stdout
    gone = run("memories", "show", memory_id, env=env)
    assert gone.returncode == 1 and "404 not_found" in gone.stderr
    assert run("sessions", "new", "--memory", memory_id, env=env).returncode == 1
    assert run("memories", env=env).returncode == 2
