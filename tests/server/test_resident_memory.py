"""A CPU server's memory follows what it serves (server/txl_server/memory_budgets.py): `python -m txl_server` on the
bundled model, as `bash scripts/serve.sh` starts it, stays under 1 GiB resident, at its peak, after three
sessions and a 30 kB document scored (which used to hold every boundary of the document, and a prefix cache sized
as a GPU's: 2.7-3.1 GB after a few minutes)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from txl_server.settings import BUNDLED_MODEL_DIR

from tests.helpers.server_process import standalone

REPO = Path(__file__).resolve().parents[2]
BOOK = REPO / "tests" / "data" / "gutenberg" / "melville-moby_dick.txt"
GiB = 2**30


def peak_rss_bytes(pid: int) -> int:
    """The process's resident set at its largest so far (VmHWM)."""
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    assert match is not None
    return int(match.group(1)) * 1024


@pytest.mark.timeout(300)
def test_the_bundled_model_serves_three_sessions_and_a_30_kb_score_in_under_1_gib(tmp_path):
    book = BOOK.read_text(encoding="utf-8")
    with standalone(BUNDLED_MODEL_DIR, tmp_path / "server.log", TXL_EPHEMERAL="1") as server:
        started = server.rss_bytes()
        with server.client() as client:
            client.timeout = 300
            for i in range(3):
                session = client.post("/v1/sessions", json={"text": book[i * 2000 : (i + 1) * 2000]}).json()
                generated = client.post(f"/v1/sessions/{session['id']}/generate", json={"max_tokens": 100})
                assert generated.status_code == 200, generated.text
            document = book[10_000:40_000].encode()
            scored = client.post("/v1/score", content=document, headers={"Content-Type": "text/plain"})
            assert scored.status_code == 200 and scored.json()["tokens"] == 30_000, scored.text
            budgets = client.get("/v1/system").json()["serving"]["budgets"]
        peak, now = peak_rss_bytes(server.pid), server.rss_bytes()
    print(
        f"resident: {started / 2**20:.0f} MiB started, {now / 2**20:.0f} MiB now, {peak / 2**20:.0f} MiB peak"
    )
    assert peak <= GiB, (
        f"peak {peak / 2**20:.0f} MiB (started at {started / 2**20:.0f} MiB); budgets {budgets}"
    )
    # The defaults of a CPU, reported: no host tier, a prefix cache of at most 8,192 positions (16 KiB each here).
    assert budgets["host"] == 0 and budgets["prefix_cache"] <= 8192 * 16 * 1024
    assert "1/16 of this machine's" in budgets["how"]
