"""The devices' task queues: a JetStream stream (settings.work_stream) with one subject per
device. Placement puts one `WorkItem` per placed attempt there; the device's agent takes it off
(the local agent through NATS, a remote agent through the gateway, which bridges its long-poll
to a durable pull consumer filtered on the device's subject). Work-queue retention: an item is
gone once acked. The queue is operational plumbing, derivable from the log's task.placed
events; the audit trail is the log."""

from __future__ import annotations

import functools
from typing import Any

from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import NotFoundError
from pydantic import BaseModel, ConfigDict, Field

from ..eventlog.bus import until_answered
from ..eventlog.subjects import work_subject
from ..settings import Settings


class WorkItem(BaseModel):
    """One placed attempt of a task, as its device receives it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task_id: str
    attempt: int = Field(ge=1)
    device_id: str
    workload: str
    size: int = Field(gt=0)
    config: dict[str, Any]
    expected_s: float | None = None

    @property
    def msg_id(self) -> str:
        """De-duplication id: an attempt is queued once, however often placement re-sends."""
        return f"{self.task_id}:{self.attempt}"


async def ensure_work_stream(js: JetStreamContext, settings: Settings) -> None:
    """Create the work stream when missing (idempotent). Each call is asked again while a
    cluster elects a leader (bus.until_answered)."""
    name = settings.work_stream
    config = StreamConfig(
        name=name,
        subjects=[f"{settings.work_prefix}.>"],
        storage=StorageType.FILE,
        retention=RetentionPolicy.WORK_QUEUE,
        duplicate_window=120.0,
        num_replicas=settings.stream_replicas,
    )
    try:
        await until_answered(functools.partial(js.stream_info, name), name)
    except NotFoundError:
        await until_answered(functools.partial(js.add_stream, config), name)


async def enqueue(js: JetStreamContext, settings: Settings, item: WorkItem) -> None:
    """Put an attempt on its device's queue (once: the msg id de-duplicates re-sends)."""
    await js.publish(
        work_subject(settings, item.device_id),
        item.model_dump_json().encode(),
        stream=settings.work_stream,
        headers={"Nats-Msg-Id": item.msg_id},
    )


def consumer_name(device_id: str) -> str:
    """The durable consumer of a device's queue (one per device: work-queue retention)."""
    return f"device-{device_id}"


async def device_queue(js: JetStreamContext, settings: Settings, device_id: str) -> Any:
    """A pull subscription on the device's queue (durable, explicit ack). `fetch(1, timeout=…)`
    waits for the next item; ack it once the item was handed to the agent."""
    await ensure_work_stream(js, settings)
    return await until_answered(
        lambda: js.pull_subscribe(
            work_subject(settings, device_id),
            durable=consumer_name(device_id),
            stream=settings.work_stream,
            config=ConsumerConfig(
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.ALL,
                ack_wait=30.0,
                max_ack_pending=1,
            ),
        ),
        settings.work_stream,
    )
