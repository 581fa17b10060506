"""Reading a test's stream back, message by message (shared by the backup and archive tests)."""

from __future__ import annotations

from typing import Any

from hpc_ds1.eventlog.bus import EventBus


async def messages(bus: EventBus, stream: str) -> list[tuple[Any, ...]]:
    info = await bus.js.stream_info(stream)
    found = []
    for seq in range(1, int(info.state.last_seq) + 1):
        try:
            msg = await bus.js.get_msg(stream, seq)
        except Exception:
            found.append((seq, None))
            continue
        # Append-time headers: js.publish(stream=...) stores the stream's own name in
        # Nats-Expected-Stream, publish_many's atomic batches their batch (dropped on restore).
        headers = {
            k: v
            for k, v in (msg.headers or {}).items()
            if k != "Nats-Expected-Stream" and not k.startswith("Nats-Batch-")
        }
        found.append((seq, msg.subject, msg.data, headers))
    return found
