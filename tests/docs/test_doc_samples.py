"""The code samples of docs/clients.md and docs/api.md run, as written, against a live server, so that the docs
cannot drift from the code.

Every fenced block in Python (`python`), shell (`bash`, `sh`) or a terminal session (`console`: its `$ ` lines)
runs, in the order of the page: the Python blocks of a page share one namespace (a later sample uses what an
earlier one made), each shell block runs in `bash -euo pipefail` where `curl` fails on an HTTP error. A block that
cannot run here says so on the line before its fence, with the reason:

    <!-- docs-test: skip (starts a server of its own) -->

Blocks in other languages (`json`, `text`, none) show data or output and are not run.

The samples see what a reader has after "Connecting": a server at `$TXL_URL` with the key `$TXL_API_KEY` (serving
a tiny model under the bundled model's name, with the `transcript` chat template), text files to read
(`book.txt`, `moby.txt`, `chapter1.txt`, `chapter2.txt`) in the working directory, and, in shell blocks, a fresh
session's id in `$SESSION`. Shell blocks run in a fresh shell where the project's environment is active, as the
README says (`source .venv/bin/activate`; tests/helpers/fresh_shell.py), and nothing else of the test's
environment: so `txl` and `python` are the environment's, found as a reader finds them.
"""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from txl_client import Client

from tests.clients.conftest import server_settings
from tests.helpers.fresh_shell import fresh_shell, needs_a_venv
from tests.helpers.live_server import LiveServer

REPO = Path(__file__).resolve().parents[2]
PAGES = ["docs/clients.md", "docs/api.md"]
API_KEY = "docs-sample-key"
RUN = {"python", "bash", "sh", "console"}
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<language>[\w-]*)\s*$")
SKIP = re.compile(r"^\s*<!--\s*docs-test:\s*skip\s*\((?P<reason>[^)]+)\)\s*-->\s*$")
BOOK = REPO / "tests" / "data" / "gutenberg"
# `curl` as the samples mean it: quiet, but failing (with the server's answer) on an HTTP error.
SHELL_PREAMBLE = 'curl() { command curl --silent --show-error --fail-with-body "$@"; }\n'


@dataclass(frozen=True)
class Sample:
    page: str
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    skip: str | None  # the reason, for a block marked as not run

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def samples(page: str) -> list[Sample]:
    """The page's fenced blocks in the languages that run, in order."""
    lines = (REPO / page).read_text(encoding="utf-8").splitlines()
    found: list[Sample] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, language = opening["indent"], opening["language"]
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        if language in RUN:
            code = "\n".join(line.removeprefix(indent) for line in lines[i + 1 : end]) + "\n"
            before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            marker = SKIP.match(before)
            found.append(Sample(page, i + 1, language, code, marker["reason"] if marker else None))
        i = end + 1
    return found


@pytest.fixture(scope="module")
def server(tiny_model_dir, redis_server):
    # 128-token segments: the tiny model reads the samples' longer texts in a few seconds.
    settings = server_settings(
        tiny_model_dir, redis_server.url, api_keys=API_KEY, model_id="txl-books-byte",
        chat_template="transcript", segment_len=128,
    )  # fmt: skip
    with LiveServer(settings) as live:
        yield live


@pytest.fixture
def workdir(tmp_path, server, monkeypatch) -> Path:
    """The reader's directory and environment: the server's address and key, and texts to read."""
    moby = (BOOK / "melville-moby_dick.txt").read_text(encoding="utf-8")
    (tmp_path / "moby.txt").write_text(moby[:3000], encoding="utf-8")
    (tmp_path / "book.txt").write_text((BOOK / "austen-persuasion.txt").read_text(encoding="utf-8")[:2000])
    (tmp_path / "chapter1.txt").write_text(moby[3000:4500], encoding="utf-8")
    (tmp_path / "chapter2.txt").write_text(moby[4500:6000], encoding="utf-8")
    monkeypatch.setenv("TXL_URL", server.url)
    monkeypatch.setenv("TXL_API_KEY", API_KEY)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_python(sample: Sample, namespace: dict) -> None:
    exec(compile(sample.code, sample.where, "exec"), namespace)


def run_shell(sample: Sample, workdir: Path) -> None:
    if sample.language == "console":
        script = "\n".join(line[2:] for line in sample.code.splitlines() if line.startswith("$ ")) + "\n"
    else:
        script = sample.code
    with Client() as client:  # a fresh session for the sample to use as $SESSION
        session = client.create_session(text="Call me Ishmael.")
    reader = {
        "TXL_URL": os.environ["TXL_URL"],
        "TXL_API_KEY": os.environ["TXL_API_KEY"],
        "SESSION": session.id,
    }
    result = fresh_shell(SHELL_PREAMBLE + script, cwd=workdir, home=workdir, env=reader)
    assert result.returncode == 0, (
        f"{sample.where}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    )
    assert "Traceback" not in result.stderr, f"{sample.where}:\n{result.stderr}"


@needs_a_venv
@pytest.mark.parametrize("page", PAGES)
def test_the_samples_of_a_page_run_against_a_live_server(page, workdir):
    found = samples(page)
    ran = [s for s in found if s.skip is None]
    assert len(ran) >= 5, f"{page}: only {len(ran)} runnable samples found"
    namespace: dict = {"__name__": "__docs__"}
    for sample in ran:
        started = time.monotonic()
        if sample.language == "python":
            run_python(sample, namespace)
        else:
            run_shell(sample, workdir)
        print(f"{sample.where}: {time.monotonic() - started:.1f} s")


def test_the_extractor_finds_fences_markers_and_indented_blocks(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n```python\nx = 1\n```\n\n<!-- docs-test: skip (needs a GPU) -->\n```bash\nnvidia-smi\n```\n\n"
        "- item:\n\n  ```console\n  $ txl --version\n  txl 0.1.0\n  ```\n\n```json\n{}\n```\n",
        encoding="utf-8",
    )
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    found = samples("page.md")
    assert [(s.language, s.line, s.skip) for s in found] == [
        ("python", 3, None), ("bash", 8, "needs a GPU"), ("console", 14, None)
    ]  # fmt: skip
    assert found[2].code == "$ txl --version\ntxl 0.1.0\n"
