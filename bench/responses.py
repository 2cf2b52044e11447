"""The Responses API on session history: a conversation chained with `previous_response_id` against the same
turns resending the whole history to `/v1/completions`, and what keeping a session's versions costs.

A 20-turn conversation on the bundled model over real HTTP (a server process, persistence `always`, greedy
decoding): each turn adds a ~150-byte user message and 32 generated tokens. Chained, a turn feeds only its new
message (the rest is served from the session's memory); resent, every turn feeds the whole conversation so far.
Tokens processed = tokens fed through the model plus tokens generated; time = the request, client-side. Both
give the same text, turn for turn (a session's state is a function of its tokens). Then one long session
(8 x mem_len of text, then 32 turns) kept with TXL_KEEP_VERSIONS 32 and 1: bytes on the device (blocks shared
by several versions counted once) and in Redis (`MEMORY USAGE` of every key the server wrote).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import httpx
from txl.sampling import SamplingParams
from txl_server.check.benchmark_docs import Section
from txl_server.runtime import Runtime
from txl_server.settings import Persistence, Settings

from .http import Server

TURNS, OUTPUT_TOKENS = 20, 32
PLACES = ["north", "east", "south", "west", "harbour", "cliffs", "village", "lighthouse", "sea", "hills"]
OWNER = "bench"


def message(turn: int) -> str:
    place = PLACES[turn % len(PLACES)]
    return (
        f"\n\nThe keeper wrote in the log on the {turn + 1}th night that the wind had turned towards the {place}, "
        f"that the lamp had burned until dawn, and that no ship had passed. Then he wrote:"
    )


def conversation(url: str, turns: int) -> list[dict[str, float | int | bool]]:
    """Per turn: tokens processed and seconds, chained and resent, and whether both answered the same."""
    rows = []
    with httpx.Client(base_url=url, timeout=600) as http:
        http.post("/v1/responses", json={"input": "Warm-up.", "max_output_tokens": 4})
        previous, history = None, ""
        for turn in range(turns):
            text = message(turn)
            body = {"input": text, "max_output_tokens": OUTPUT_TOKENS, "temperature": 0}
            started = time.perf_counter()
            chained = http.post("/v1/responses", json={**body, "previous_response_id": previous}).json()
            chained_seconds = time.perf_counter() - started
            usage = chained["usage"]
            fed = usage["input_tokens"] - usage["input_tokens_details"]["cached_tokens"]
            history += text
            started = time.perf_counter()
            resent = http.post(
                "/v1/completions",
                json={"prompt": history, "max_tokens": OUTPUT_TOKENS, "temperature": 0},
            ).json()
            resent_seconds = time.perf_counter() - started
            reply = chained["output"][0]["content"][0]["text"]
            rows.append(
                {
                    "chained_tokens": fed + usage["output_tokens"],
                    "chained_seconds": chained_seconds,
                    "cached": usage["input_tokens_details"]["cached_tokens"],
                    "resent_tokens": resent["usage"]["prompt_tokens"] + resent["usage"]["completion_tokens"],
                    "resent_seconds": resent_seconds,
                    "same": reply == resent["choices"][0]["text"],
                }
            )
            history += reply
            previous = chained["id"]
    return rows


async def version_bytes(keep: int, turns: int) -> tuple[int, int, int]:
    """(device bytes, Redis bytes, bytes of one version's memory) of one long session after `turns` turns."""
    with tempfile.TemporaryDirectory(prefix="txl-bench-redis-") as data:
        settings = Settings(persistence=Persistence.ALWAYS, keep_versions=keep, redis_data_dir=Path(data))
        runtime = Runtime(settings)
        await runtime.start()
        try:
            service = runtime.service
            assert service is not None
            text = "".join(message(i) for i in range(8 * service.default_mem_len // 150 + 1))
            meta = await service.create(OWNER, text=text)
            for turn in range(turns):
                async for _ in service.generate(
                    OWNER,
                    meta.id,
                    text=message(turn),
                    max_tokens=16,
                    sampling=SamplingParams(temperature=0),
                ):
                    pass
            entry = service.cache.peek(meta.id)
            assert entry is not None
            redis = service.store.redis
            stored = 0
            async for key in redis.scan_iter(match=settings.redis_prefix + "*"):
                stored += int(await redis.memory_usage(key) or 0)
            return service.cache.used("device"), stored, entry.state.nbytes
        finally:
            await runtime.stop()


def run(quick: bool = False) -> Section:
    section = Section(
        "responses", "Responses: chained turns against resending the history", "python -m bench responses"
    )
    section.note(__doc__.split("\n\n", 1)[1].strip())
    turns = 8 if quick else TURNS
    server = Server(None, {"TXL_PERSISTENCE": "always"})
    try:
        rounds = [conversation(server.url, turns) for _ in range(1 if quick else 2)]
    finally:
        server.stop()
    # The faster of two rounds per turn and side: the machine's slow spells hit both.
    best = [
        {**a, **{k: min(a[k], b[k]) for k in ("chained_seconds", "resent_seconds")}}
        for a, b in zip(rounds[0], rounds[-1], strict=True)
    ]
    section.table(
        f"bundled model, {turns} turns of ~150 bytes in and {OUTPUT_TOKENS} tokens out, greedy",
        [
            "turn",
            "chained: tokens",
            "chained: ms",
            "cached tokens",
            "resent: tokens",
            "resent: ms",
            "same text",
        ],
        [
            [
                i + 1,
                r["chained_tokens"],
                1000 * float(r["chained_seconds"]),
                r["cached"],
                r["resent_tokens"],
                1000 * float(r["resent_seconds"]),
                "yes" if r["same"] else "no",
            ]
            for i, r in enumerate(best)
        ],
    )
    total_chained = sum(int(r["chained_tokens"]) for r in best)
    total_resent = sum(int(r["resent_tokens"]) for r in best)
    section.note(
        f"Over {turns} turns: {total_chained:,} tokens processed chained, {total_resent:,} resent "
        f"({total_resent / total_chained:.1f}x); the last turn took "
        f"{1000 * float(best[-1]['chained_seconds']):.0f} ms chained and "
        f"{1000 * float(best[-1]['resent_seconds']):.0f} ms resent."
    )
    section.note(
        "Token counts are exact; times are the faster of two rounds on a machine shared with other work, so they "
        "vary by up to 2x from turn to turn: the trend is the point (chained turns stay flat, resent ones grow "
        "with the conversation)."
    )
    versions = 8 if quick else 32
    many = asyncio.run(version_bytes(versions, versions))
    one = asyncio.run(version_bytes(1, versions))
    section.table(
        f"one session of 8 x mem_len bytes of text, then {versions} turns (~150 bytes in, 16 tokens out): "
        "memory, MiB",
        ["versions kept", "device", "Redis", "x one version's memory (device)"],
        [
            [versions, many[0] / 2**20, many[1] / 2**20, many[0] / many[2]],
            [1, one[0] / 2**20, one[1] / 2**20, one[0] / one[2]],
        ],
    )
    section.note(
        f"One version's memory (mem_len positions and the last hidden state) is {many[2] / 2**20:.2f} MiB. "
        f"Keeping {versions} versions costs {many[0] / one[0]:.1f}x the device bytes and {many[1] / one[1]:.1f}x "
        "the Redis bytes of keeping one: versions share every block they have in common, so each costs only the "
        "positions its turn moved out of the window."
    )
    return section
