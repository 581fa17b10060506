"""The remote agent: one device of the fleet, talking to the coordinator over HTTP only
(outbound; the device needs no open port).

    Agent("https://coordinator:8765", JOIN_TOKEN, ca_pin="sha256:…").run()

On its first start it trades the join token (with its hardware fingerprint) for the device's
own credential, kept in `$HOME/credentials/device.json` (0600); a restart reuses it, so the
device keeps its identity. Over https with a CA pin (the join command's --ca-cert-hash) it
first fetches the server's chain, keeps the CA that hashes to the pin (in
`credentials/coordinator-ca.pem` beside the credential, its pin in device.json) and from then
on, the join included, talks only to a server whose chain ends at that CA: one that does not
is refused, saying which CA was expected and what it presented (at the join the agent stops;
later, say an impostor on the coordinator's address, each call is refused and retried with
back-off, nothing is sent). Without a pin an https server must satisfy the system trust store
(a site certificate). It then
- uploads the measurements and the model that `hpc-ds1 setup` recorded in its own home, at
  start and whenever the home's model changes (models/latest.json), opening the home's log and
  database only for the moment it reads them;
- says it is alive every heartbeat_interval_s (with the task it runs and for how long);
- long-polls for work; each attempt is announced (started), run for real under the home's
  device lock (capped at settings.max_run_s), and its result posted until the coordinator
  accepts it (a duplicate is recorded once).
`stop()` (or SIGINT/SIGTERM when `run()` is on the main thread) kills a running job and returns
within seconds. A refused credential (revoked or wrong) ends `run()` with CredentialRefused;
an unreachable coordinator is retried with back-off. The token is never logged."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..infra import tls
from ..log import get_logger
from ..machine.devicelock import Cancelled, device_lock
from ..requests import SAFE_ID, SAFE_ID_RULE
from ..settings import Settings
from .client import (
    REFUSED_CREDENTIAL,
    AgentClient,
    Conflict,
    CredentialRefused,
    FleetError,
    Forbidden,
    Identity,
    ServerError,
    TooManyRequests,
    Trust,
    Unreachable,
    UntrustedServer,
    base_url,
    ca_file,
    device_file,
    load_identity,
    pinned_trust,
    save_identity,
)
from .execute import TaskResult, describe, refused, run_work_item, stopped
from .slurm import SlurmPartition
from .work import WorkItem

log = get_logger("fleet-agent")
T = TypeVar("T")

STOP_GRACE_S = 10.0  # a stop waits this long for the killed job's result to go out
STOPPED_POST_S = 3.0  # the last result of a stopped job gets one short try
MAX_BACKOFF_S = 30.0
EMPTY_POLL_PAUSE_S = 1.0
SYNC_RETRY_S = 60.0  # a failed upload of measurements/model is tried again after this
MAX_POST_BYTES = 800_000  # measurements per post stay under the gateway's 1 MiB body limit
MEASUREMENT_FIELDS = (
    "measurement_id",
    "workload",
    "size",
    "config",
    "status",
    "runtime_s",
    "throughput",
    "throughput_unit",
    "repeats",
    "spread",
    "check_ok",
    "check_error",
    "held_out",
    "purpose",
)


# --- the home's model -------------------------------------------------------------------


class ModelWatch:
    """Which model the home holds now (models/latest.json, written by the trainer)."""

    def __init__(self, models_dir: Path) -> None:
        self.models_dir = Path(models_dir)

    def version(self) -> str | None:
        try:
            raw = json.loads((self.models_dir / "latest.json").read_text())
        except (FileNotFoundError, ValueError):
            return None
        version = raw.get("version") if isinstance(raw, dict) else None
        return str(version) if version else None

    def artifact(self, version: str) -> Path:
        return self.models_dir / f"{version}.onnx"


def has_setup(settings: Settings) -> bool:
    """Whether the home has a log and database to read (set up, or configured external)."""
    from ..infra.home import running_owner

    if settings.database_url and settings.nats_url:
        return True
    return (settings.home / "postgres").exists() or running_owner(settings.home) is not None


@dataclass(frozen=True)
class HomeSnapshot:
    measurements: list[dict[str, Any]]
    model: dict[str, Any] | None  # {version, data, sha256, trained_on, metrics}


async def read_home(settings: Settings, version: str | None) -> HomeSnapshot:
    """The home's own measurements and its model `version`, read through the home's running
    `serve` or, when none runs, its embedded infrastructure for the duration of the read."""
    from ..stack import open_stack

    async with open_stack(settings, (), "agent-sync") as stack:
        rows, model_row = await asyncio.to_thread(_read_rows, stack.engine, version)
    model = None
    if version is not None:
        path = ModelWatch(settings.models_dir).artifact(version)
        try:
            data = await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:
            log.warning("model_file_missing", version=version, path=str(path))
        else:
            trained_on = (
                int(model_row["trained_on"])
                if model_row
                else sum(1 for r in rows if r["status"] == "ok" and not r["held_out"])
            )
            model = {
                "version": version,
                "data": data,
                "sha256": hashlib.sha256(data).hexdigest(),
                "trained_on": trained_on,
                "metrics": (model_row or {}).get("metrics") or {},
            }
    return HomeSnapshot(rows, model)


def _read_rows(engine: Any, version: str | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from sqlalchemy import select

    from ..db import tables

    m, d, models = tables.measurements, tables.devices, tables.models
    with engine.connect() as conn:
        local = select(d.c.device_id).where(d.c.local.is_(True))
        query = select(*(m.c[f] for f in MEASUREMENT_FIELDS)).where(m.c.device_id.in_(local))
        rows = [dict(r._mapping) for r in conn.execute(query.order_by(m.c.seq))]
        model_row: dict[str, Any] = {}
        if version is not None:
            found = conn.execute(
                select(models.c.trained_on, models.c.metrics).where(
                    models.c.model_version == version
                )
            ).first()
            if found is not None:
                model_row = dict(found._mapping)
    return rows, model_row


def measurement_chunks(
    rows: list[dict[str, Any]], max_bytes: int = MAX_POST_BYTES
) -> list[list[dict[str, Any]]]:
    """Rows in posts of at most `max_bytes` of JSON (and at most 5000 rows)."""
    from .client import MAX_MEASUREMENTS_PER_POST

    chunks: list[list[dict[str, Any]]] = [[]]
    size = 0
    for row in rows:
        n = len(json.dumps(row, default=str)) + 2
        if chunks[-1] and (size + n > max_bytes or len(chunks[-1]) >= MAX_MEASUREMENTS_PER_POST):
            chunks.append([])
            size = 0
        chunks[-1].append(row)
        size += n
    return [c for c in chunks if c]


# --- the agent --------------------------------------------------------------------------


def _sweep_leftovers(home: Path) -> None:
    with contextlib.suppress(TimeoutError), device_lock(home, timeout=0):
        pass


class _Stopping(Exception):
    """The agent is stopping: give up what was being retried."""


class Agent:
    """A device of the fleet: `Agent(server, join_token).run()` (see the module docstring)."""

    def __init__(
        self,
        server: str,
        token: str | None,
        *,
        home: str | Path | None = None,
        name: str | None = None,
        slurm_partition: str | None = None,
        ca_pin: str | None = None,
    ) -> None:
        self.server = base_url(server)
        # The CA the join command pins (kubeadm's --discovery-token-ca-cert-hash); ValueError
        # saying the accepted form for anything else, or for a pin without https.
        self.ca_pin = tls.parse_pin(ca_pin) if ca_pin else None
        if self.ca_pin and not self.server.startswith("https://"):
            raise ValueError(f"a CA pin needs an https:// server, not {self.server}")
        if name is not None and not SAFE_ID.match(name):
            raise ValueError(f"name {name!r} is not valid: use {SAFE_ID_RULE}")
        self._join_token = (token or "").strip()  # needed only to join (no device.json yet)
        self.name = name
        self.settings = Settings(home=Path(home)) if home is not None else Settings()
        self.home = self.settings.home
        # A Slurm partition as the device: attempts go through sbatch to its nodes, and the
        # fingerprint is a node's (fleet/slurm.py); None: this machine.
        self.slurm: SlurmPartition | None = (
            SlurmPartition(slurm_partition, self.home / "slurm")
            if slurm_partition is not None
            else None
        )
        self.device_id: str | None = None
        self.identity: Identity | None = None
        self.heartbeat_interval_s = self.settings.heartbeat_interval_s
        self.long_poll_s = self.settings.long_poll_s
        self.on_ready: Callable[[str], None] | None = None  # called with the device id
        self.cancel = threading.Event()  # set on stop: kills the running job
        self.running: tuple[str, float] | None = None  # (task id, monotonic start)
        self.synced_version: str | None = None
        self.completed = 0  # attempts run to a delivered result (for tests and status)
        self._stop_requested = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._busy = False
        self.retry_first_s = 0.5  # the first back-off; it doubles up to MAX_BACKOFF_S
        self.transport: Any = None  # an httpx transport to use (tests); None: the network

    def __repr__(self) -> str:
        return f"Agent({self.server!r}, device_id={self.device_id!r})"

    # --- control --------------------------------------------------------------------------
    def run(self) -> None:
        """Serve as this device until stop() (or SIGINT/SIGTERM on the main thread)."""
        asyncio.run(self.serve())

    def stop(self) -> None:
        """Kill a running job and make run() return within seconds (any thread)."""
        self._stop_requested.set()
        self.cancel.set()
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopping.set)

    async def serve(self) -> None:
        """run() inside a running event loop."""
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        if self._stop_requested.is_set():
            return
        handled = self._install_signals()
        # A job left on record by a previous agent of this home (killed with its guard, say
        # by kill -9) dies now: whoever takes the free device lock kills it.
        await asyncio.to_thread(_sweep_leftovers, self.home)
        client: AgentClient | None = None
        try:
            stored = await asyncio.to_thread(load_identity, self.home, self.server)
            trust = await self._until_stopped(self._trust(stored))
            client = AgentClient(
                self.server, self._join_token, transport=self.transport, trust=trust
            )
            identity = await self._until_stopped(self._identity(client, stored))
            client.use_token(identity.token)
            if self.on_ready is not None:
                self.on_ready(identity.device_id)
            log.info("agent_ready", device_id=identity.device_id, server=self.server)
            await self._serve(client)
        except _Stopping:
            pass
        finally:
            for sig in handled:
                self._loop.remove_signal_handler(sig)
            if client is not None:
                await client.close()
            log.info("agent_stopped", device_id=self.device_id)

    def _install_signals(self) -> list[int]:
        if threading.current_thread() is not threading.main_thread():
            return []
        assert self._loop is not None
        handled: list[int] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                self._loop.add_signal_handler(sig, self.stop)
                handled.append(sig)
        return handled

    async def _serve(self, client: AgentClient) -> None:
        assert self._stopping is not None
        work = asyncio.create_task(self._work_loop(client), name="fleet-work")
        beats = asyncio.create_task(self._heartbeat_loop(client), name="fleet-heartbeat")
        sync = asyncio.create_task(self._sync_loop(client), name="fleet-sync")
        stopping = asyncio.create_task(self._stopping.wait())
        loops = {work, beats, sync}
        try:
            done, _ = await asyncio.wait(loops | {stopping}, return_when=asyncio.FIRST_COMPLETED)
            failed = [t for t in done if t is not stopping and t.exception() is not None]
            if failed:
                self.cancel.set()
                self._stopping.set()
        finally:
            stopping.cancel()
            # A running job was killed by cancel; its result gets a moment to go out.
            if self._busy and not work.done():
                with contextlib.suppress(TimeoutError, asyncio.CancelledError, Exception):
                    await asyncio.wait_for(asyncio.shield(work), STOP_GRACE_S)
            for task in loops:
                task.cancel()
            results = await asyncio.gather(*loops, return_exceptions=True)
        for outcome in results:
            if isinstance(outcome, FleetError):
                raise outcome
        for outcome in results:
            if isinstance(outcome, BaseException) and not isinstance(
                outcome, (asyncio.CancelledError, _Stopping)
            ):
                raise outcome

    # --- waiting and retrying ----------------------------------------------------------------
    async def _until_stopped(self, work: Awaitable[T]) -> T:
        """`work`, abandoned (raising _Stopping) as soon as the agent stops."""
        assert self._stopping is not None
        task = asyncio.ensure_future(work)
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise _Stopping
        return task.result()

    async def _pause(self, seconds: float) -> None:
        """Sleep, or raise _Stopping as soon as the agent stops."""
        assert self._stopping is not None
        if self._stopping.is_set():
            raise _Stopping
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)
        if self._stopping.is_set():
            raise _Stopping

    async def _retrying(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """`call()` until it gets an answer: an unreachable or failing coordinator is tried
        again with back-off (0.5 s doubling to 30 s), a 429 after its Retry-After; a refusal
        is raised."""
        delay, failures, untrusted = self.retry_first_s, 0, 0
        while True:
            try:
                found = await call()
            except TooManyRequests as error:
                failures += 1
                if failures == 1 or failures % 10 == 0:
                    log.warning("coordinator_busy", doing=what, retry_in_s=error.retry_after_s)
                await self._pause(error.retry_after_s)
                continue
            except (Unreachable, ServerError) as error:
                failures += 1
                if failures == 1 or failures % 10 == 0:
                    log.warning("coordinator_unavailable", doing=what, error=str(error))
                await self._pause(delay)
                delay = min(delay * 2, MAX_BACKOFF_S)
                continue
            except UntrustedServer as error:
                if self.device_id is None:
                    raise  # at the join: the pin or the address is wrong; said, and the end
                # Later (an impostor on the coordinator's address, a certificate of another
                # CA put in place): refused, nothing sent, tried again with back-off, loudly.
                failures += 1
                untrusted += 1
                if untrusted == 1 or untrusted % 10 == 0:
                    log.error("coordinator_untrusted", doing=what, error=str(error))
                await self._pause(delay)
                delay = min(delay * 2, MAX_BACKOFF_S)
                continue
            if failures:
                log.info("coordinator_reachable", doing=what, after_failures=failures)
            return found

    # --- identity ------------------------------------------------------------------------
    async def _trust(self, stored: Identity | None) -> Trust | None:
        """What this agent's calls trust: the stored identity's pinned CA; at the join, the CA
        of the server's chain that hashes to the pin (retried while unreachable); without a
        pin, the system trust store (https) or nothing (http)."""
        if stored is not None:
            if self.ca_pin and stored.ca_pin != self.ca_pin:
                raise FleetError(
                    f"{device_file(self.home)} joined {stored.server} trusting "
                    f"{stored.ca_pin or 'no pinned CA'}, not the {self.ca_pin} given: delete it "
                    f"(and {ca_file(self.home).name}) to join again with the new pin"
                )
            return stored.trust
        if not self.server.startswith("https://"):
            return None
        if self.ca_pin is None:
            return Trust()
        pin = self.ca_pin
        return await self._retrying(
            "read the coordinator's certificate",
            lambda: asyncio.to_thread(pinned_trust, self.server, pin),
        )

    async def _identity(self, client: AgentClient, found: Identity | None) -> Identity:
        if found is None:
            found = await self._join(client)
            path = await asyncio.to_thread(save_identity, self.home, found)
            log.info("device_joined", device_id=found.device_id, identity=str(path))
        else:
            log.info("device_identity_reused", device_id=found.device_id)
        self.identity = found
        self.device_id = found.device_id
        if found.heartbeat_interval_s:
            self.heartbeat_interval_s = float(found.heartbeat_interval_s)
        if found.long_poll_s:
            self.long_poll_s = float(found.long_poll_s)
        return found

    async def _join(self, client: AgentClient) -> Identity:
        from ..machine.hardware import fingerprint

        if not self._join_token:
            raise FleetError(
                f"{device_file(self.home)} holds no identity for {self.server}: a join token "
                "is needed (`hpc-ds1 token join` on the coordinator prints it)"
            )

        if self.slurm is not None:
            hardware = await asyncio.to_thread(self.slurm.fingerprint)
            hostname = hardware.hostname
        else:
            hardware = await asyncio.to_thread(fingerprint)
            hostname = socket.gethostname()
        try:
            answer = await self._retrying(
                "join",
                lambda: client.join(
                    self._join_token, hostname, hardware.model_dump(mode="json"), self.name
                ),
            )
        except CredentialRefused as error:
            said = str(error).removeprefix(REFUSED_CREDENTIAL).strip()  # (server: its reason)
            raise CredentialRefused(
                f"{REFUSED_CREDENTIAL}: the join token is wrong or was rotated, or it expired "
                "or was used up (`hpc-ds1 token join` on the coordinator prints the current "
                f"one) {said}",
                error.status,
            ) from None
        except Conflict as error:
            raise Conflict(f"cannot join: {error}", error.status) from None
        trust = client.trust
        return Identity(
            server=self.server,
            device_id=str(answer["device_id"]),
            token=str(answer["token"]),
            token_id=str(answer["token_id"]),
            heartbeat_interval_s=answer.get("heartbeat_interval_s"),
            long_poll_s=answer.get("long_poll_s"),
            ca_pin=trust.pin if trust else None,
            ca_pem=trust.ca_pem if trust else None,
        )

    def _refused(self, error: CredentialRefused) -> CredentialRefused:
        where = device_file(self.home)
        return CredentialRefused(
            f"{REFUSED_CREDENTIAL}: device {self.device_id} may have been revoked "
            f"(delete {where} to join again with a join token)",
            error.status,
        )

    # --- heartbeats ------------------------------------------------------------------------
    async def _heartbeat_loop(self, client: AgentClient) -> None:
        failures = untrusted = 0
        while True:
            running = self.running
            try:
                try:
                    await client.heartbeat(
                        running[0] if running else None,
                        time.monotonic() - running[1] if running else None,
                    )
                except Forbidden as error:
                    if running is None:
                        raise
                    # The coordinator no longer counts the task as this device's (its attempt
                    # moved on): the device is still alive, so it says so without the task.
                    log.warning("heartbeat_task_refused", task_id=running[0], error=str(error))
                    await client.heartbeat(None, None)
                if failures:
                    log.info("heartbeat_resumed", after_failures=failures)
                failures = untrusted = 0
            except CredentialRefused as error:
                raise self._refused(error) from None
            except UntrustedServer as error:  # nothing was sent; said as loudly as the poll does
                failures += 1
                untrusted += 1
                if untrusted == 1 or untrusted % 10 == 0:
                    log.error("coordinator_untrusted", doing="take a heartbeat", error=str(error))
            except FleetError as error:
                failures += 1
                if failures == 1 or failures % 10 == 0:
                    log.warning("heartbeat_failed", error=str(error), failures=failures)
            await self._pause(self.heartbeat_interval_s)

    # --- measurements and model ------------------------------------------------------------
    async def _sync_loop(self, client: AgentClient) -> None:
        watch = ModelWatch(self.settings.models_dir)
        if not await asyncio.to_thread(has_setup, self.settings):
            log.warning(
                "no_setup",
                home=str(self.home),
                note="this home has no measurements: placement can predict nothing for this "
                "device until `hpc-ds1 setup` runs here (the agent then uploads them)",
            )
        synced: str | None = None
        first = True
        while True:
            version = await asyncio.to_thread(watch.version)
            if first or version != synced:
                try:
                    await self.sync(client, version)
                    synced, first = version, False
                except CredentialRefused as error:
                    raise self._refused(error) from None
                except (FleetError, OSError, TimeoutError, RuntimeError) as error:
                    log.warning("sync_failed", error=str(error), retry_in_s=SYNC_RETRY_S)
                    await self._pause(SYNC_RETRY_S)
                    continue
            await self._pause(max(self.heartbeat_interval_s, 2.0))

    async def sync(self, client: AgentClient, version: str | None) -> None:
        """Upload the home's measurements, then its model `version` (when it has one)."""
        if not await asyncio.to_thread(has_setup, self.settings):
            return
        snapshot = await read_home(self.settings, version)
        accepted = known = refused = 0
        for chunk in measurement_chunks(snapshot.measurements):
            answer = await self._retrying(
                "upload measurements", functools.partial(client.measurements, chunk)
            )
            accepted += answer["accepted"]
            known += answer["known"]
            refused += answer.get("refused", 0)
        if snapshot.model is not None:
            model = snapshot.model
            await self._retrying(
                "upload the model",
                lambda: client.model(
                    model["version"],
                    model["data"],
                    sha256=model["sha256"],
                    trained_on=model["trained_on"],
                    metrics=model["metrics"],
                ),
            )
        self.synced_version = version
        log.info(
            "home_synced",
            measurements=len(snapshot.measurements),
            accepted=accepted,
            known=known,
            refused=refused,
            model=version,
        )

    # --- work ------------------------------------------------------------------------------
    async def _work_loop(self, client: AgentClient) -> None:
        while True:
            asked = time.monotonic()
            try:
                item = await self._retrying("wait for work", lambda: client.work(self.long_poll_s))
            except CredentialRefused as error:
                raise self._refused(error) from None
            except FleetError as error:  # a 4xx: not worth hammering
                log.error("work_poll_refused", error=str(error))
                if error.status == 422 and self.long_poll_s > 1.0:
                    # The coordinator holds polls for less than it said when this device
                    # joined (its long_poll_s changed): ask for shorter ones.
                    self.long_poll_s = max(1.0, self.long_poll_s / 2)
                    continue
                await self._pause(MAX_BACKOFF_S)
                continue
            if item is not None:
                await self.handle(client, item)
            elif time.monotonic() - asked < EMPTY_POLL_PAUSE_S:
                # A server that answers "no work" at once (not holding the poll) is not asked
                # again in a tight loop.
                await self._pause(EMPTY_POLL_PAUSE_S)

    async def handle(self, client: AgentClient, item: WorkItem) -> TaskResult | None:
        """Announce, run and report one attempt; the delivered result (None: not run)."""
        assert self.device_id is not None
        # Running from the moment the start is announced: whoever sees the task running (the
        # coordinator, a heartbeat) sees this agent holding it.
        self.running = (item.task_id, time.monotonic())
        try:
            await self._retrying(
                "announce a start", lambda: client.started(item.task_id, item.attempt)
            )
        except Conflict as error:
            self.running = None
            log.info(
                "attempt_not_current", task_id=item.task_id, attempt=item.attempt, why=str(error)
            )
            return None
        except CredentialRefused as error:
            self.running = None
            raise self._refused(error) from None
        except BaseException:
            self.running = None
            raise
        self._busy = True
        log.info(
            "task_started",
            task_id=item.task_id,
            attempt=item.attempt,
            workload=item.workload,
            size=item.size,
        )
        try:
            try:
                result = await asyncio.to_thread(
                    run_work_item,
                    item,
                    home=self.home,
                    max_run_s=self.settings.max_run_s,
                    cancel=self.cancel,
                    slurm=self.slurm,
                )
            except Cancelled:
                result = stopped(item, self.device_id)
                await self._last_word(client, item, result)
                return result
            except Exception as error:  # e.g. an OSError on the device lock: still a result
                log.error("task_error", task_id=item.task_id, error=repr(error))
                result = refused(item, f"{type(error).__name__}: {error}")
            finally:
                self.running = None
            if self.cancel.is_set():  # stopped just as it ended: one short try
                await self._last_word(client, item, result)
                return result
            await self.deliver(client, item, result)
            return result
        finally:
            self._busy = False

    async def deliver(self, client: AgentClient, item: WorkItem, result: TaskResult) -> None:
        """Post the result until the coordinator answers (it records a duplicate once)."""
        try:
            answer = await self._retrying(
                "report a result", lambda: client.result(item.task_id, result)
            )
        except Conflict as error:
            log.info("result_not_current", task_id=item.task_id, why=str(error))
            return
        except CredentialRefused as error:
            raise self._refused(error) from None
        except FleetError as error:
            log.error("result_refused", task_id=item.task_id, error=str(error))
            return
        self.completed += 1
        log.info(
            "task_reported",
            task_id=item.task_id,
            attempt=item.attempt,
            result=describe(result),
            recorded=answer.get("recorded"),
        )

    async def _last_word(self, client: AgentClient, item: WorkItem, result: TaskResult) -> None:
        try:
            await asyncio.wait_for(client.result(item.task_id, result), STOPPED_POST_S)
            log.info("task_reported", task_id=item.task_id, result=describe(result))
        except (FleetError, TimeoutError) as error:
            log.warning("result_not_reported", task_id=item.task_id, error=str(error))
