"""What a decoding iteration through the graphs asks of a GPU, counted on the CPU (tests/server/engine/dispatch_counts.py):
nothing inside the captured body waits for the host, the iteration waits for the device once (reading its
tokens back), and what runs outside the graph does not grow with the rows."""

from __future__ import annotations

import pytest

from .dispatch_counts import one_iteration


@pytest.mark.parametrize("rows", [1, 64])
def test_a_decoding_iteration_waits_once_and_launches_a_bounded_few_kernels_outside_its_graph(rows):
    counts = one_iteration(rows)
    outside = counts["before"] + counts["after"]
    assert counts["body"]["sync"] == 0 and counts["body"]["h2d"] == 0
    assert outside["sync"] == 1 and counts["after"]["d2h"] == 1
    assert outside["launch"] <= 10 and outside["h2d"] <= 4


def test_what_runs_outside_the_graph_does_not_grow_with_the_rows():
    small, large = one_iteration(2), one_iteration(48)
    for phase in ("before", "after"):
        assert large[phase] == small[phase]
