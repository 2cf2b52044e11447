"""Admit or refuse (admission.policy): to the time-to-first-token target, counting only the wait others add; the
refusal's reason and its Retry-After, computed from the queue and spaced between the clients refused."""

from __future__ import annotations

import dataclasses

import pytest
from txl_server.admission.classes import Lane
from txl_server.admission.estimate import Backlog, Work
from txl_server.admission.policy import FIRST_TOKEN_TARGET, FLEX_CAPACITY, AdmissionPolicy, Admit, Refuse
from txl_server.admission.targets import LatencyTargets

STEP, TOKEN = 0.01, 0.001


class Clock:
    now = 50.0

    def __call__(self) -> float:
        return self.now


def policy(clock: Clock | None = None) -> AdmissionPolicy:
    return AdmissionPolicy(LatencyTargets(ttft=1.0, tbt=0.05), clock=clock or Clock())


def busy(rows: int, remaining: int, *, tenant: str = "a", interval: float = 0.2) -> Backlog:
    work = tuple(Work(Lane.INTERACTIVE, tenant, 1, 0, remaining, 1, True) for _ in range(rows))
    return Backlog(work, rows, STEP, TOKEN, interval=interval)


def request(prompt: int = 100, *, lane: Lane = Lane.INTERACTIVE, rank: int = 1, tenant: str = "a") -> Work:
    return Work(lane, tenant, rank, prompt, 64, 1)


def test_a_request_that_can_start_within_the_target_is_admitted():
    assert isinstance(policy().decide(busy(4, 50), request()), Admit)  # 0.5 s of waiting: within 1 s


def test_one_that_cannot_is_refused_with_the_time_the_queue_takes_to_drain_enough():
    decision = policy().decide(busy(4, 300), request())  # 3 s before a row is free
    assert isinstance(decision, Refuse) and decision.reason == FIRST_TOKEN_TARGET
    # Queued: 3 s + a step, less what it takes alone (a 0.1 s prompt and a step, which overlap the wait). Allowed:
    # 80% of the 1 s target less what it takes alone.
    assert decision.retry_after == pytest.approx((3.01 - 0.11) - (0.8 - 0.11), abs=1e-6)
    assert "retry after 2.21 s" in decision.message


def test_clients_refused_together_are_told_to_come_back_one_after_the_other():
    clock = Clock()
    p = policy(clock)
    first, second, third = (p.decide(busy(4, 300, interval=0.2), request()) for _ in range(3))
    assert isinstance(first, Refuse) and isinstance(second, Refuse) and isinstance(third, Refuse)
    assert second.retry_after == pytest.approx(first.retry_after + 0.2)
    assert third.retry_after == pytest.approx(first.retry_after + 0.4)
    clock.now += 60  # long after: the promises are past, nothing is owed
    later = p.decide(busy(4, 300, interval=0.2), request())
    assert isinstance(later, Refuse) and later.retry_after == pytest.approx(first.retry_after)


def test_a_long_prompt_is_never_refused_for_its_own_length():
    assert isinstance(policy().decide(busy(0, 0), request(prompt=5000)), Admit)  # 5 s alone
    # Behind others' prompts it may still queue for a quarter of the target.
    for ahead, admitted in ((200, True), (300, False)):
        backlog = Backlog((Work(Lane.INTERACTIVE, "a", 1, ahead, 0, 0),), 4, STEP, TOKEN)
        assert isinstance(policy().decide(backlog, request(prompt=5000)), Admit) == admitted


def test_flex_is_refused_first_and_batch_work_never_for_its_latency():
    # Default work fills the batch: a default request of another tenant gets a row at once, a flex one waits.
    backlog = busy(4, 150)
    assert isinstance(policy().decide(backlog, request(tenant="b")), Admit)
    flex = policy().decide(backlog, request(tenant="b", lane=Lane.FLEX))
    assert isinstance(flex, Refuse) and flex.reason == FLEX_CAPACITY
    assert isinstance(policy().decide(busy(4, 10_000), request(lane=Lane.BATCH)), Admit)


def test_priority_is_refused_after_default():
    # Four running rows and two default requests of the tenant waiting for a row: priority goes before those.
    waiting = tuple(Work(Lane.INTERACTIVE, "a", 1, 10, 100, 1) for _ in range(2))
    backlog = Backlog(busy(4, 150).work + waiting, 4, STEP, TOKEN)
    assert isinstance(policy().decide(backlog, request()), Refuse)
    assert isinstance(policy().decide(backlog, request(rank=0)), Admit)


