"""Decisions made in a Python program (`hpc_ds1.load()`) reach the home's log and audit trail.

When the home's server runs (`hpc-ds1 serve`: `running_owner`), each decision is appended to its
event log as the same `decision.made` event the decision service appends (source "python", the
user as actor), as the home's own `cli` NATS user; the projector lists it with the others and the
audit service chains it into audit.jsonl. When no server runs, the decision is still returned
and a warning, once per loaded model, says it was not logged.

The program may call `decide` from plain code or from inside its own event loop; so the NATS
connection lives on a loop in a daemon thread of its own, made on first use and kept."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import getpass
import threading
import warnings
from pathlib import Path
from typing import Any

from .events import DecisionMade, envelope, new_id
from .infra.home import Endpoints, running_owner, settings_of_owner
from .settings import Settings

CONNECT_S = 5.0  # an owner whose NATS does not answer this soon: the decision is not logged
PUBLISH_S = 5.0
SOURCE = "python"


class DecisionNotLogged(UserWarning):
    """A decision was returned but not appended to the home's log (no server, or it failed)."""


class _Loop:
    """An event loop in a daemon thread: coroutines run there, callers wait for the result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="hpc-ds1-log", daemon=True).start()

    def run(self, coro: Any, timeout: float) -> Any:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer within {timeout:g} s") from None


class DecisionLog:
    """Appends the decisions of one loaded model to the log of the home `settings.home`."""

    def __init__(self, settings: Settings, actor: str | None = None) -> None:
        self.settings = settings
        self.actor = actor or getpass.getuser()
        self._loop: _Loop | None = None
        self._bus: Any = None
        self._owner_key: tuple[int | None, str] | None = None
        self._warned = False
        self._lock = threading.Lock()

    @property
    def home(self) -> Path:
        return self.settings.home

    def record(self, event: DecisionMade) -> bool:
        """Append `event`; False (and a warning the first time) when it could not be."""
        owner = running_owner(self.home)
        if owner is None:
            self._warn(
                f"no `hpc-ds1 serve` runs for {self.home}: this decision is returned but not "
                "logged (start `hpc-ds1 serve` to log every decision and audit it)"
            )
            return False
        try:
            with self._lock:
                self._publish(owner, event)
        except Exception as error:  # the decision itself stands; the log is best effort here
            self._warn(f"this decision is returned but was not logged in {self.home}: {error}")
            self._bus = None
            return False
        return True

    def event(
        self, *, device_id: str, state: Any, decision: Any, session_id: str | None = None
    ) -> DecisionMade:
        """The `decision.made` event of `decision` about `state` on device `device_id`."""
        return DecisionMade(
            decision_id=new_id(),
            device_id=device_id,
            source=SOURCE,
            workload=state.workload,
            size=state.size,
            config=state.config.model_dump(),
            choice=decision.choice,
            confidence=decision.confidence,
            mode=decision.mode,
            reasons=list(decision.reasons),
            alternatives=dict(decision.alternatives),
            model_version=decision.model_version,
            session_id=session_id,
        )

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(message, DecisionNotLogged, stacklevel=5)  # the caller of decide()

    def _settings_of(self, owner: Endpoints) -> Settings:
        # The server's stream and prefix (owner.json); one set explicitly to another value
        # here is refused (the decision is returned, not logged, and the warning names both).
        return settings_of_owner(self.settings, owner)

    def _publish(self, owner: Endpoints, event: DecisionMade) -> None:
        settings = self._settings_of(owner)
        if self._loop is None:
            self._loop = _Loop()
            atexit.register(self.close)
        key = (owner.pid, owner.nats_url)
        if self._bus is None or self._owner_key != key:  # first use, or the server restarted
            self._close_bus()
            self._bus = self._loop.run(self._connect(owner, settings), CONNECT_S)
            self._owner_key = key
        env = envelope(event, actor=self.actor, source=SOURCE, prefix=settings.subject_prefix)
        self._loop.run(self._bus.publish(env), PUBLISH_S)

    @staticmethod
    async def _connect(owner: Endpoints, settings: Settings) -> Any:
        import nats

        from .eventlog.bus import EventBus, server_list

        async def quiet(_: Exception) -> None:
            return None  # a server that stops is noticed at the next decision, and said once

        # No reconnecting: when the server goes, the next decision finds no owner (or a new
        # one, connected afresh). The streams are the server's: never created from here.
        nc = await nats.connect(
            server_list(owner.nats_url_for("cli")),
            name="hpc-ds1-python",
            allow_reconnect=False,
            connect_timeout=CONNECT_S - 1,
            error_cb=quiet,
        )
        return EventBus(nc, settings)

    def _close_bus(self) -> None:
        bus, self._bus = self._bus, None
        if bus is not None and self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.run(bus.nc.close(), 2.0)

    def close(self) -> None:
        """Close the connection (at exit by itself)."""
        self._close_bus()
