"""The code samples of docs/*.md run, as written, against a live server, so that the docs cannot drift from the
code.

Every fenced block in Python (`python`), shell (`bash`, `sh`) or a terminal session (`console`: its `$ ` lines)
runs, in the order of the page: the Python blocks of a page share one namespace (a later sample uses what an
earlier one made), each shell block runs in `bash -euo pipefail` where `curl` fails on an HTTP error. A block that
cannot run here says so on the line before its fence, with the reason:

    <!-- docs-test: skip (starts a server of its own) -->

Blocks in other languages (`json`, `text`, none) show data or output and are not run.

Two servers, two runs:

- Every page, against the server exactly as the README starts it (`bash scripts/serve.sh`: the bundled model, its
  own chat template, no API key; tests/helpers/readme_server.py), in the environment the README's set-up makes
  (the samples import nothing it does not install, or their page says what to install first). The reader has
  `TXL_URL` set to it and no key (`TXL_API_KEY` empty).
- docs/clients.md and docs/api.md, quickly, against a server that needs an API key (`$TXL_API_KEY`), serving a
  tiny model under the bundled model's name with the `transcript` chat template.

The samples see what a reader has after "Connecting": text files to read (`book.txt`, `moby.txt`,
`chapter1.txt`, `chapter2.txt`) in the working directory, and, in shell blocks, a fresh session's id in
`$SESSION`. Shell blocks run in a fresh shell where the project's environment is active, as the README says
(`source .venv/bin/activate`; tests/helpers/fresh_shell.py), and nothing else of the test's environment: so `txl`
and `python` are the environment's, found as a reader finds them.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from txl_client import Client

from tests.clients.conftest import server_settings
from tests.helpers.fresh_shell import fresh_shell, needs_a_venv
from tests.helpers.live_server import LiveServer
from tests.helpers.readme_server import ReadmeServer

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md"))
KEYED_PAGES = ["docs/clients.md", "docs/api.md"]
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
def keyed_server(tiny_model_dir, redis_server):
    # 128-token segments: the tiny model reads the samples' longer texts in a few seconds.
    settings = server_settings(
        tiny_model_dir, redis_server.url, api_keys=API_KEY, model_id="txl-books-byte",
        chat_template="transcript", segment_len=128,
    )  # fmt: skip
    with LiveServer(settings) as live:
        yield live


@pytest.fixture(scope="module")
def readme_server(tmp_path_factory):
    data = tmp_path_factory.mktemp("readme-server")
    with ReadmeServer(data / "data", data / "server.log") as live:
        yield live


def texts(directory: Path) -> None:
    """The texts the samples read."""
    moby = (BOOK / "melville-moby_dick.txt").read_text(encoding="utf-8")
    (directory / "moby.txt").write_text(moby[:3000], encoding="utf-8")
    (directory / "book.txt").write_text((BOOK / "austen-persuasion.txt").read_text(encoding="utf-8")[:2000])
    (directory / "chapter1.txt").write_text(moby[3000:4500], encoding="utf-8")
    (directory / "chapter2.txt").write_text(moby[4500:6000], encoding="utf-8")


def reader(monkeypatch, directory: Path, url: str, key: str) -> Path:
    """The reader's directory and environment: the server's address and key (empty: none), and texts to read."""
    texts(directory)
    monkeypatch.setenv("TXL_URL", url)
    monkeypatch.setenv("TXL_API_KEY", key)
    monkeypatch.chdir(directory)
    return directory


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


def run_page(page: str, workdir: Path, *, least: int = 1) -> None:
    """The page's runnable samples, in order; at least `least` of them."""
    ran = [s for s in samples(page) if s.skip is None]
    assert len(ran) >= least, f"{page}: only {len(ran)} runnable samples found"
    namespace: dict = {"__name__": "__docs__"}
    for sample in ran:
        started = time.monotonic()
        if sample.language == "python":
            run_python(sample, namespace)
        else:
            run_shell(sample, workdir)
        print(f"{sample.where}: {time.monotonic() - started:.1f} s")


@needs_a_venv
def test_every_sample_runs_against_the_server_the_readme_starts(readme_server, tmp_path, monkeypatch):
    workdir = reader(monkeypatch, tmp_path, readme_server.url, "")
    for page in PAGES:
        run_page(page, workdir, least=0)
    with httpx.Client(base_url=readme_server.url) as client:
        model = client.get("/v1/models").json()["data"][0]
    assert model["chat_template"] == {"format": "{Role}: {content}\n", "source": "model"}  # the model's own
    assert model["bundled"] is True  # the playground says what the model is


@needs_a_venv
@pytest.mark.parametrize("page", KEYED_PAGES)
def test_the_samples_of_a_page_run_against_a_server_with_an_api_key(
    page, keyed_server, tmp_path, monkeypatch
):
    run_page(page, reader(monkeypatch, tmp_path, keyed_server.url, API_KEY), least=5)


def test_the_samples_import_what_the_readme_set_up_installs_or_their_page_says_what_to_install():
    """A sample that imports a package the README's set-up does not install (`bash scripts/serve.sh`: the server,
    the client and the `samples` extra) runs only after its page says `pip install` it."""
    provided = readme_distributions()
    distributions = importlib.metadata.packages_distributions()
    for page in PAGES:
        text = (REPO / page).read_text(encoding="utf-8")
        for sample in samples(page):
            for module in imported_modules(sample):
                if module in sys.stdlib_module_names:
                    continue
                names = {canonical(d) for d in distributions.get(module, [module])}
                said = text[: text.find(sample.code.split("\n", 1)[0])]
                assert names & provided or any(f"pip install {n}" in said for n in names), (
                    f"{sample.where} imports {module} ({', '.join(sorted(names))}), which the README's set-up does "
                    "not install: install it with the set-up (the samples extra) or say on the page to install it"
                )


def test_every_curl_in_the_samples_is_quiet():
    """`curl` without `-s` draws its progress meter on the terminal between the JSON it prints."""
    for page in [*PAGES, "README.md"]:
        for sample in samples(page):
            for command in re.finditer(r"(?:^|[|;&(]\s*|\s)curl\s+([^\n]*)", sample.code):
                flags = command.group(1)
                assert re.search(r"(^|\s)-[A-Za-z]*s[A-Za-z]*\b|--silent", flags), (
                    f"{sample.where}: curl {flags}"
                )


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def readme_distributions() -> set[str]:
    """What `bash scripts/serve.sh` installs by name: the project, its dependencies and the server and samples
    extras, and the client with its dependencies (scripts/install.sh)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    client = tomllib.loads((REPO / "clients" / "python" / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    requirements = [*project["dependencies"], *extras["server"], *extras["samples"], *client["dependencies"]]
    names = {project["name"], client["name"]}
    names |= {re.match(r"[A-Za-z0-9_.-]+", r).group(0) for r in requirements}
    return {canonical(n) for n in names}


def imported_modules(sample: Sample) -> set[str]:
    """The top-level modules a sample imports: a Python block's, and a shell block's `python -c` programs'."""
    if sample.language == "python":
        programs = [sample.code]
    else:
        programs = [m.group(2) for m in re.finditer(r"python3? -c (['\"])(.*?)\1", sample.code)]
    found = set()
    for program in programs:
        for node in ast.walk(ast.parse(program)):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
    return found


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
