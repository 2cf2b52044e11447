"""When a new request's first token would come (admission.estimate), from work described as values: the prompt
tokens ahead of it by lane, tenant and rank, and the wait for a place in the batch by fair share."""

from __future__ import annotations

import pytest
from txl_server.admission.classes import Lane
from txl_server.admission.estimate import Backlog, Work, first_token

STEP = 0.01  # seconds per decoding step of the full batch
TOKEN = 0.001  # seconds per prompt token


def backlog(*work: Work, cap: int = 4, lag: float = 0.0) -> Backlog:
    return Backlog(tuple(work), cap, STEP, TOKEN, lag=lag)


def feeding(tokens: int, *, tenant: str = "a", lane: Lane = Lane.INTERACTIVE, rank: int = 1, decode: int = 0):
    return Work(lane, tenant, rank, tokens, decode, 1 if decode else 0)


def decoding(remaining: int, *, tenant: str = "a", lane: Lane = Lane.INTERACTIVE, running: bool = True):
    return Work(lane, tenant, 1, 0, remaining, 1, running)


def new(
    prompt: int = 100, *, tenant: str = "a", lane: Lane = Lane.INTERACTIVE, rank: int = 1, decode: int = 10
):
    return Work(lane, tenant, rank, prompt, decode, 1 if decode else 0)


def test_on_an_idle_worker_the_first_token_comes_after_its_own_prompt_and_one_step():
    wait = first_token(backlog(), new(100))
    assert wait.first_token == pytest.approx(100 * TOKEN + STEP) and wait.queued == 0


def test_prompts_ahead_count_whole_from_lanes_before_it_and_as_much_as_its_own_from_those_sharing_the_budget():
    ahead = [
        feeding(1000, lane=Lane.INTERACTIVE, tenant="x", decode=10),  # another tenant owed a row too: shares
        feeding(1000, lane=Lane.FLEX),  # a lane after its own: nothing
        feeding(50, rank=0),  # its tenant's priority work: whole
        feeding(30),  # its tenant's default work: round robin, up to 100
    ]
    wait = first_token(backlog(*ahead), new(100))
    assert wait.first_token == pytest.approx((100 + 0 + 50 + 30 + 100) * TOKEN + STEP)
    flex = first_token(backlog(*ahead), new(100, lane=Lane.FLEX))
    assert flex.first_token == pytest.approx((1000 + 100 + 50 + 30 + 100) * TOKEN + STEP)


def test_with_its_tenants_share_of_rows_taken_it_waits_for_the_first_rows_to_end():
    rows = [decoding(r) for r in (50, 20, 80, 40)]
    wait = first_token(backlog(*rows, cap=4), new(10))
    assert wait.first_token == pytest.approx(20 * STEP + STEP)  # the row with 20 tokens left ends first
    queued = [*rows, feeding(5, decode=30)]  # one more of its tenant ahead: it takes that first place
    assert first_token(backlog(*queued, cap=4), new(10)).first_token == pytest.approx(40 * STEP + STEP)


def test_another_tenants_crowd_does_not_make_a_lone_client_wait_for_a_row():
    crowd = [decoding(60, tenant="crowd") for _ in range(4)] + [feeding(100, tenant="crowd", decode=60)] * 10
    wait = first_token(backlog(*crowd, cap=4), new(100, tenant="lone"))
    # Its row: at once (the crowd is over its share). Its prompt: first (it is owed a row, the crowd is not).
    assert wait.first_token == pytest.approx(100 * TOKEN + STEP)
    crowded = first_token(backlog(*crowd, cap=4), new(100, tenant="crowd"))
    assert crowded.first_token > 60 * STEP  # one of the crowd waits for the crowd's rows


def test_flex_waits_for_a_row_until_interactive_rows_leave_room():
    rows = [decoding(r) for r in (30, 10)]
    assert first_token(backlog(*rows, cap=2), new(0, lane=Lane.FLEX)).first_token == pytest.approx(11 * STEP)
    assert first_token(backlog(*rows, cap=3), new(0, lane=Lane.FLEX)).first_token == pytest.approx(STEP)


def test_a_job_that_only_feeds_waits_for_no_row_and_the_event_loops_lag_counts():
    rows = [decoding(100) for _ in range(4)]
    wait = first_token(backlog(*rows, cap=4, lag=0.05), new(64, decode=0))
    assert wait.first_token == pytest.approx(64 * TOKEN + 0.05) and wait.alone == pytest.approx(64 * TOKEN)


def test_prompts_of_a_tenant_owed_rows_go_before_those_of_one_that_is_not():
    crowd = [decoding(60, tenant="crowd") for _ in range(2)] + [feeding(300, tenant="crowd", decode=10)]
    scoring = feeding(500, tenant="scoring")  # opens no row: owed none
    # Two places of four are free: the crowd is owed one (its prompt goes first, whatever the counters), and so is
    # "new"; the scoring tenant's prompt waits behind both, though it was served least.
    counters = {"crowd": 900.0, "scoring": 0.0, "new": 900.0}
    b = Backlog((*crowd, scoring), 4, STEP, TOKEN, counters=counters)
    assert first_token(b, new(100, tenant="new")).first_token == pytest.approx((100 + 100) * TOKEN + STEP)
    # More scoring of that tenant: behind the crowd's prompt, sharing the budget with its own tenant's.
    more = first_token(b, new(100, tenant="scoring", decode=0))
    assert more.first_token == pytest.approx((300 + 100 + 100) * TOKEN)


def test_prompts_of_a_tenant_served_more_are_behind_and_of_one_served_less_ahead():
    crowd = [
        feeding(500, tenant="crowd", decode=10),
        feeding(300, tenant="light", decode=10),
    ]  # all owed rows
    counters = {"crowd": 9000.0, "light": 100.0, "new": 0.0}
    backlog = Backlog(tuple(crowd), 4, STEP, TOKEN, counters=counters)
    # "new" joins at the smallest counter of those waiting (light's): light's prompt shares the budget with it,
    # the crowd's (served far more) waits behind both.
    wait = first_token(backlog, new(100, tenant="new"))
    assert wait.first_token == pytest.approx((100 + 100) * TOKEN + STEP)
    served_less = Backlog(
        tuple(crowd), 4, STEP, TOKEN, counters={"crowd": 9000.0, "light": 100.0, "new": 500.0}
    )
    assert first_token(served_less, new(100, tenant="new")).first_token == pytest.approx(
        (100 + 300) * TOKEN + STEP
    )
