"""What an Idempotency-Key costs per append: a plain publish vs a keyed one (the look-up by
subject, then the append with its sequence check and headers), on an embedded NATS of its own.

    python benchmarks/bench_idempotency.py [N]    # N appends of each kind per round, 3 rounds
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.eventlog.idempotency import append_once, derived_id, find
from hpc_ds1.events import DecisionMade, envelope, new_id
from hpc_ds1.infra.nats_server import EmbeddedNats
from hpc_ds1.settings import Settings


def decision(decision_id: str) -> DecisionMade:
    return DecisionMade(
        decision_id=decision_id,
        device_id="d1",
        source="api",
        workload="gemm",
        size=64,
        config={"ranks": 1},
        choice="STOP",
        confidence=0.9,
        mode="auto",
    )


async def main(n: int) -> None:
    tmp = Path(tempfile.mkdtemp())
    server = EmbeddedNats(tmp / "nats", sync="default")
    url = server.start()
    try:
        settings = Settings(home=tmp / "home", nats_url=url, stream="EVB", subject_prefix="tb")
        bus = await EventBus.connect(settings, url, "bench")
        for round_ in range(3):
            start = time.perf_counter()
            for _ in range(n):
                await bus.publish(envelope(decision(new_id()), actor="a", source="b", prefix="tb"))
            plain = (time.perf_counter() - start) / n
            start = time.perf_counter()
            for _ in range(n):
                key_id = derived_id("tok", "POST /v1/decide", uuid.uuid4().hex)
                env = envelope(
                    decision(key_id), actor="a", source="b", prefix="tb", event_id=key_id
                )
                assert await find(bus, env.subject, "h") is None
                assert await append_once(bus, env, "h", {"ran": False}) is None
            keyed = (time.perf_counter() - start) / n
            print(
                f"round {round_}: plain publish {plain * 1e3:.2f} ms, "
                f"keyed look-up + append {keyed * 1e3:.2f} ms (n={n})"
            )
        await bus.close()
    finally:
        server.stop()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 500))
