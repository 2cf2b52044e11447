"""Test code run under Triton's interpreter, which runs the GPU kernels on the CPU: in a process of its own,
because Triton reads TRITON_INTERPRET when it is imported."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers.server_process import REPO


def run_interpreted(
    module: str, *arguments: str, timeout: float, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """`python -m <module> <arguments>` from the repository's root with TRITON_INTERPRET=1; its output as text."""
    return subprocess.run(
        [sys.executable, "-m", module, *arguments],
        cwd=REPO,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    )
