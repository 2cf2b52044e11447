"""docs/architecture.md follows a request through the code by module path: every path it names exists, and every
module of the request path (route to kernel) is named, so the page cannot drift from the tree unnoticed."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "architecture.md"
ROOTS = [REPO, REPO / "server", REPO / "server" / "txl_server", REPO / "model", REPO / "clients" / "python"]
# The modules a request crosses, in the page's reading order.
REQUEST_PATH = [
    "api/sessions/router.py",
    "api/sessions/serving.py",
    "api/shared/event_stream.py",
    "sessions/service.py",
    "sessions/step.py",
    "sessions/placement.py",
    "engine/jobs.py",
    "engine/worker.py",
    "engine/scheduler.py",
    "engine/runner.py",
    "engine/graphs.py",
    "engine/outputs.py",
    "txl/model.py",
    "txl/paged/step.py",
    "txl/attention.py",
    "txl/kernels/",
]


def named_paths(text: str) -> set[str]:
    """Paths with a folder in them, as the page writes them (`engine/worker.py`, `txl/kernels/`); not a URL's
    (`/v1/sessions/...`)."""
    return set(re.findall(r"(?<![/\w.])[A-Za-z_][\w/]*/[\w/]*(?:\.py|\.c|/)", text))


def exists(path: str) -> bool:
    return any((root / path).exists() for root in ROOTS)


def test_every_path_the_page_names_exists():
    missing = sorted(p for p in named_paths(PAGE.read_text()) if not exists(p))
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_the_page_names_every_module_of_the_request_path_in_order():
    text = PAGE.read_text()
    positions = [text.find(path) for path in REQUEST_PATH]
    assert -1 not in positions, [p for p, at in zip(REQUEST_PATH, positions, strict=True) if at == -1]
