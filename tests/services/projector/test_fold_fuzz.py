"""hypothesis against a real Postgres: any messages the bus accepts (events with extreme values,
NUL bytes, unicode, ids seen before, bytes that are no JSON) are each projected or set aside,
never block the events after them, and the checkpoint ends at the log's last sequence."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, event, given
from hypothesis import settings as examples
from hypothesis import strategies as st
from sqlalchemy import Engine, select

from hpc_ds1.db import tables
from hpc_ds1.eventlog.audit import AuditFile, LogChain, verify_against_log
from hpc_ds1.eventlog.bus import EventBus, RawEvent
from hpc_ds1.services.projector.projector import project_batch
from hpc_ds1.settings import Settings

TEXT = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["\x00", "id\x00", "\ud800", "é💥", "", "x" * 3000]),
)
INTS = st.one_of(
    st.integers(min_value=-5, max_value=5000),
    st.sampled_from([0, -1, 2**31, 2**63 - 1, 2**63, 10**19, 2**64, 10**30]),
)
ID_POOL = ["dup-1", "dup-2", "dup-3"]


def clean_measurement(prefix: str, measurement_id: str) -> tuple[str, bytes]:
    subject = f"{prefix}.measurement.{measurement_id}.recorded"
    body = {
        "id": uuid.uuid4().hex,
        "type": "measurement.recorded",
        "version": 1,
        "subject": subject,
        "time": "2026-11-30T10:00:00Z",
        "actor": "fuzz",
        "source": "fuzz",
        "data": {
            "measurement_id": measurement_id,
            "device_id": "dev-f",
            "workload": "gemm",
            "size": 256,
            "config": {"ranks": 1},
            "status": "ok",
            "runtime_s": 0.5,
        },
    }
    return subject, json.dumps(body).encode()


@st.composite
def message(draw: st.DrawFn) -> tuple[str, str, bytes]:
    """(aggregate token, kind, bytes): an envelope of a known event with extreme values, an id
    from a small pool (so ids repeat past any dedup window), or bytes that are no event."""
    kind = draw(st.sampled_from(["measurement", "device", "decision", "approval", "junk"]))
    event_id = draw(st.one_of(st.sampled_from(ID_POOL), st.just(uuid.uuid4().hex)))
    token = draw(st.from_regex(r"\A[A-Za-z0-9_\-]{1,10}\Z"))
    if kind == "junk":
        raw = draw(st.one_of(st.binary(max_size=80), st.just(b'{"seq": 99999999}')))
        return token, "junk", raw
    if kind == "measurement":
        kind_type, data = (
            "measurement.recorded",
            {
                "measurement_id": draw(TEXT),
                "device_id": draw(TEXT),
                "workload": "gemm",
                "size": draw(INTS),
                "config": {"ranks": draw(INTS), draw(TEXT): draw(TEXT)},
                "status": "ok",
                "runtime_s": draw(st.floats(min_value=0, max_value=1e308)),
            },
        )
    elif kind == "device":
        kind_type, data = (
            "device.registered",
            {
                "device_id": draw(TEXT),
                "hostname": draw(TEXT),
                "fingerprint": {draw(TEXT): draw(INTS)},
            },
        )
    elif kind == "decision":
        kind_type, data = (
            "decision.made",
            {
                "decision_id": draw(TEXT),
                "device_id": "dev-f",
                "source": draw(TEXT),
                "workload": draw(TEXT),
                "size": draw(INTS),
                "config": {},
                "choice": draw(TEXT),
                "confidence": draw(st.floats(min_value=0, max_value=1)),
                "mode": "auto",
                "reasons": [draw(TEXT)],
            },
        )
    else:
        kind_type, data = (
            "approval.decided",
            {
                "approval_id": draw(TEXT),
                "session_id": "s",
                "decision_id": "d",
                "approved": draw(st.booleans()),
                "by": draw(TEXT),
                "role": "engineer",
                "note": draw(TEXT),
            },
        )
    body = {
        "id": event_id,
        "type": kind_type,
        "version": 1,
        "subject": "",  # set when published, from the prefix
        "time": draw(st.sampled_from(["2026-11-30T10:00:00Z", "0001-01-01T00:00:00Z"])),
        "actor": draw(TEXT),
        "source": "fuzz",
        "data": data,
    }
    return token, kind_type, json.dumps(body).encode()


class Log:
    """This test's own stream, reached from a loop of its own (hypothesis runs sync tests)."""

    def __init__(self, settings: Settings) -> None:
        assert settings.nats_url
        self.settings = settings
        self.loop = asyncio.new_event_loop()
        self.bus: EventBus = self.loop.run_until_complete(
            EventBus.connect(settings, settings.nats_url, "fuzz")
        )

    def publish(self, subject: str, data: bytes) -> int:
        ack = self.loop.run_until_complete(
            self.bus.js.publish(subject, data, stream=self.bus.stream)
        )
        return int(ack.seq)

    def read(self, start: int) -> list[RawEvent]:
        async def read() -> list[RawEvent]:
            return [e async for chunk in self.bus.replay(start) for e in chunk]

        return self.loop.run_until_complete(read())

    def close(self) -> None:
        async def close() -> None:
            for stream in (self.settings.stream, self.settings.dead_letter_stream):
                try:
                    await self.bus.js.delete_stream(stream)
                except Exception:
                    pass
            await self.bus.close()

        self.loop.run_until_complete(close())
        self.loop.close()


