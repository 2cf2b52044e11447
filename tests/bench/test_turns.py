"""`python -m bench turns`: the chained turns build the history that is resent, the faster of two rounds is
taken turn by turn, and the chart is drawn from what it measured. (Timings are the benchmark's, not checked here.)"""

from __future__ import annotations

import pytest

from bench import turns
from tests.helpers.live_server import live_server_fixture

server = live_server_fixture("bench-turns")


def short_message(turn: int) -> str:
    return f" Turn {turn}: the keeper lit the lamp."


def test_chained_turns_carry_the_history_that_is_resent(server, tmp_path):
    with server.client() as http:
        rows = turns.chained_turns(http, 3, short_message)
        assert [r["history"].count("the keeper lit the lamp") for r in rows] == [1, 2, 3]
        assert rows[2]["history"].startswith(rows[1]["history"])
        for row in rows:
            assert row["tokens"] == len(row["history"].encode())  # the byte model's tokens
            row["resent"] = turns.resent_turn(http, row["history"])
            assert row["chained"] > 0 and row["resent"] > 0
    rows[0]["resent_uncached"] = rows[2]["resent_uncached"] = 0.5
    pytest.importorskip("matplotlib")
    turns.plot(rows, tmp_path / "turns.png")
    assert (tmp_path / "turns.png").read_bytes().startswith(b"\x89PNG")


def test_the_faster_round_is_taken_turn_by_turn_and_series_by_series():
    first = [
        {"history": "a", "tokens": 1, "chained": 0.3, "resent": 0.1, "resent_uncached": 0.5},
        {"history": "ab", "tokens": 2, "chained": 0.2, "resent": 0.4},
    ]
    second = [
        {"history": "a", "tokens": 1, "chained": 0.2, "resent": 0.2, "resent_uncached": 0.6},
        {"history": "ab", "tokens": 2, "chained": 0.3, "resent": 0.3},
    ]
    assert turns.fastest([first, second]) == [
        {"history": "a", "tokens": 1, "chained": 0.2, "resent": 0.1, "resent_uncached": 0.5},
        {"history": "ab", "tokens": 2, "chained": 0.2, "resent": 0.3},
    ]


def test_rounds_whose_replies_differ_are_refused():
    first = [{"history": "a", "tokens": 1, "chained": 0.3, "resent": 0.1}]
    second = [{"history": "b", "tokens": 1, "chained": 0.2, "resent": 0.2}]
    with pytest.raises(RuntimeError, match="differed between rounds"):
        turns.fastest([first, second])
