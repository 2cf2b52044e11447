"""Overload, against a real server process on the bundled model (the tiny one where it is absent), with real HTTP
clients (bench/load_client.py's: streamed `/v1/completions`, a client told 429 waits its Retry-After):

- a crowd past the knee keeps a good part of the goodput of a few clients (none, without admission), every
  refusal a 429 with Retry-After that came fast, no 5xx, no broken stream;
- a second key's lone client beside another key's crowd, and a default client beside a crowd of flex clients of
  its own key, keep their time to first token near what they have alone, while the crowd still progresses.

The thresholds leave room for a shared CI machine (the issue's own bars, measured in one run on a quiet machine,
are in docs/benchmarks/load.md: `python -m bench load`). TXL_OVERLOAD_SECONDS sets each window (default 20).
"""

from __future__ import annotations

import asyncio
import os
import random
import time

import pytest

from bench.load_client import Tally, closed_loop
from tests.helpers.server_process import ServerProcess

from .servers import BUNDLED_MODEL

pytestmark = pytest.mark.slow

SECONDS = float(os.environ.get("TXL_OVERLOAD_SECONDS", "20"))
CROWD = 48


@pytest.fixture(scope="module")
def server(tiny_model_dir, logs_dir):
    model = BUNDLED_MODEL if (BUNDLED_MODEL / "config.json").exists() else tiny_model_dir
    with ServerProcess(
        logs_dir / "overload.log",
        inherit_txl=False,
        TXL_MODEL=str(model),
        TXL_EPHEMERAL="1",
        TXL_API_KEYS="crowd-key,lone-key",
        TXL_MAX_CONCURRENT_REQUESTS="1024",
    ) as process:
        yield process


def run(port: int, clients: list[tuple[Tally, str, str | None]]) -> float:
    """Each (tally, key, tier) a closed-loop client for SECONDS; the seconds it took, open requests included."""

    async def all_of_them() -> None:
        deadline = time.monotonic() + SECONDS
        await asyncio.gather(
            *(
                closed_loop(port, tally, deadline, random.Random(i), key=key, tier=tier)
                for i, (tally, key, tier) in enumerate(clients)
            )
        )

    started = time.monotonic()
    asyncio.run(all_of_them())
    return time.monotonic() - started


def test_a_crowd_keeps_most_of_the_goodput_and_every_refusal_is_fast_and_says_when(server, figures):
    few, crowd = Tally(), Tally()
    few.seconds = run(server.port, [(few, "crowd-key", None)] * 4)
    crowd.seconds = run(server.port, [(crowd, "crowd-key", None)] * CROWD)
    figures.record(
        "overload",
        {"goodput_4": few.goodput, "goodput_crowd": crowd.goodput, "refused": len(crowd.refused),
         "refused_in_time": crowd.refused_in_time, "next_try_served": crowd.next_try_served},
    )  # fmt: skip
    assert few.errors == 0 and crowd.errors == 0  # no 5xx, no broken stream
    assert crowd.refused and crowd.without_retry_after == 0
    assert crowd.refused_in_time >= 0.9  # within 0.25 s; a shared machine may be slower at moments
    # Without admission a crowd this size got no good request at all (docs/benchmarks/load.md, before). The
    # issue's bar is 0.8x; on a busy 2-core machine the crowd has kept 0.36-0.85x of it: this guards against the
    # collapse, the bench reports the ratio.
    assert crowd.goodput >= 0.3 * few.goodput, (crowd.goodput, few.goodput)


def test_a_lone_client_keeps_its_first_token_beside_another_keys_crowd_and_default_beside_flex(
    server, figures
):
    alone = Tally()
    run(server.port, [(alone, "lone-key", None)])
    for crowd_key, crowd_tier, lone_key in (
        ("crowd-key", None, "lone-key"),
        ("crowd-key", "flex", "crowd-key"),
    ):
        lone, crowd = Tally(), Tally()
        run(server.port, [(crowd, crowd_key, crowd_tier)] * CROWD + [(lone, lone_key, None)])
        figures.record(
            "overload",
            {f"lone_p90_beside_{crowd_tier or 'default'}": lone.ttft(90), "alone_p90": alone.ttft(90)},
        )
        assert lone.served and lone.errors == 0 and crowd.errors == 0
        assert lone.ttft(90) <= 3 * alone.ttft(90) + 0.5, (crowd_tier, lone.ttft(90), alone.ttft(90))
        assert crowd.tokens > 0  # the crowd still progresses, flex included
