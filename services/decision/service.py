"""Answers decide requests: load the device's model, run the job first when no telemetry is
given, decide in one forward pass, record the decision event.

Each request is answered in a task of its own (at most MAX_IN_FLIGHT at once, at most
MAX_RUNS_WAITING of them waiting for a real run), so a decision never waits behind a run: runs
queue on the device's agent. A run whose expected duration exceeds HPC_DS1_MAX_RUN_S is refused
(422) before anything runs, with the estimate and how it was made.

A request carrying `Hpc-Idempotency-Id` (the gateway derives it from the caller's token and
`Idempotency-Key`) is decided once: that id is the decision's id and its event's, a retry is
answered with the stored original before anything runs, and the same id for a different request
is a 422 (hpc_ds1.eventlog.idempotency)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from typing import Any, Literal

import orjson
from nats.js.kv import KeyValue
from pydantic import ValidationError
from sqlalchemy import Engine, select

from hpc_ds1.db import tables
from hpc_ds1.db.reads import latest_model
from hpc_ds1.eventlog.claims import claim, claims_bucket, held, holding
from hpc_ds1.eventlog.idempotency import (
    ID_HEADER,
    KeyReused,
    Stored,
    append_once,
    find,
    request_sha256,
)
from hpc_ds1.eventlog.subjects import agent_run_subject
from hpc_ds1.events import DecisionMade, envelope, new_id
from hpc_ds1.log import get_logger
from hpc_ds1.machine.hardware import Fingerprint
from hpc_ds1.models_store import MODELS_BUCKET
from hpc_ds1.process.runtime import ServiceContext
from hpc_ds1.process.singleflight import SingleFlight
from hpc_ds1.requests import RUN_REPEATS, DecideRequest, RunRequest
from hpc_ds1.runner.estimate import (
    RuntimeEstimate,
    RunTooLong,
    check_cap,
    from_measurements,
    from_model,
    load_measured,
)
from hpc_ds1.space import Config, ConfigSpace, InfeasibleConfig

log = get_logger("decision")

DEVICE_CACHE_S = 5.0
SYSTEM1_CACHE = 4096  # System 1 answers kept (per model, device, workload and size)
MAX_IN_FLIGHT = 256  # decisions being answered at once; more get 503 at once
MAX_RUNS_WAITING = 32  # of them, waiting for a real run on an agent
STOP_GRACE_S = 5.0
CLAIM_POLL_S = 0.2  # how often a replica waiting on another's claim looks for its event
SAFE_KEY_ID = re.compile(r"^[0-9a-f]{32}$")


def run_timeout_s(max_run_s: float) -> float:
    """How long to wait for an agent's run: the capped run and one capped run queued ahead of
    it; a little less than the gateway waits (2 x cap + 30 s), so the gateway gets this answer."""
    return 2 * max_run_s + 20.0


def claim_wait_s(max_run_s: float) -> float:
    """How long a replica waits for another's keyed decision: as long as that one waits for
    its run, and the decision after it."""
    return run_timeout_s(max_run_s) + 10.0


class DecisionError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _local_device(engine: Engine) -> tuple[str, dict[str, Any]] | None:
    t = tables.devices
    with engine.connect() as conn:
        row = conn.execute(
            select(t.c.device_id, t.c.fingerprint)
            .where(t.c.local.is_(True))
            .order_by(t.c.seq.desc())
        ).first()
    return None if row is None else (row[0], dict(row[1]))


def _device(engine: Engine, device_id: str) -> dict[str, Any] | None:
    t = tables.devices
    with engine.connect() as conn:
        row = conn.execute(select(t.c.fingerprint).where(t.c.device_id == device_id)).first()
    return None if row is None else dict(row[0])


class DecisionService:
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self._models: dict[str, Any] = {}  # device id -> Model
        self._devices: dict[str | None, tuple[float, tuple[str, Fingerprint]]] = {}
        self._device_flights: SingleFlight[tuple[str, Fingerprint]] = SingleFlight()
        # One keyed decision in flight per (key id, request) on a replica: a retry that arrives
        # while the first is still running its job joins it instead of running it again.
        self._keyed: SingleFlight[tuple[dict[str, Any], bool]] = SingleFlight()
        self._tasks: set[asyncio.Task[None]] = set()
        self._runs_waiting = 0
        self.answered = 0  # requests this replica took (its status tells replicas apart)
        self._system1: dict[tuple[str, str, str, int], dict[str, Any] | None] = {}
        self._claims_kv: KeyValue | None = None
        self.holder = f"{ctx.name}-{new_id()[:12]}"  # this replica, as a claim names it
        # Set by run(): the model stack's imports in a thread; answers wait for it off the loop.
        self.warmed: asyncio.Future[None] | None = None

    async def forget_models(self, msg: Any) -> None:
        self._models.clear()
        self._system1.clear()

    def in_flight(self) -> int:
        return len(self._tasks)

    async def handle(self, msg: Any) -> None:
        """The subscription's callback: answers in a task of its own, so it returns at once."""
        if len(self._tasks) >= MAX_IN_FLIGHT:
            busy = f"busy: {MAX_IN_FLIGHT} decisions are being answered; try again shortly"
            await _respond(msg, {"ok": False, "status": 503, "error": busy})
            return
        self.answered += 1
        task = asyncio.create_task(self._answer(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, msg: Any) -> None:
        headers = msg.headers or {}
        actor = headers.get("Hpc-Actor", "anonymous")
        try:
            if self.warmed is not None:
                await asyncio.shield(self.warmed)
            request = DecideRequest.model_validate_json(msg.data)
            key_id = headers.get(ID_HEADER)
            if key_id is None:
                reply: dict[str, Any] = {"ok": True, "decision": await self.decide(request, actor)}
            else:
                body, replayed = await self.decide_once(request, actor, key_id)
                reply = {"ok": True, "decision": body, "replayed": replayed}
        except KeyReused as error:
            reply = {"ok": False, "status": 422, "error": str(error)}
        except ValidationError as error:
            reply = {"ok": False, "status": 422, "error": error.errors(include_url=False)}
        except DecisionError as error:
            reply = {"ok": False, "status": error.status, "error": str(error)}
        except asyncio.CancelledError:
            reply = {"ok": False, "status": 503, "error": "the decision service is stopping"}
        except Exception as error:
            log.error("decide_failed", error=repr(error))
            reply = {"ok": False, "status": 500, "error": f"{type(error).__name__}: {error}"}
        await _respond(msg, reply)

    async def stop(self) -> None:
        """Let the decisions under way finish for a moment, then cancel (and answer) the rest."""
        if not self._tasks:
            return
        _, late = await asyncio.wait(set(self._tasks), timeout=STOP_GRACE_S)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)

    async def _model(self, device_id: str) -> Any:
        from hpc_ds1.model import Model

        if device_id in self._models:
            return self._models[device_id]
        found = await asyncio.to_thread(latest_model, self.ctx.engine, device_id)
        if found is None:
            raise DecisionError(
                409, f"no model for device {device_id} yet: run `hpc-ds1 setup --quick` on it"
            )
        version, key = found
        local = self.ctx.settings.models_dir / f"{version}.onnx"
        if local.exists():
            data = await asyncio.to_thread(local.read_bytes)
        else:
            store = await self.ctx.bus.js.object_store(
                f"{MODELS_BUCKET}_{self.ctx.settings.stream}"
            )
            data = (await store.get(key)).data or b""
        model = await asyncio.to_thread(
            Model.from_untrusted, data, self.ctx.settings.max_model_bytes
        )
        self._models[device_id] = model
        return model

    async def _device(self, device_id: str | None) -> tuple[str, Fingerprint]:
        # Devices change rarely; a short cache keeps the database off the per-decision path.
        cached = self._devices.get(device_id)
        if cached is not None and time.monotonic() - cached[0] < DEVICE_CACHE_S:
            return cached[1]
        return await self._device_flights.do(device_id, lambda: self._refresh_device(device_id))

    async def _refresh_device(self, device_id: str | None) -> tuple[str, Fingerprint]:
        found_id, raw = await self._lookup_device(device_id)
        found = (found_id, Fingerprint.model_validate(raw))
        self._devices[device_id] = (time.monotonic(), found)
        return found

    async def _lookup_device(self, device_id: str | None) -> tuple[str, dict[str, Any]]:
        if device_id is None:
            local = await asyncio.to_thread(_local_device, self.ctx.engine)
            if local is None:
                raise DecisionError(409, "no device has joined yet: is the agent running?")
            return local
        fingerprint = await asyncio.to_thread(_device, self.ctx.engine, device_id)
        if fingerprint is None:
            raise DecisionError(404, f"unknown device {device_id}")
        return device_id, fingerprint

    async def decide_once(
        self, request: DecideRequest, actor: str, key_id: str
    ) -> tuple[dict[str, Any], bool]:
        """The decision of an idempotent request and whether it is a replay: the stored
        original when its id was decided before (nothing runs again), else a new one."""
        if not SAFE_KEY_ID.match(key_id):
            raise DecisionError(422, f"{ID_HEADER} must be 32 hex digits")
        request_hash = request_sha256(request.model_dump_json().encode())
        flight = (key_id, request_hash)
        joined = self._keyed.running(flight)
        body, replayed = await self._keyed.do(
            flight, lambda: self._decide_keyed(request, actor, key_id, request_hash)
        )
        return body, replayed or joined

    async def _decide_keyed(
        self, request: DecideRequest, actor: str, key_id: str, request_hash: str
    ) -> tuple[dict[str, Any], bool]:
        subject = f"{self.ctx.settings.subject_prefix}.decision.{key_id}.made"
        original = await find(self.ctx.bus, subject, request_hash)
        if original is not None:
            return _replayed(original), True
        # Another replica may have the same key's copy: one of them runs it
        # (hpc_ds1.eventlog.claims).
        claims = await self._claims()
        deadline = time.monotonic() + claim_wait_s(self.ctx.settings.max_run_s)
        while (revision := await claim(claims, key_id, self.holder)) is None:
            while await held(claims, key_id):
                original = await find(self.ctx.bus, subject, request_hash)
                if original is not None:
                    return _replayed(original), True
                if time.monotonic() > deadline:
                    raise DecisionError(
                        503, "another decision replica is still answering this Idempotency-Key"
                    )
                await asyncio.sleep(CLAIM_POLL_S)
            # Released after a failure, or expired with its holder: decided, or ours to try.
            original = await find(self.ctx.bus, subject, request_hash)
            if original is not None:
                return _replayed(original), True
        async with holding(claims, key_id, self.holder, revision):
            # Decided between the look-up above and the claim.
            original = await find(self.ctx.bus, subject, request_hash)
            if original is not None:
                return _replayed(original), True
            stored: list[Stored] = []
            body = await self.decide(request, actor, key_id, request_hash, stored)
            return (_replayed(stored[0]), True) if stored else (body, False)

    async def _claims(self) -> KeyValue:
        if self._claims_kv is None:
            self._claims_kv = await claims_bucket(self.ctx.bus.js, self.ctx.settings)
        return self._claims_kv

    async def decide(
        self,
        request: DecideRequest,
        actor: str,
        key_id: str | None = None,
        request_hash: str = "",
        replayed: list[Stored] | None = None,
    ) -> dict[str, Any]:
        """Decide and record it. With `key_id` the decision and its event take that id and the
        append is idempotent: a copy appended first is put in `replayed`."""
        from hpc_ds1.model import State, Thresholds
        from hpc_ds1.workloads import UnknownWorkload, get_workload

        device_id, fingerprint = await self._device(request.device_id)
        model = await self._model(device_id)
        try:
            workload = get_workload(request.workload)
            known = ConfigSpace.for_device(fingerprint, workload)
            space: ConfigSpace | None = known
            tile = request.config.tile or workload.default_tile
            block = workload.default_block
            knobs = known.knob_values(request.config.knobs)
        except UnknownWorkload:
            workload, space, tile, block = None, None, request.config.tile or 1, 0
            knobs = dict(request.config.knobs or {})
        config = Config(
            ranks=request.config.ranks,
            threads=request.config.threads,
            tile=tile,
            block=block if request.config.block is None else request.config.block,
            gpu=request.config.gpu,
            knobs=tuple(knobs.items()),
        )
        outside: str | None = None
        if space is not None:
            try:
                space.runnable().validate(config)
            except InfeasibleConfig as error:
                raise DecisionError(422, str(error)) from None
            outside = space.problem(config)
        telemetry = request.telemetry.model_dump() if request.telemetry else None
        ran = False
        notes: list[str] = []
        if telemetry is None and workload is not None:
            await self._check_cap(device_id, model, request, config)
            telemetry, note = await self._observe(device_id, request, config, actor)
            ran = True
            notes += [note] if note else []
        state = State(
            workload=request.workload,
            size=request.size,
            config=config,
            runtime_s=(telemetry or {}).get("runtime_s"),
            throughput=(telemetry or {}).get("throughput"),
        )
        thresholds = Thresholds(
            auto=self.ctx.settings.auto_threshold,
            escalate=self.ctx.settings.escalate_threshold,
            min_auroc=self.ctx.settings.min_auroc,
        )
        # From the user's own configuration outside the tuned space, moves may pass through
        # the runnable space on the way back (the guard reason below escalates it anyway).
        moves_space = space.runnable() if (space is not None and outside) else space
        decision = model.decide(
            state, thresholds=thresholds, space=moves_space, fingerprint=fingerprint
        )
        if outside:
            notes.append(
                f"the configuration is outside the space measured on this machine: {outside}"
            )
        reasons = list(decision.reasons) + notes
        mode: Literal["auto", "confirm", "escalate"] = "escalate" if notes else decision.mode
        event = DecisionMade(
            decision_id=key_id or new_id(),
            device_id=device_id,
            source=request.source,
            workload=request.workload,
            size=request.size,
            config=config.model_dump(),
            choice=decision.choice,
            confidence=decision.confidence,
            mode=mode,
            reasons=reasons,
            alternatives=decision.alternatives,
            model_version=decision.model_version,
            session_id=request.session_id,
        )
        env = envelope(
            event,
            actor=actor,
            source="decision",
            prefix=self.ctx.settings.subject_prefix,
            event_id=key_id,
        )
        extras = {
            "telemetry": telemetry,
            "ran": ran,
            "predicted_runtime_s": decision.predicted_runtime_s,
            "predicted_runtimes_s": decision.predicted_runtimes_s,
            "familiarity": {
                "distance": decision.distance,
                "threshold": decision.distance_threshold,
                "familiar": decision.distance is None
                or decision.distance_threshold is None
                or decision.distance <= decision.distance_threshold,
            },
            "system1": self._recommend(
                model, device_id, request.workload, request.size, space, thresholds, fingerprint
            ),
        }
        if key_id is None:
            await self.ctx.bus.publish(env)
        else:
            original = await append_once(self.ctx.bus, env, request_hash, extras)
            if original is not None and replayed is not None:
                replayed.append(original)
        return {**event.model_dump(mode="json"), **extras, "actor": actor}

    def _recommend(
        self,
        model: Any,
        device_id: str,
        workload: str,
        size: int,
        space: ConfigSpace | None,
        thresholds: Any,
        fingerprint: Fingerprint,
    ) -> dict[str, Any] | None:
        """System 1 for the job (the whole configuration before anything runs), cached: it does
        not depend on the configuration or telemetry. None for a workload not in the registry."""
        if space is None:
            return None
        key = (str(model.version), device_id, workload, size)
        if key in self._system1:
            return self._system1[key]
        try:
            rec = model.recommend(
                workload, size, thresholds=thresholds, space=space, fingerprint=fingerprint
            )
            found: dict[str, Any] | None = {
                "config": rec.config.model_dump(),
                "label": rec.config.label(),
                "predicted_runtime_s": rec.predicted_runtime_s,
                "confidence": rec.confidence,
                "mode": rec.mode,
                "reasons": list(rec.reasons),
                # every configuration's predicted runtime: a session's PICK compares its best
                "predicted_runtimes_s": dict(rec.alternatives),
            }
        except ValueError as error:  # no feasible configuration: the move decision stands
            log.warning("no_system1", workload=workload, size=size, error=str(error))
            found = None
        if len(self._system1) >= SYSTEM1_CACHE:
            self._system1.clear()
        self._system1[key] = found
        return found

    async def estimate(
        self, device_id: str, model: Any, request: DecideRequest, config: Config
    ) -> RuntimeEstimate | None:
        """The expected duration of the run a decision without telemetry makes: scaled from the
        nearest measurement by the workload's declared work, else the model's prediction."""
        from hpc_ds1.workloads import get_workload

        workload = get_workload(request.workload)
        engine = self.ctx.engine
        try:
            measured = await asyncio.to_thread(load_measured, engine, device_id, workload.name)
        except Exception as error:  # the model's estimate then
            log.warning("no_measured_basis", error=repr(error))
            measured = []
        found = from_measurements(workload, request.size, config, measured, RUN_REPEATS)
        if found is None:
            with contextlib.suppress(Exception):  # a model that cannot say gives no estimate
                per_run = float(model.predict_runtime(workload.name, request.size, config))
                found = from_model(per_run, RUN_REPEATS, str(model.version))
        return found

    async def _check_cap(
        self, device_id: str, model: Any, request: DecideRequest, config: Config
    ) -> None:
        found = await self.estimate(device_id, model, request, config)
        try:
            check_cap(found, self.ctx.settings.max_run_s, request.workload, request.size)
        except RunTooLong as error:
            raise DecisionError(422, str(error)) from None

    async def _observe(
        self, device_id: str, request: DecideRequest, config: Config, actor: str
    ) -> tuple[dict[str, Any] | None, str | None]:
        """Run the job once for real on the device's agent; (telemetry, note when it failed)."""
        if self._runs_waiting >= MAX_RUNS_WAITING:
            raise DecisionError(
                503,
                f"busy: {MAX_RUNS_WAITING} decisions are already waiting for a real run; "
                "try again later, or send telemetry to decide without running",
            )
        ask = RunRequest(
            workload=request.workload,
            size=request.size,
            config=config.model_dump(),
            repeats=RUN_REPEATS,
            purpose="decide",
            actor=actor,
        )
        self._runs_waiting += 1
        try:
            reply = await self.ctx.bus.nc.request(
                agent_run_subject(self.ctx.settings, device_id),
                ask.model_dump_json().encode(),
                timeout=run_timeout_s(self.ctx.settings.max_run_s),
            )
        except Exception as error:
            raise DecisionError(
                503, f"the agent of device {device_id} did not answer: {error!r}"
            ) from None
        finally:
            self._runs_waiting -= 1
        body = orjson.loads(reply.data)
        if not body.get("ok"):
            status = body.get("status")
            raise DecisionError(status if status in (422, 503) else 422, str(body.get("error")))
        result = body["result"]
        if result["status"] != "ok":
            why = result.get("error") or result.get("check_detail")
            note = f"the run in the current configuration ended {result['status']}: {why}"
            return None, note
        return {"runtime_s": result["runtime_s"], "throughput": result.get("throughput")}, None


def _replayed(original: Stored) -> dict[str, Any]:
    """The reply of a stored decision: its event, the first reply's extras, its actor."""
    env = original.envelope
    return {**env.get("data", {}), **(original.extras or {"ran": False}), "actor": env.get("actor")}


async def _respond(msg: Any, reply: dict[str, Any]) -> None:
    try:
        await msg.respond(orjson.dumps(reply, default=str))
    except Exception as error:
        log.error("reply_failed", error=repr(error))
