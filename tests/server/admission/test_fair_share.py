"""Fair share between tenants (admission.fair_share): weighted max-min shares of the batch, sticky, and virtual
token counters that cannot bank idle time."""

from __future__ import annotations

from txl_server.admission.fair_share import VirtualCounters, max_min_shares


def test_shares_are_max_min_fair_and_never_more_than_asked():
    assert max_min_shares({"a": 10, "b": 10}, 8) == {"a": 4, "b": 4}
    assert max_min_shares({"a": 10, "b": 1}, 8) == {"a": 7, "b": 1}
    assert max_min_shares({"a": 2, "b": 1}, 8) == {"a": 2, "b": 1}
    assert max_min_shares({"a": 3, "b": 0}, 2) == {"a": 2}


def test_shares_follow_the_weights():
    shares = max_min_shares({"a": 10, "b": 10}, 9, weight=lambda t: 2.0 if t == "a" else 1.0)
    assert shares == {"a": 6, "b": 3}


def test_an_odd_slot_stays_with_the_tenant_that_holds_it_then_goes_to_the_one_served_least():
    assert max_min_shares({"a": 5, "b": 5}, 5, held={"b": 3, "a": 2}) == {"a": 2, "b": 3}
    assert max_min_shares({"a": 5, "b": 5}, 5, held={"a": 3, "b": 2}) == {"a": 3, "b": 2}
    counters = {"a": 10.0, "b": 3.0}
    assert max_min_shares({"a": 5, "b": 5}, 5, counters=counters.__getitem__) == {"a": 2, "b": 3}


def test_counters_grow_by_tokens_over_weight_and_a_returning_tenant_starts_at_the_smallest_waiting():
    counters = VirtualCounters(weight=lambda t: 2.0 if t == "heavy" else 1.0)
    counters.serve("heavy", 100)
    counters.serve("light", 30)
    assert counters.of("heavy") == 50 and counters.of("light") == 30
    counters.join("new", ["heavy", "light"])
    assert counters.of("new") == 30
    counters.serve("new", 5)
    counters.join("new", ["heavy"])  # already ahead of the smallest: it keeps its own
    assert counters.of("new") == 50
