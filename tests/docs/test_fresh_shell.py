"""The README's commands, and the commands the docs name, as a newcomer runs them: from a fresh shell
(tests/helpers/fresh_shell.py), in the repository's root.

- The README's samples after its set-up (`curl` against the server it started) run as written, without the
  project's environment: only `localhost:8000` becomes this test's server and `SESSION_ID` the id the first
  command answered, as a reader would paste it. The set-up commands themselves are tested in tests/scripts.
- After the README's one `source .venv/bin/activate`, the commands the docs use are found and start:
  `txl` (docs/clients.md), `python -m txl_server` and its `check` (docs/server.md, docs/deploy.md),
  `python -m bench` (docs/benchmarks.md, which imports torch and the project).
  (docs/clients.md's and docs/api.md's samples run in full, the same way, in test_doc_samples.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.clients.conftest import server_settings
from tests.docs.test_doc_samples import samples
from tests.helpers.fresh_shell import fresh_shell, needs_a_venv
from tests.helpers.live_server import LiveServer

REPO = Path(__file__).resolve().parents[2]
SET_UP = ("bash scripts/serve.sh", "bash scripts/test.sh")


@pytest.fixture(scope="module")
def server(tiny_model_dir, redis_server):
    # As `bash scripts/serve.sh` starts it: no API keys, the bundled model's name.
    with LiveServer(server_settings(tiny_model_dir, redis_server.url, model_id="txl-books-byte")) as live:
        yield live


def test_the_readme_says_to_activate_the_environment_once():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert readme.count("source .venv/bin/activate") == 1
    set_up = [s.code.strip() for s in samples("README.md") if s.code.strip() in SET_UP]
    assert set_up == list(SET_UP)  # the two set-up commands, and only they, in that order


def test_the_readme_samples_run_as_written_from_a_fresh_shell(server, tmp_path):
    found = [s for s in samples("README.md") if s.code.strip() not in SET_UP]
    assert found, "the README has no sample beyond its set-up"
    address = server.url.removeprefix("http://")
    for sample in found:
        lines = sample.code.replace("localhost:8000", address).splitlines(keepends=True)
        # Line by line, as a reader pastes them: the id the create answered goes where the README says SESSION_ID.
        session_id = None
        for command in _commands(lines):
            if "SESSION_ID" in command:
                assert session_id is not None, f"{sample.where}: SESSION_ID before a session was made"
                command = command.replace("SESSION_ID", session_id)
            done = fresh_shell(command, cwd=REPO, home=tmp_path, activate=False)
            assert done.returncode == 0, f"{sample.where}: {command}\n{done.stdout}\n{done.stderr}"
            if done.stdout.startswith("{"):
                session_id = json.loads(done.stdout).get("id", session_id)
            elif "stream" in command:
                events = [line for line in done.stdout.splitlines() if line.startswith("data: ")]
                assert events[-1] == "data: [DONE]", done.stdout[-500:]
                assert json.loads(events[-2].removeprefix("data: "))["type"] == "done", done.stdout[-500:]
    assert session_id is not None


@needs_a_venv
def test_the_commands_the_docs_use_run_from_a_fresh_shell_once_activated(server, tmp_path):
    listed = fresh_shell(f"txl --url {server.url} sessions ls --json", cwd=REPO, home=tmp_path)
    assert listed.returncode == 0 and isinstance(json.loads(listed.stdout), list), listed.stderr
    # `python -m txl_server check` is the same entry point; `bench` imports torch and the project.
    for command in ("python -m txl_server --help", "python -m bench --help"):
        done = fresh_shell(command, cwd=REPO, home=tmp_path)
        assert done.returncode == 0 and "usage: python -m" in done.stdout, f"{command}\n{done.stderr}"


def _commands(lines: list[str]) -> list[str]:
    """Shell lines joined where they continue (a trailing backslash)."""
    commands, current = [], ""
    for line in lines:
        current += line
        if not line.rstrip("\n").endswith("\\"):
            if current.strip():
                commands.append(current)
            current = ""
    return commands
