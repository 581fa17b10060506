"""The coordinator's command side: start sessions, and resume every unfinished one at start."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from pydantic import ValidationError
from sqlalchemy import Engine, select

from hpc_ds1.db import tables
from hpc_ds1.db.reads import latest_model
from hpc_ds1.eventlog.bus import ConcurrencyConflict
from hpc_ds1.events import (
    MalformedEvent,
    SessionCancelRequested,
    SessionStarted,
    WarmStart,
    decode,
    envelope,
    new_id,
    typed,
)
from hpc_ds1.log import get_logger
from hpc_ds1.machine.hardware import Fingerprint
from hpc_ds1.process.runtime import ServiceContext
from hpc_ds1.requests import StartSessionRequest
from hpc_ds1.runner import InvalidJob, validate
from hpc_ds1.setup.warm import WarmError, session_warm
from hpc_ds1.space import Config, ConfigSpace
from hpc_ds1.tuning.session import SessionState, evolve
from hpc_ds1.workloads import UnknownWorkload

from .sessions import SessionRunner

log = get_logger("coordinator")


class CommandError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _device(engine: Engine, device_id: str | None) -> tuple[str, dict[str, Any]] | None:
    t = tables.devices
    query = select(t.c.device_id, t.c.fingerprint)
    query = query.where(t.c.device_id == device_id) if device_id else query.where(t.c.local)
    with engine.connect() as conn:
        row = conn.execute(query.order_by(t.c.seq.desc())).first()
    return None if row is None else (row[0], dict(row[1]))


class Coordinator:
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.runners: dict[str, SessionRunner] = {}  # the sessions this coordinator drives
        self._models: dict[str, Any] = {}  # model version -> Model (a version is its content)

    async def _model(self, device_id: str) -> Any | None:
        from hpc_ds1.model import Model
        from hpc_ds1.models_store import models_bucket

        found = await asyncio.to_thread(latest_model, self.ctx.engine, device_id)
        if found is None:
            return None
        version, artifact = found
        if version not in self._models:
            local = self.ctx.settings.models_dir / f"{version}.onnx"
            if local.exists():
                data = await asyncio.to_thread(local.read_bytes)
            else:
                store = await models_bucket(self.ctx.bus.js, self.ctx.settings, create=False)
                if store is None:
                    return None
                data = (await store.get(artifact)).data or b""
            if len(self._models) >= 8:
                self._models.clear()
            self._models[version] = await asyncio.to_thread(
                Model.from_untrusted, data, self.ctx.settings.max_model_bytes
            )
        return self._models[version]

    async def recommended_start(
        self, device_id: str, workload: str, size: int, space: ConfigSpace
    ) -> tuple[Config, str]:
        """Where a session without an explicit start begins: the model's System 1
        recommendation (the runtime model blended with the transfer prior of the trained
        sizes), else, with no model or no answer, the space's default."""
        try:
            model = await self._model(device_id)
            if model is not None:
                found = await asyncio.to_thread(_device, self.ctx.engine, device_id)
                fingerprint = Fingerprint.model_validate(found[1]) if found else None
                rec = await asyncio.to_thread(
                    model.recommend, workload, size, space=space, fingerprint=fingerprint
                )
                if space.problem(rec.config) is None:
                    return rec.config, f"model {model.version}"
        except Exception as error:  # the default start is always there
            log.warning("recommended_start_failed", workload=workload, error=repr(error)[:300])
        return space.default(), "default"

    def spawn(self, session_id: str, owner: str, space: ConfigSpace) -> None:
        runner = SessionRunner(self.ctx, session_id, owner, space)
        task = asyncio.create_task(runner.drive(), name=f"session-{session_id}")
        self.tasks[session_id] = task
        self.runners[session_id] = runner

        def done(_: object) -> None:
            self.tasks.pop(session_id, None)
            self.runners.pop(session_id, None)

        task.add_done_callback(done)

    async def handle_cancel(self, msg: Any) -> None:
        """A cancel.requested event (security.cancels): the session, if this coordinator
        drives it, has its run killed and finishes `interrupted` (SessionRunner.cancel). A
        session driven elsewhere, or resumed later, reads its cancel from the log."""
        try:
            event = typed(decode(msg.data, msg.subject))
        except MalformedEvent as error:
            log.warning("cancel_skipped", subject=msg.subject, error=str(error)[:300])
            return
        if not isinstance(event, SessionCancelRequested):
            return
        runner = self.runners.get(event.session_id)
        if runner is None:
            log.info("cancel_not_driven_here", session_id=event.session_id, by=event.by)
            return
        await runner.cancel(event)

    async def space_for(self, device_id: str | None, workload: str) -> tuple[str, ConfigSpace]:
        found = await asyncio.to_thread(_device, self.ctx.engine, device_id)
        if found is None:
            raise CommandError(
                404 if device_id else 409,
                f"unknown device {device_id}"
                if device_id
                else "no device has joined yet: is the agent running?",
            )
        try:
            space = ConfigSpace.for_device(Fingerprint.model_validate(found[1]), workload)
        except UnknownWorkload as error:
            raise CommandError(422, str(error)) from None
        return found[0], space

    async def handle_start(self, msg: Any) -> None:
        """Every request gets a reply: the session, or `ok: false` with an HTTP-like status
        (409 for a session id already taken, 422 for bad input, 500 for anything else)."""
        actor = (msg.headers or {}).get("Hpc-Actor", "anonymous")
        try:
            request = StartSessionRequest.model_validate_json(msg.data)
            body: dict[str, Any] = {"ok": True, **await self.start(request, actor)}
        except ValidationError as error:
            body = {"ok": False, "status": 422, "error": error.errors(include_url=False)}
        except CommandError as error:
            body = {"ok": False, "status": error.status, "error": str(error)}
        except Exception as error:
            log.error("start_session_failed", error=repr(error)[:500])
            body = {"ok": False, "status": 500, "error": "the coordinator could not start it"}
        try:
            await msg.respond(orjson.dumps(body, default=str))
        except Exception as error:  # no reply subject, or the connection went away
            log.warning("start_session_reply_failed", error=repr(error)[:200])

    async def start(self, request: StartSessionRequest, actor: str) -> dict[str, Any]:
        device_id, space = await self.space_for(request.device_id, request.workload)
        warm = await self.warm_start(device_id, request, space)
        start_from = "request"
        if request.start is None and warm is not None:
            start, start_from = Config.model_validate(warm.plan[0]), "warm"
        elif request.start is None:
            start, start_from = await self.recommended_start(
                device_id, request.workload, request.size, space
            )
        else:
            start = Config(
                ranks=request.start.ranks,
                threads=request.start.threads,
                tile=request.start.tile or space.default().tile,
                block=space.default_block if request.start.block is None else request.start.block,
                gpu=request.start.gpu,
                knobs=tuple(space.knob_values(request.start.knobs).items()),
            )
        try:
            validate(request.workload, request.size, start, space)
        except InvalidJob as error:
            raise CommandError(422, str(error)) from None
        session_id = request.session_id or new_id()
        event = SessionStarted(
            session_id=session_id,
            device_id=device_id,
            workload=request.workload,
            size=request.size,
            start=start.model_dump(),
            wait_for_engineer=request.wait_for_engineer,
            warm=warm,
        )
        try:
            env = envelope(
                event,
                actor=actor,
                source="coordinator",
                prefix=self.ctx.settings.subject_prefix,
                correlation_id=session_id,
            )
        except ValueError as error:  # an id that cannot be a subject token
            raise CommandError(422, str(error)) from None
        try:
            await self.ctx.bus.publish(env, expected_version=0)
        except ConcurrencyConflict:
            raise CommandError(409, f"session {session_id} already exists") from None
        self.spawn(session_id, actor, space)
        log.info(
            "session_started",
            session_id=session_id,
            workload=request.workload,
            size=request.size,
            start=start.label(),
            start_from=start_from,
            warm_from=[f"{w.workload}@{w.device_id}" for w in warm.siblings] if warm else None,
            owner=actor,
        )
        return {
            "session_id": session_id,
            "device_id": device_id,
            "start": start.model_dump(),
            "warm": None if warm is None else warm.model_dump(),
        }

    async def warm_start(
        self, device_id: str, request: StartSessionRequest, space: ConfigSpace
    ) -> WarmStart | None:
        """The session's warm start from the fleet's measurements in the projection
        (setup.warm.session_warm); None: cold. A `warm_from` name that is neither a device nor a
        measured workload, or siblings with nothing of this space, are refused (422)."""
        if request.warm == "off":
            return None
        try:
            return await asyncio.to_thread(
                session_warm,
                self.ctx.engine,
                device_id,
                request.workload,
                request.size,
                space,
                request.warm,
                request.warm_from,
            )
        except WarmError as error:
            raise CommandError(422, str(error)) from None

    async def resume_unfinished(self) -> int:
        """Rebuild every session from the log; drive on those that had not finished."""
        states: dict[str, SessionState] = {}
        owners: dict[str, str] = {}
        async for chunk in self.ctx.bus.replay(1, f"{self.ctx.bus.prefix}.session.>"):
            for raw in chunk:
                try:
                    env = decode(raw.data, raw.subject)
                    event = typed(env)
                except MalformedEvent as error:  # kept in the log, never in a session's way
                    log.warning("session_event_skipped", seq=raw.seq, error=str(error)[:300])
                    continue
                if event is None:
                    continue
                sid = env.aggregate_id
                owners.setdefault(sid, env.actor)
                states[sid] = evolve(states.get(sid, SessionState()), raw.seq, event)
        resumed = 0
        for sid, state in states.items():
            if state.status == "finished" or sid in self.tasks:
                continue
            try:
                _, space = await self.space_for(state.device_id, state.workload)
            except CommandError as error:
                log.error("session_not_resumable", session_id=sid, error=str(error))
                continue
            self.spawn(sid, owners[sid], space)
            resumed += 1
        if resumed:
            log.info("sessions_resumed", count=resumed)
        return resumed
