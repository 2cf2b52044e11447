"""When a new request's first token would come: from the work ahead of it in the worker, the rows the batch holds
and may hold, and the measured step times. Nothing here runs the model: the worker describes what it holds as a
`Backlog` of values, and the estimate is a function of it.

A first token comes once two things happened, at the same time:

- **its prompt is fed**: the prompt tokens ahead of it are those of lanes served before its own, those of its own
  tenant's higher rank, those of tenants of its lane owed rows where its own is not (holding fewer rows than their
  fair share, counting the rows their prompts open: they go first, and none of those of tenants not owed rows where
  its own is), those of tenants served less than its own (their virtual token counters are smaller: they go
  first), and, of work that shares the prompt budget with it (the same rank of its tenant,
  round robin; tenants of its lane served as much), as much as its own prompt; all at the measured seconds per
  prompt token beside the batch (`Backlog.token_seconds`);
- **it has a row in the batch**: at once if its tenant's fair share of the lane's rows (`fair_share`) is not
  used up by work ahead of it (it then takes the row of a lower lane or of a tenant over its share); else once
  enough of the rows ahead of it ended, each after its remaining tokens at one step per token: the rows ahead
  run on the tenant's share of slots, the first to end making room for the next (list scheduling).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .classes import Lane
from .fair_share import even, max_min_shares


@dataclass(frozen=True)
class Work:
    """A job the worker holds (or a new one), as the estimate sees it."""

    lane: Lane
    tenant: str
    rank: int  # within its tenant and lane: priority 0, default 1
    feed: int  # input tokens still to feed before it decodes (or ends)
    decode: int  # tokens still to decode after that (0: it only feeds)
    rows: int  # decoding rows it holds or will hold (0 or 1; a new request's first job may stand for several)
    running: bool = False  # its row is in the batch now


@dataclass(frozen=True)
class Backlog:
    """What the worker holds and how fast it goes, as last published (`Worker.backlog`)."""

    work: tuple[Work, ...]
    cap: int  # rows the batch may hold (pacing)
    step: float  # seconds of one decoding step of the batch at its cap: the time each token of a row takes
    token_seconds: float  # seconds per prompt token fed beside the decoding rows
    lag: float = 0.0  # seconds the event loop takes to deliver what a step produced
    interval: float = 0.1  # seconds between two jobs ending, lately: how fast the queue drains
    counters: Mapping[str, float] = field(
        default_factory=dict
    )  # tenants' virtual token counters (fair_share)


@dataclass(frozen=True)
class Wait:
    first_token: (
        float  # seconds from now to the new request's first token (or first segment, if it only feeds)
    )
    alone: float  # the same on an idle worker: what the request itself takes

    @property
    def queued(self) -> float:
        """What the others' work adds."""
        return max(0.0, self.first_token - self.alone)


def first_token(backlog: Backlog, new: Work, *, weight: Callable[[str], float] = even) -> Wait:
    """The wait of `new` (its `feed`: the input tokens fed before its first token; `rows`, `decode`: what it then
    decodes) behind `backlog`."""
    own = new.feed * backlog.token_seconds
    prefill = (_prompt_tokens_ahead(backlog, new, weight) + new.feed) * backlog.token_seconds
    row = _row_wait(backlog, new, weight) if new.rows else 0.0
    step = backlog.step if new.rows else 0.0
    return Wait(max(prefill, row) + step + backlog.lag, own + step)


def _owed(backlog: Backlog, new: Work, weight: Callable[[str], float]) -> set[str]:
    """The tenants of `new`'s lane holding fewer rows than their fair share of the lane's places, counting the rows
    their prompts open (`new`'s too): the scheduler feeds their prompts first (engine.scheduler.owed_rows)."""
    places = backlog.cap - sum(w.rows for w in backlog.work if w.lane < new.lane and w.running)
    demand: dict[str, int] = defaultdict(int)
    held: dict[str, int] = defaultdict(int)
    for w in backlog.work:
        if w.lane == new.lane:
            demand[w.tenant] += w.rows
            held[w.tenant] += w.rows if w.running else 0
    demand[new.tenant] += new.rows
    shares = max_min_shares(demand, places, weight=weight, held=held)
    return {tenant for tenant, share in shares.items() if held[tenant] < share}


def _prompt_tokens_ahead(backlog: Backlog, new: Work, weight: Callable[[str], float]) -> int:
    counters = backlog.counters
    owed = _owed(backlog, new, weight)
    waiting = [counters.get(w.tenant, 0.0) for w in backlog.work if w.feed and w.lane == new.lane]
    # A tenant with no work waiting starts at the smallest counter of those waiting (fair_share.join).
    mine = max(counters.get(new.tenant, 0.0), min(waiting, default=0.0))
    ahead = 0
    sharing: dict[str, int] = defaultdict(int)  # per tenant: prompt tokens that share the budget with `new`'s
    for w in backlog.work:
        if not w.feed or w.lane > new.lane:
            continue
        if w.lane < new.lane or (w.tenant == new.tenant and w.rank < new.rank):
            ahead += w.feed
        elif w.tenant != new.tenant and (w.tenant in owed) != (new.tenant in owed):
            ahead += w.feed if w.tenant in owed else 0  # a tenant owed rows goes first, whatever the counters
        elif w.tenant == new.tenant:
            if w.rank == new.rank:
                sharing[w.tenant] += w.feed
        elif counters.get(w.tenant, 0.0) < mine:
            ahead += w.feed
        elif counters.get(w.tenant, 0.0) == mine:
            sharing[w.tenant] += w.feed
    return ahead + sum(min(tokens, new.feed) for tokens in sharing.values())


def _row_wait(backlog: Backlog, new: Work, weight: Callable[[str], float]) -> float:
    """Seconds until `new`'s first row has a place in the batch."""
    higher = [w for w in backlog.work if w.rows and w.lane < new.lane]
    lane = [w for w in backlog.work if w.rows and w.lane == new.lane]
    slots = max(0, backlog.cap - sum(w.rows for w in higher))
    demand: dict[str, int] = defaultdict(int)
    for w in lane:
        demand[w.tenant] += w.rows
    demand[new.tenant] += new.rows
    share = max_min_shares(demand, slots, weight=weight).get(new.tenant, 0)
    mine = [w for w in lane if w.tenant == new.tenant and w.rank <= new.rank]
    if sum(w.rows for w in mine) + 1 <= share:
        return 0.0
    ahead = sorted(mine, key=lambda w: (not w.running, w.rank))
    if share == 0:  # no room in the lane until rows of the lanes above end
        ahead = sorted(higher, key=lambda w: not w.running) + ahead
        share = backlog.cap
    return _next_free(ahead, max(1, share)) * backlog.step


def _next_free(ahead: list[Work], slots: int) -> int:
    """Steps until a slot is free after the rows of `ahead` took their turns on `slots` slots, in order."""
    ends: list[int] = []
    for w in ahead:
        for _ in range(w.rows):
            length = max(1, w.decode)
            if len(ends) < slots:
                heapq.heappush(ends, length)
            else:
                heapq.heappush(ends, heapq.heappop(ends) + length)
    return ends[0] if len(ends) >= slots else 0
