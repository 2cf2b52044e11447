"""A shell as a reader opens one: nothing inherited but a minimal PATH, HOME and a locale, and (where the README
asks for it) the project's environment activated with `source .venv/bin/activate`.

The environment activated is the one running the tests (`sys.prefix`: `./.venv` under `scripts/test.sh`). A
PYTHONPATH set for the test run is kept, and only it: a checkout tested against another checkout's environment
(a worktree) must import its own code, as `.venv`'s editable install makes a clone import its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

VENV = Path(sys.prefix)
MINIMAL_PATH = "/usr/local/bin:/usr/bin:/bin"


def in_a_venv() -> bool:
    return sys.prefix != sys.base_prefix and (VENV / "bin" / "activate").exists()


needs_a_venv = pytest.mark.skipif(
    not in_a_venv(), reason="the tests run outside a virtual environment: nothing to activate"
)


def fresh_shell(
    script: str,
    *,
    cwd: Path,
    home: Path,
    activate: bool = True,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Runs `script` in `bash -euo pipefail` with a fresh environment (plus `env`), after activating the project's
    environment if `activate`."""
    environment = {"HOME": str(home), "PATH": MINIMAL_PATH, "LANG": "C.UTF-8", **(env or {})}
    if os.environ.get("PYTHONPATH"):
        environment["PYTHONPATH"] = os.environ["PYTHONPATH"]
    prologue = f"source {VENV}/bin/activate\n" if activate else ""
    return subprocess.run(
        ["/bin/bash", "-euo", "pipefail", "-c", prologue + script],
        cwd=cwd, env=environment, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