@pytest.fixture
def log_stream(settings: Settings) -> Iterator[Log]:
    stream = Log(settings)
    yield stream
    stream.close()


@examples(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    messages=st.lists(message(), min_size=1, max_size=8),
    batch=st.integers(min_value=1, max_value=6),
)
def test_every_message_is_projected_or_set_aside_and_blocks_nothing(
    messages: list[tuple[str, str, bytes]],
    batch: int,
    log_stream: Log,
    settings: Settings,
    engine: Engine,
) -> None:
    prefix = log_stream.bus.prefix
    start = _last(log_stream) + 1
    for token, kind, raw in messages:
        if kind == "junk":
            subject = f"{prefix}.junk.{token}.x"
        else:
            aggregate, name = kind.split(".")
            subject = f"{prefix}.{aggregate}.{token}.{name}"
            body = json.loads(raw)
            body["subject"] = subject
            raw = json.dumps(body).encode()
        log_stream.publish(subject, raw)
    # After the poison, a clean event: it must get its row whatever came before it.
    sentinel = f"ok-{uuid.uuid4().hex[:12]}"
    last = log_stream.publish(*clean_measurement(prefix, sentinel))

    events = log_stream.read(start)
    assert [e.seq for e in events] == list(range(start, last + 1))
    audit = AuditFile(settings.audit_path)
    for i in range(0, len(events), batch):
        project_batch(engine, events[i : i + batch], audit)

    with engine.connect() as conn:
        checkpoint = conn.execute(select(tables.checkpoints.c.last_seq)).scalar_one()
        raw_seqs = set(
            conn.execute(select(tables.events.c.seq).where(tables.events.c.seq >= start)).scalars()
        )
        aside = set(
            conn.execute(
                select(tables.set_aside.c.seq).where(tables.set_aside.c.seq >= start)
            ).scalars()
        )
        invalid = set(
            conn.execute(
                select(tables.events.c.seq).where(
                    tables.events.c.seq >= start, tables.events.c.valid.is_(False)
                )
            ).scalars()
        )
        row = conn.execute(
            select(tables.measurements.c.seq).where(
                tables.measurements.c.measurement_id == sentinel
            )
        ).scalar()
    event(f"set aside: {bool(aside)}; kept invalid: {bool(invalid - aside)}")
    assert checkpoint == last
    assert raw_seqs == set(range(start, last + 1))  # every message has its place in the raw log
    assert aside <= invalid and last not in aside
    assert row == last
    chain = LogChain()
    for e in log_stream.read(1):
        chain.feed(e.seq, e.subject, e.data)
    assert verify_against_log(settings.audit_path, chain, projected_to=last).intact


def _last(log_stream: Log) -> int:
    return int(log_stream.loop.run_until_complete(log_stream.bus.last_sequence()))
