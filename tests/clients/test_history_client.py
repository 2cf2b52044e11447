"""Session history from the clients, against a real server: versions, rewind and fork at a version through the
sync and async SDKs and the `txl` command line."""

from __future__ import annotations

import json

import pytest
from txl_client import AsyncClient, Client, NotFound, SessionVersion, VersionNotFound

from .conftest import API_KEY
from .test_cli import run

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def client(server):
    with Client(server.url, API_KEY) as client:
        yield client


def _greedy(client: Client, session_id: str, n: int = 6) -> str:
    return client.generate(session_id, max_tokens=n, temperature=0).text


def test_versions_rewind_and_fork_at_a_version_continue_exactly(client):
    session = client.create_session(text="The river ran ")
    appended = client.append(session.id, "past the mill").session
    after_append = _greedy(client, session.id)

    versions = client.versions(session.id)
    assert all(isinstance(v, SessionVersion) for v in versions)
    assert [v.kind for v in versions] == ["generate", "append", "create"]
    assert [v.version for v in versions] == sorted((v.version for v in versions), reverse=True)
    assert versions[1].version == appended.version and versions[1].tokens == appended.tokens
    assert versions[1].text_tail.endswith("past the mill")

    rewound = client.rewind(session.id, appended.version)
    assert rewound.version == versions[0].version + 1  # a rewind is a step of its own
    assert rewound.tokens == appended.tokens
    assert _greedy(client, session.id) == after_append  # as if the generation had never happened
    assert client.versions(session.id)[1].kind == "rewind"

    fork = client.fork_session(session.id, version=appended.version)
    assert fork.id != session.id and fork.tokens == appended.tokens
    assert _greedy(client, fork.id) == after_append
    fresh = client.create_session(text="The river ran past the mill")
    assert _greedy(client, fresh.id) == after_append  # a state is a function of its text


def test_a_version_not_kept_is_a_typed_error_that_names_the_oldest(client):
    session = client.create_session(text="abc")
    with pytest.raises(VersionNotFound) as raised:
        client.rewind(session.id, 999)
    error = raised.value
    assert isinstance(error, NotFound) and error.status == 404 and error.code == "version_not_found"
    assert "1" in error.message  # the oldest kept version
    with pytest.raises(VersionNotFound):
        client.fork_session(session.id, version=999)
    assert client.get_session(session.id).version == session.version  # nothing changed


def test_a_retried_rewind_steps_once(client):
    session = client.create_session(text="abc")
    client.append(session.id, "def")
    first = client.rewind(session.id, session.version, idempotency_key="rewind-once-test")
    again = client.rewind(session.id, session.version, idempotency_key="rewind-once-test")
    assert again.version == first.version
    assert client.get_session(session.id).version == first.version


async def test_the_async_client_lists_rewinds_and_forks(server):
    async with AsyncClient(server.url, API_KEY) as client:
        session = await client.create_session(text="Once upon ")
        await client.append(session.id, "a time")
        versions = await client.versions(session.id)
        assert [v.kind for v in versions] == ["append", "create"]
        rewound = await client.rewind(session.id, session.version)
        assert rewound.tokens == session.tokens and rewound.version == versions[0].version + 1
        fork = await client.fork_session(session.id, version=versions[0].version)
        assert fork.tokens == versions[0].tokens
        with pytest.raises(VersionNotFound):
            await client.rewind(session.id, 999)


def test_the_command_line_shows_history_rewinds_and_forks(client, server):
    env = {"TXL_URL": server.url, "TXL_API_KEY": API_KEY}
    session = client.create_session(text="first line\n")
    client.append(session.id, "second\tline")

    table = run("sessions", "history", session.id, env=env)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["version", "kind", "tokens"]
    assert lines[1].split()[1] == "append" and lines[2].split()[1] == "create"
    assert "second\\tline" in lines[1]  # control characters shown escaped, one line per version

    listed = json.loads(run("sessions", "history", session.id, "--json", env=env).stdout)
    assert [v["kind"] for v in listed] == ["append", "create"]

    rewound = run("sessions", "rewind", session.id, str(session.version), env=env)
    assert rewound.returncode == 0, rewound.stderr
    assert f"rewound to version {session.version}" in rewound.stdout
    assert client.get_session(session.id).tokens == session.tokens

    forked = run("sessions", "fork", session.id, "--version", str(listed[0]["version"]), env=env)
    assert forked.returncode == 0, forked.stderr
    assert client.get_session(forked.stdout.strip()).tokens == listed[0]["tokens"]

    missing = run("sessions", "rewind", session.id, "999", env=env)
    assert missing.returncode == 1 and "the oldest kept version is 1" in missing.stderr
