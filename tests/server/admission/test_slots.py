"""The HTTP layer's concurrency slots, per tenant (admission.slots): the server's ceiling, a tenant's own, the
last slots kept for tenants below their share, and a Retry-After from how long slots are held."""

from __future__ import annotations

import pytest
from txl_server.admission.slots import SERVER_CONCURRENCY, TENANT_CONCURRENCY, TENANT_SHARE, TenantSlots


class Clock:
    now = 10.0

    def __call__(self) -> float:
        return self.now


def test_one_tenant_alone_cannot_take_the_slots_kept_for_others_and_another_still_gets_one():
    slots = TenantSlots(16, reserve=2, clock=Clock())
    assert all(slots.take("crowd") is None for _ in range(14))
    refused = slots.take("crowd")
    assert refused is not None and refused.reason == TENANT_SHARE
    assert slots.take("lone") is None and slots.take("lone") is None  # its models request and a stream
    full = slots.take("third")
    assert full is not None and full.reason == SERVER_CONCURRENCY and "requests in flight" in full.message


def test_a_tenant_ceiling_holds_whatever_is_free():
    slots = TenantSlots(100, per_tenant=3, clock=Clock())
    assert [slots.take("a") for _ in range(3)] == [None] * 3
    refused = slots.take("a")
    assert refused is not None and refused.reason == TENANT_CONCURRENCY
    assert slots.take("b") is None


def test_retry_after_is_when_a_slot_of_the_tenant_frees_on_average_spaced_between_the_refused():
    slots = TenantSlots(100, per_tenant=4, clock=Clock())
    for _ in range(4):
        slots.take("a")
    for _ in range(100):  # slots held 2 s each, lately
        slots.take("b")
        slots.give_back("b", 2.0)
    first, second = slots.take("a"), slots.take("a")
    assert first is not None and second is not None
    interval = slots.mean_hold / 4  # one of its four slots frees this often
    assert slots.mean_hold == pytest.approx(2.0, rel=0.05)
    assert first.retry_after == pytest.approx(interval) and second.retry_after == pytest.approx(2 * interval)
    slots.give_back("a", 2.0)
    assert slots.take("a") is None
