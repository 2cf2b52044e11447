"""Every test tests/stages.py moves to the second stage exists: a renamed test would otherwise silently come back
to the first stage (or, renamed again, leave both)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.stages import SECOND_STAGE, stage_of

REPO = Path(__file__).resolve().parents[1]


def test_every_second_stage_entry_names_a_test_that_exists():
    for nodeid in SECOND_STAGE:
        path, _, name = nodeid.partition("::")
        function = name.split("[", 1)[0]
        source = (REPO / path).read_text(encoding="utf-8")
        assert re.search(rf"^(async )?def {function}\(", source, re.MULTILINE), nodeid
        if "[" in name:  # one case of a parametrised test: its parameter is in the file
            case = name.split("[", 1)[1].rstrip("]")
            assert f'"{case}"' in source, nodeid


def test_a_parametrised_test_is_found_by_its_name_or_its_case():
    restart = "tests/server/sessions/test_restart.py::test_every_listed_session_steps_after_a_graceful_restart_and_a_kill"
    assert (
        stage_of(f"{restart}[evict]") and stage_of(f"{restart}[none]") and not stage_of(f"{restart}[always]")
    )
    decode = "tests/model/test_triton_decode.py::test_triton_decode_kernel_equals_the_torch_path_under_the_interpreter"
    assert stage_of(f"{decode}[True]") == stage_of(f"{decode}[False]") is not None
