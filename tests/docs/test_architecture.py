"""docs/architecture.md follows a request through the code by module path: every path it names exists, every module
of the request path (route to kernel) is named, and its walk through a GPU decoding step names every module the
step crosses, from the worker to each Triton kernel, in order, and every Triton kernel there is, so the page
cannot drift from the tree unnoticed."""

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


# The GPU decoding step's walk-through, and the modules a decoding iteration crosses in its reading order.
GPU_STEP = "## The GPU decode step, end to end"
DECODE_PATH = [
    "engine/worker.py",
    "engine/runner.py",
    "engine/graphs.py",
    "txl/paged/decode_plan.py",
    "txl/paged/step.py",
    "txl/paged/staging.py",
    "engine/launched.py",
    "txl/adaptive.py",
    "txl/kernels/triton/softmax.py",
    "txl/sampling.py",
    "txl/kernels/triton/sampling.py",
    "txl/model.py",
    "txl/kernels/triton/embedding.py",
    "txl/paged/gpu_decode.py",
    "txl/paged/layer_weights.py",
    "txl/kernels/triton/attention.py",
    "txl/kernels/decode_rows.py",
    "txl/kernels/triton/rows_linear.py",
    "txl/kernels/triton/layer_norm.py",
    "txl/kernels/triton/common.py",
    "txl/kernels/triton/decode.py",
    "engine/selfcheck.py",
]
TRITON_KERNELS = REPO / "model" / "txl" / "kernels" / "triton"


def section(text: str, title: str) -> str:
    """The page's section under `title`, up to the next one."""
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start : end if end != -1 else len(text)]


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


def test_the_gpu_decode_step_names_every_module_it_crosses_in_order():
    walk = section(PAGE.read_text(), GPU_STEP)
    positions = [walk.find(path) for path in DECODE_PATH]
    assert -1 not in positions, [p for p, at in zip(DECODE_PATH, positions, strict=True) if at == -1]
    assert positions == sorted(positions), [p for _, p in sorted(zip(positions, DECODE_PATH, strict=True))]


def test_every_triton_kernel_is_in_the_gpu_decode_step():
    """A kernel added to txl/kernels/triton/ fails here until the walk-through says what it reads and writes."""
    walk = section(PAGE.read_text(), GPU_STEP)
    kernels = sorted(
        f"txl/kernels/triton/{p.name}" for p in TRITON_KERNELS.glob("*.py") if p.name != "__init__.py"
    )
    assert kernels, "no Triton kernels found"
    assert not [k for k in kernels if k not in walk], [k for k in kernels if k not in walk]


def test_the_page_names_where_the_decode_path_is_chosen():
    text = PAGE.read_text()
    for path in ("txl/kernels/path.py", "engine/decode_path.py", "engine/selfcheck.py", "txl/kernels/cpu/"):
        assert path in text, path
