"""The reply benchmark's small mode: both routes answer the same JSON (measure checks it) and
every round is timed; how much is saved is the benchmark's to print."""

from __future__ import annotations

import asyncio

from benchmarks.bench_decide_reply import measure


def test_both_replies_are_the_same_json_and_every_round_is_timed() -> None:
    reply = asyncio.run(measure(20, rounds=2))
    assert len(reply.validated_s) == len(reply.forwarded_s) == len(reply.saved_s) == 2
    assert all(t > 0 for t in reply.validated_s + reply.forwarded_s)