def test_the_room_a_refused_client_was_promised_is_kept_for_it():
    clock = Clock()
    p = policy(clock)
    one_row = Backlog((Work(Lane.INTERACTIVE, "a", 1, 0, 100, 1, True),), 1, STEP, TOKEN, interval=0.5)
    refused = p.decide(one_row, request())  # its row is free in 1 s: 0.21 s too late
    assert isinstance(refused, Refuse) and refused.retry_after == pytest.approx(0.21, abs=1e-6)
    clock.now += 0.1
    later = dataclasses.replace(one_row, work=(Work(Lane.INTERACTIVE, "a", 1, 0, 90, 1, True),))
    # A newcomer now would fit (its row in 0.9 s), but the refused client comes back first: its room is kept.
    assert isinstance(p.decide(later, request()), Refuse)
    clock.now += 0.11
    back = dataclasses.replace(one_row, work=(Work(Lane.INTERACTIVE, "a", 1, 0, 79, 1, True),))
    assert isinstance(p.decide(back, request()), Admit)  # the client it was promised to


def test_a_promise_is_kept_for_the_request_refused_not_for_whichever_comes_at_its_moment():
    clock = Clock()
    p = policy(clock)
    one_row = Backlog((Work(Lane.INTERACTIVE, "a", 1, 0, 100, 1, True),), 1, STEP, TOKEN, interval=0.5)
    refused = p.decide(one_row, request(), key="refused")
    assert isinstance(refused, Refuse)
    clock.now += refused.retry_after
    back = dataclasses.replace(one_row, work=(Work(Lane.INTERACTIVE, "a", 1, 0, 79, 1, True),))
    # A new request sent at the promised moment would fit alone, but the room is the refused request's: an
    # anonymous promise went to whichever came first, and the client it was made to was refused again.
    newcomer = p.decide(back, request(), key="new")
    assert isinstance(newcomer, Refuse)
    assert isinstance(p.decide(back, request(), key="refused"), Admit)


def test_a_request_refused_again_takes_a_new_place_and_one_back_early_is_not_behind_itself():
    clock = Clock()
    p = policy(clock)
    full = busy(4, 300, interval=0.2)
    first = p.decide(full, request(), key="r")
    assert isinstance(first, Refuse)
    clock.now += first.retry_after / 2  # back early: still refused, told a new moment
    again = p.decide(full, request(), key="r")
    assert isinstance(again, Refuse) and again.retry_after > 0
    clock.now += again.retry_after
    # One promise (its old place was given up): the room left for one more request is its own, and it comes
    # back to it; a newcomer then finds no promise ahead.
    fits = busy(4, 50, interval=0.2)
    assert isinstance(p.decide(fits, request(), key="r"), Admit)
    assert isinstance(p.decide(fits, request(), key="other"), Admit)


def test_promises_to_clients_that_never_come_back_stop_refusing_newcomers():
    clock = Clock()
    p = policy(clock)
    one_row = Backlog((Work(Lane.INTERACTIVE, "a", 1, 0, 100, 1, True),), 1, STEP, TOKEN, interval=0.1)
    # Open-loop traffic: every request refused, none sent again.
    for i in range(200):
        p.decide(one_row, request(), key=f"gone-{i}")
        clock.now += 0.05
    # The row frees at once now: a newcomer would fit, and the promises falling due (their clients gone) are no
    # longer held against it: it is admitted, not refused for work that never comes (each refusal one more).
    idle = Backlog((), 1, STEP, TOKEN, interval=0.1)
    assert isinstance(p.decide(idle, request(), key="new"), Admit)


def test_a_keys_first_request_is_admitted_beside_another_keys_crowd_but_not_its_second():
    crowd = tuple(Work(Lane.INTERACTIVE, "crowd", 1, 128, 64, 1) for _ in range(40))
    backlog = Backlog(busy(4, 300).work + crowd, 4, STEP, TOKEN)
    assert isinstance(policy().decide(backlog, request(tenant="lone")), Admit)
    with_one = Backlog((*backlog.work, Work(Lane.INTERACTIVE, "lone", 1, 0, 300, 1, True)), 4, STEP, TOKEN)
    assert isinstance(policy().decide(with_one, request(tenant="lone", prompt=2000)), Refuse)
