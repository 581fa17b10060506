"""One active copy of a service that must not run twice: a Postgres advisory lock per service
(and per event stream), held on a connection of its own for the life of the process.

The projector (one ordered fold and one audit file's hash chain), the coordinator (it drives each
tuning session and settles fleet tasks from memory), placement (it places from its own folded
view) and an agent (it is its device) are single active. A second copy started beside one waits
as a standby, says who is active, and takes over within seconds of the active one dying: its
lock goes with its database connection, which a killed process's kernel closes at once (and a
dead host's by the TCP keepalives set below). Replicas of the other services share the work
through NATS queue groups instead.

The active copy checks its lock every CHECK_S. A lost connection (Postgres restarting) is
reopened and the lock taken again; when another copy took it meanwhile, this copy stops
(`LeadershipLost`). A standby that had to wait waits TAKEOVER_GRACE_S more before it starts,
so an active copy that lost its connection has stopped first."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
from collections.abc import AsyncIterator

from sqlalchemy import Connection, Engine, text
from sqlalchemy.pool import NullPool

from ..db.engine import normalize_url
from ..log import get_logger
from ..settings import Settings

log = get_logger("leader")

SINGLE_ACTIVE: tuple[str, ...] = ("projector", "coordinator", "placement", "agent")
STANDBY_POLL_S = 1.0
CHECK_S = 2.0
TAKEOVER_GRACE_S = 2 * CHECK_S + 1.0

_HOLDER = text(
    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
    "AND l.classid::bigint = :hi AND l.objid::bigint = :lo "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


class LeadershipLost(RuntimeError):
    """Another copy of a single-active service holds its lock now: this one must stop."""


def lock_name(settings: Settings, service: str, device_id: str | None = None) -> str:
    """What the lock guards: the service of this event stream (and device, for an agent)."""
    return "/".join(part for part in (settings.stream, service, device_id) if part)


def lock_key(name: str) -> int:
    """A signed 64-bit advisory lock key for `name`."""
    return int.from_bytes(
        hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True
    )


def describe_self(service: str) -> str:
    # Postgres keeps 63 bytes of an application_name.
    return f"hpc-ds1 {service} pid {os.getpid()} on {socket.gethostname()}"[:63]


class Lease:
    """The advisory lock `name` on a connection of its own (not from any pool)."""

    def __init__(self, database_url: str, service: str, name: str) -> None:
        self.service = service
        self.name = name
        self.key = lock_key(name)
        self._engine: Engine = _engine(database_url)
        self._conn: Connection | None = None

    def try_acquire(self) -> bool:
        """Take the lock if it is free (opening the connection first); False if held."""
        if self._conn is None or self._conn.closed or self._conn.invalidated:
            self._open()
        assert self._conn is not None
        got = bool(
            self._conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": self.key}).scalar()
        )
        return got

    def holder(self) -> str | None:
        """Who holds the lock, as its connection names itself (None when unknown)."""
        if self._conn is None:
            return None
        hi, lo = (self.key >> 32) & 0xFFFFFFFF, self.key & 0xFFFFFFFF
        row = self._conn.execute(_HOLDER, {"hi": hi, "lo": lo}).first()
        return None if row is None else str(row[0] or "") or None

    def still_held(self) -> bool:
        """True while this connection holds the lock: checked on the connection itself, and
        retaken on a new one when the old one broke. Raises while Postgres cannot be reached."""
        try:
            assert self._conn is not None
            self._conn.execute(text("SELECT 1")).scalar()
            return True
        except Exception:
            self._drop()
        log.warning("leader_connection_lost", service=self.service, lock=self.name)
        return self.try_acquire()

    def release(self) -> None:
        if self._conn is not None and not self._conn.closed:
            with contextlib.suppress(Exception):
                self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self.key})
        self._drop()
        self._engine.dispose()

    def _open(self) -> None:
        self._drop()
        conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        # The server notices a vanished client (dead host, cut link) within ~11 s, not the
        # kernel's default two hours, and drops its lock; a standby then takes over.
        for setting, value in (("idle", 5), ("interval", 2), ("count", 3)):
            conn.execute(text(f"SET tcp_keepalives_{setting} = {value}"))
        conn.execute(
            text("SELECT set_config('application_name', :n, false)"),
            {"n": describe_self(self.service)},
        )
        self._conn = conn

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = None


def _engine(database_url: str) -> Engine:
    from sqlalchemy import create_engine

    return create_engine(normalize_url(database_url), poolclass=NullPool)


@contextlib.asynccontextmanager
async def single_active(
    service: str, name: str, database_url: str, stop: asyncio.Event
) -> AsyncIterator[Lease | None]:
    """Hold lock `name` for the block; waits as a standby while another copy holds it. Yields
    None when `stop` came first (the block should end at once)."""
    lease = Lease(database_url, service, name)
    try:
        waited = False
        while True:
            try:
                if await asyncio.to_thread(lease.try_acquire):
                    break
                if not waited:
                    holder = await asyncio.to_thread(lease.holder)
                    log.warning(
                        "standby",
                        service=service,
                        lock=name,
                        active=holder or "another process",
                        detail=f"another copy of the {service} service is active; this one "
                        "waits and takes over when it stops (one active copy at a time)",
                    )
            except Exception as error:  # Postgres not reachable yet: keep waiting
                log.warning("leader_lock_unavailable", service=service, error=repr(error))
            waited = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), STANDBY_POLL_S)
            if stop.is_set():
                yield None
                return
        if waited:
            # The copy that was active may only now find it lost its lock: let it stop first.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), TAKEOVER_GRACE_S)
            if stop.is_set():
                yield None
                return
        log.info("active", service=service, lock=name, took_over=waited)
        yield lease
    finally:
        await asyncio.to_thread(lease.release)


async def watch(lease: Lease, stop: asyncio.Event) -> None:
    """Until `stop`: every CHECK_S, make sure the lock is still ours; raises LeadershipLost
    when another copy holds it now. While Postgres cannot be reached nobody can take it over,
    so this copy carries on and checks again."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), CHECK_S)
        if stop.is_set():
            return
        try:
            held = await asyncio.to_thread(lease.still_held)
        except Exception as error:
            log.warning("leader_check_failed", service=lease.service, error=repr(error))
            continue
        if not held:
            raise LeadershipLost(
                f"the {lease.service} service lost its lock {lease.name!r} to another copy "
                "while its database connection was down; this copy stops (one active at a time)"
            )
