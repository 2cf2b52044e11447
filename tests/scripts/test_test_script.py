"""scripts/test.sh chooses the suite's stage (tests/stages.py): the first by default (the README's command), the
second or both with TXL_TEST_STAGE; tests or a marker named on its command line run whatever the stage."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def selection(*args: str, stage: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TXL_TEST_STAGE"}
    if stage is not None:
        env["TXL_TEST_STAGE"] = stage
    script = 'source scripts/test.sh && stage_selection "$@"'
    return subprocess.run(
        ["bash", "-c", script, "test.sh", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize(
    ("stage", "args", "selected"),
    [
        (None, [], ["-m", "not slow"]),
        ("first", ["-k", "sessions"], ["-m", "not slow"]),
        ("slow", [], ["-m", "slow"]),
        ("all", [], []),
        (None, ["tests/reliability"], []),
        (
            None,
            [
                "tests/server/test_port.py::test_bound_sockets_refuse_a_second_binder_and_free_the_port_when_closed"
            ],
            [],
        ),
        ("slow", ["-m", "docker"], []),
        (None, ["-moracle"], []),
    ],
)
def test_the_stage_selects_unless_the_arguments_choose(stage, args, selected):
    done = selection(*args, stage=stage)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == selected


def test_an_unknown_stage_is_refused():
    done = selection(stage="fast")
    assert done.returncode == 2 and "TXL_TEST_STAGE must be first, slow or all" in done.stderr
