"""Drives tuning sessions: every step a real run on the device's agent, every move a decision of
the decision service, every transition an event appended with optimistic concurrency."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from dataclasses import replace
from typing import Any, Literal

import orjson
from nats.errors import NoRespondersError

from hpc_ds1.eventlog.bus import ConcurrencyConflict
from hpc_ds1.eventlog.subjects import agent_cancel_subject, agent_run_subject, decide_subject
from hpc_ds1.events import (
    ApprovalDecided,
    ApprovalRequested,
    Event,
    MalformedEvent,
    SessionCancelRequested,
    SessionFinished,
    SessionMoveDecided,
    SessionMoveResolved,
    SessionPaused,
    SessionResumed,
    SessionStepRun,
    decode,
    envelope,
    typed,
)
from hpc_ds1.log import get_logger
from hpc_ds1.model.schema import waits_for_engineer
from hpc_ds1.process.runtime import ServiceContext
from hpc_ds1.requests import RUN_REPEATS, CancelRunRequest, DecideRequest, RunRequest
from hpc_ds1.runner import run_repeats
from hpc_ds1.security.approvals import withdraw_approval
from hpc_ds1.security.cancels import cancel_of
from hpc_ds1.space import STOP, Config, ConfigSpace, apply_move
from hpc_ds1.tuning.session import (
    MAX_MISSES,
    PICK,
    WARM,
    SessionState,
    choose_move,
    evolve,
    pick_to_offer,
    replay,
    resolve,
    warm_to_offer,
)

log = get_logger("coordinator")

RUN_TIMEOUT_S = 1800.0
AGENT_WAIT_S = 60
APPROVAL_RECHECK_S = 5.0
AGENT_CANCEL_TIMEOUT_S = 10.0


class SessionLost(Exception):
    """Another coordinator appended to this session: this one stops driving it."""


class SessionCancelled(Exception):
    """Someone cancelled the session (cancel.requested) while a step was under way."""


class SessionRunner:
    def __init__(self, ctx: ServiceContext, session_id: str, owner: str, space: ConfigSpace):
        self.ctx = ctx
        self.session_id = session_id
        self.owner = owner
        self.space = space
        self.state = SessionState()
        self.cancelled: SessionCancelRequested | None = None
        self._wake = asyncio.Event()  # set by a cancel: a wait for an approval looks again

    async def history(
        self, aggregate: str, aggregate_id: str
    ) -> tuple[list[tuple[int, Event]], int]:
        """The aggregate's typed events and its version (the last sequence on its subjects,
        a malformed message included); a message that is not a known event is skipped."""
        bus = self.ctx.bus
        version = await bus.aggregate_version(aggregate, aggregate_id)
        found: list[tuple[int, Event]] = []
        if version == 0:
            return found, 0
        subjects = bus.aggregate_subjects(aggregate, aggregate_id)
        async for chunk in bus.replay(1, subjects, stop_at=version):
            for raw in chunk:
                try:
                    event = typed(decode(raw.data, raw.subject))
                except MalformedEvent as error:
                    log.warning("event_skipped", seq=raw.seq, error=str(error)[:300])
                    continue
                if event is not None:
                    found.append((raw.seq, event))
        return found, version

    async def load(self) -> SessionState:
        events, version = await self.history("session", self.session_id)
        self.state = replace(replay(events), version=version)
        return self.state

    async def append(self, event: Event) -> None:
        env = envelope(
            event,
            actor=self.owner,
            source="coordinator",
            prefix=self.ctx.settings.subject_prefix,
            correlation_id=self.session_id,
        )
        try:
            seq = await self.ctx.bus.publish(env, expected_version=self.state.version)
        except ConcurrencyConflict:
            raise SessionLost(self.session_id) from None
        self.state = evolve(self.state, seq, event)

    async def drive(self) -> None:
        """Run the session from wherever its log says it is, until it finishes (or until it
        is cancelled: then it finishes `interrupted`, saying who cancelled it)."""
        await self.load()
        try:
            if self.state.status != "finished" and self.cancelled is None:
                # a cancel made while no coordinator drove the session
                self.cancelled = await cancel_of(self.ctx.bus, self.session_id)
            while self.state.status != "finished" and not self.ctx.stop.is_set():
                if self.cancelled is not None:
                    await self.finish_cancelled(self.cancelled)
                    break
                try:
                    await self.step()
                except SessionCancelled:
                    continue  # the loop finishes it
        except SessionLost:
            log.warning("session_taken_over", session_id=self.session_id)
        except Exception as error:
            log.error("session_failed", session_id=self.session_id, error=repr(error))
            with contextlib.suppress(SessionLost):
                await self.finish("failed", f"{type(error).__name__}: {error}")

    async def step(self) -> None:
        s = self.state
        if s.runs == 0:
            await self.run_baseline()
        elif s.awaiting is not None:
            await self.wait_for_approval(s.awaiting)
        elif s.pending is not None and s.pending.run is not None:
            await self.resolve_pending()
        elif s.pending is not None and s.pending.rejected:
            await self.finish("rejected", f"the engineer rejected {s.pending.move}")
        elif s.pending is not None and s.pending.approved and s.pending.move == STOP:
            await self.finish("stop", f"STOP ({s.pending.confidence:.2f}) confirmed by an engineer")
        elif s.pending is not None and s.pending.approved:
            await self.run_pending()
        elif s.pending is not None:
            await self.request_approval()
        else:
            await self.decide_next()

    async def run_baseline(self) -> None:
        config = Config.model_validate(self.state.start)
        result, measurement_id = await self.run_on_agent(config)
        await self.append(
            SessionStepRun(
                session_id=self.session_id,
                step=0,
                config=config.model_dump(),
                status=result["status"],
                runtime_s=result.get("runtime_s"),
                spread=result.get("spread"),
                measurement_id=measurement_id,
            )
        )
        if result["status"] != "ok":
            await self.finish(
                "failed",
                f"the start configuration {config.label()} ended "
                f"{result['status']}: {result.get('error') or ''}".strip(),
            )

    async def decide_next(self) -> None:
        s = self.state
        assert s.best_config is not None and s.best_runtime_s is not None
        if s.misses >= MAX_MISSES and s.picked:
            await self.finish_two_misses()  # its PICK is spent: nothing to ask the model
            return
        decision = await self.ask_decision(Config.model_validate(s.best_config), s.best_runtime_s)
        warm = warm_to_offer(s)
        if warm is not None:
            await self.propose_warm(decision, warm)
            return
        picked = choose_move(s, decision["choice"], decision.get("alternatives", {}))
        ending = s.misses >= MAX_MISSES or picked is None or picked[0] == STOP
        if ending:
            offered = pick_to_offer(s, decision.get("system1"))
            if offered is not None:
                await self.propose_pick(decision, offered, picked)
                return
        if s.misses >= MAX_MISSES:
            await self.finish_two_misses()
            return
        if picked is None:
            await self.finish("no_moves", "every move from the best configuration was tried")
            return
        move, confidence = picked
        if move == STOP and decision["mode"] == "auto":
            await self.finish("stop", f"the model says STOP ({confidence:.2f})")
            return
        own_choice = move == decision["choice"]
        mode: Mode = decision["mode"] if own_choice else _mode_for(confidence, self.ctx)
        reasons = list(decision.get("reasons", []))
        if not own_choice:
            reasons.append(
                f"the model's first choice {decision['choice']} was already tried "
                f"from this configuration"
            )
            if decision["mode"] == "escalate":
                mode = "escalate"
            elif mode == "auto" and waits_for_engineer(reasons):
                mode = "confirm"  # the model's confidence does not discriminate
        await self.propose(decision, move, confidence, mode, reasons)

    async def finish_two_misses(self) -> None:
        await self.finish(
            "two_misses", f"{MAX_MISSES} moves in a row were slower beyond the noise or failed"
        )

    async def propose(
        self,
        decision: dict[str, Any],
        move: str,
        confidence: float,
        mode: Mode,
        reasons: list[str],
        target: dict[str, Any] | None = None,
    ) -> None:
        assert self.state.best_config is not None
        await self.append(
            SessionMoveDecided(
                session_id=self.session_id,
                step=self.state.runs,
                decision_id=decision["decision_id"],
                move=move,
                confidence=confidence,
                mode=mode,
                reasons=reasons,
                config=self.state.best_config,
                target=target,
            )
        )

    async def propose_pick(
        self,
        decision: dict[str, Any],
        target: dict[str, Any],
        instead_of: tuple[str, float] | None,
    ) -> None:
        """System 1's configuration, once, where the session would end (the model's STOP, no
        untried move, or two misses in a row) and System 1 predicts it clearly faster than the
        best so far (tuning.session.pick_to_offer); judged by the keep rule like any move. Its
        confidence and mode are System 1's, escalated with the decision's."""
        s = self.state
        assert s.best_config is not None
        system1 = decision["system1"]
        best = Config.model_validate(s.best_config).label()
        pick = Config.model_validate(target).label()
        predicted = system1["predicted_runtimes_s"]
        gain = predicted[best] / predicted[pick] - 1.0
        if s.misses >= MAX_MISSES:
            why = f"{MAX_MISSES} moves in a row were slower"
        elif instead_of is not None:
            why = "the model says STOP"
        else:
            why = "every move from here was tried"
        mode: Mode = "escalate" if decision["mode"] == "escalate" else system1["mode"]
        reasons = [
            f"{why}, but System 1 recommends {pick}, predicted {gain:.0%} faster than {best}: "
            f"tried once before stopping",
            *decision.get("reasons", []),
        ]
        await self.propose(decision, PICK, float(system1["confidence"]), mode, reasons, target)

    async def propose_warm(self, decision: dict[str, Any], target: dict[str, Any]) -> None:
        """A warm session's next configuration of the siblings' consensus (tuning.session.WARM),
        before the model's own moves; judged by the keep rule like any move. Its confidence
        and mode are the decision's: the familiarity guard still sends a job the model does not
        know to an engineer."""
        s = self.state
        rank = next(
            i for i, c in enumerate(s.warm_plan) if Config.model_validate(c).model_dump() == target
        )
        siblings = ", ".join(s.warm_from) or "the fleet"
        reasons = [
            f"warm start: {Config.model_validate(target).label()} is #{rank + 1} of the top of "
            f"the consensus of {siblings}, spread apart; not yet run here",
            *decision.get("reasons", []),
        ]
        await self.propose(
            decision, WARM, float(decision["confidence"]), decision["mode"], reasons, target
        )

    async def request_approval(self) -> None:
        """The approval request, then the pause. Both have ids derived from the session, the
        step and the decision, and the request is appended only to an approval that has no
        event yet, so a coordinator that died between the two appends and runs this again
        finds the same request and completes the pair: never a second request, never a request
        without its pause."""
        s = self.state
        assert s.pending is not None and s.best_config is not None
        approval_id = approval_id_for(self.session_id, s.pending.step, s.pending.decision_id)
        decided = await self.decided_event(s.pending.step)
        request = envelope(
            ApprovalRequested(
                approval_id=approval_id,
                session_id=self.session_id,
                decision_id=s.pending.decision_id,
                device_id=s.device_id,
                workload=s.workload,
                size=s.size,
                config=s.best_config,
                move=s.pending.move,
                confidence=s.pending.confidence,
                mode=decided.mode if decided else "confirm",
                reasons=decided.reasons if decided else [],
            ),
            actor=self.owner,
            source="coordinator",
            prefix=self.ctx.settings.subject_prefix,
            correlation_id=self.session_id,
        )
        request = request.model_copy(update={"id": f"{approval_id}-requested"})
        try:
            await self.ctx.bus.publish(request, expected_version=0)
        except ConcurrencyConflict:
            log.info("approval_already_requested", session_id=self.session_id, approval=approval_id)
        await self.append(
            SessionPaused(session_id=self.session_id, step=s.pending.step, approval_id=approval_id)
        )

    async def decided_event(self, step: int) -> SessionMoveDecided | None:
        events, _ = await self.history("session", self.session_id)
        for _, event in reversed(events):
            if isinstance(event, SessionMoveDecided) and event.step == step:
                return event
        return None

    async def wait_for_approval(self, approval_id: str) -> None:
        verdict = await self.approval_verdict(approval_id)
        if verdict is None:
            return
        await self.append(
            SessionResumed(
                session_id=self.session_id, approval_id=approval_id, approved=verdict.approved
            )
        )
        if self.state.pending is not None and self.state.pending.rejected:
            note = f": {verdict.note}" if verdict.note else ""
            await self.finish("rejected", f"{verdict.by} rejected {self.state.pending.move}{note}")

    async def approval_verdict(self, approval_id: str) -> ApprovalDecided | None:
        """The verdict from the log; waits for one (a live subscription, re-checked now and
        then so that a verdict published while nobody listened is still seen)."""
        arrived = asyncio.Event()

        async def wake(_: Any) -> None:
            arrived.set()

        subject = f"{self.ctx.settings.subject_prefix}.approval.{approval_id}.decided"
        sub = await self.ctx.bus.nc.subscribe(subject, cb=wake)
        self._wake = arrived  # a cancel wakes this wait too
        try:
            while not self.ctx.stop.is_set() and self.cancelled is None:
                for _, event in (await self.history("approval", approval_id))[0]:
                    if isinstance(event, ApprovalDecided):
                        return event
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(arrived.wait(), APPROVAL_RECHECK_S)
                arrived.clear()
        finally:
            await sub.unsubscribe()
        return None

    async def run_pending(self) -> None:
        s = self.state
        assert s.pending is not None and s.best_config is not None
        current = Config.model_validate(s.best_config)
        if s.pending.move in (PICK, WARM) and s.pending.target is not None:
            target: Config | None = Config.model_validate(s.pending.target)
        else:
            target = apply_move(current, s.pending.move, self.space)
        if target is None:
            await self.append(
                SessionStepRun(
                    session_id=self.session_id,
                    step=s.pending.step,
                    move=s.pending.move,
                    config=current.model_dump(),
                    status="failed",
                )
            )
            return
        result, measurement_id = await self.run_on_agent(target)
        await self.append(
            SessionStepRun(
                session_id=self.session_id,
                step=s.pending.step,
                move=s.pending.move,
                config=target.model_dump(),
                status=result["status"],
                runtime_s=result.get("runtime_s"),
                spread=result.get("spread"),
                measurement_id=measurement_id,
            )
        )

    async def resolve_pending(self) -> None:
        s = self.state
        assert s.pending is not None and s.pending.run is not None
        run = s.pending.run
        r = resolve(s)
        if r.race is not None:
            await self.run_race(r.race)
            return
        await self.append(
            SessionMoveResolved(
                session_id=self.session_id,
                step=s.pending.step,
                move=s.pending.move,
                kept=r.kept,
                config=run.config,
                runtime_s=r.runtime_s,
                best_runtime_s=s.best_runtime_s,
                misses_in_a_row=r.misses,
                p_faster=r.verdict.p_faster if r.verdict else None,
                within_noise=bool(r.verdict and r.verdict.within_noise),
            )
        )
        # two misses in a row end the session in decide_next, after System 1's PICK if due

    async def run_race(self, role: Literal["incumbent", "candidate"]) -> None:
        """One re-run of an ambiguous move's race: the best so far, or the move's candidate."""
        s = self.state
        assert s.pending is not None and s.pending.run is not None and s.best_config is not None
        config = Config.model_validate(
            s.best_config if role == "incumbent" else s.pending.run.config
        )
        result, measurement_id = await self.run_on_agent(config)
        await self.append(
            SessionStepRun(
                session_id=self.session_id,
                step=s.runs,  # every run its own step: steps count the runs
                move=s.pending.move,
                config=config.model_dump(),
                status=result["status"],
                runtime_s=result.get("runtime_s"),
                spread=result.get("spread"),
                measurement_id=measurement_id,
                race=role,
            )
        )

    async def cancel(self, event: SessionCancelRequested) -> None:
        """Someone cancelled this session: its step stops where it is, the device's agent
        kills its run in flight (the whole process group) or never starts it, and the session
        finishes `interrupted` (drive)."""
        if self.cancelled is not None:
            return
        self.cancelled = event
        self._wake.set()
        ask = CancelRunRequest(session_id=self.session_id, by=event.by)
        subject = agent_cancel_subject(self.ctx.settings, self.state.device_id)
        try:
            reply = await self.ctx.bus.nc.request(
                subject, ask.model_dump_json().encode(), timeout=AGENT_CANCEL_TIMEOUT_S
            )
            killed = orjson.loads(reply.data).get("killed")
        except Exception as error:  # no agent: no run to kill; the session finishes anyway
            log.warning("agent_cancel_failed", session_id=self.session_id, error=repr(error))
            killed = None
        log.info("session_cancelled", session_id=self.session_id, by=event.by, killed=killed)

    async def finish_cancelled(self, event: SessionCancelRequested) -> None:
        why = f": {event.reason}" if event.reason else ""
        if self.state.awaiting is not None:
            # no engineer can decide the move it waited on any more: the queue says so
            await withdraw_approval(
                self.ctx.bus, self.state.awaiting, f"session cancelled by {event.by}", event.by
            )
        await self.finish("interrupted", f"cancelled by {event.by} ({event.role}){why}")

    async def finish(self, reason: str, detail: str) -> None:
        s = self.state
        await self.append(
            SessionFinished(
                session_id=self.session_id,
                reason=reason,  # type: ignore[arg-type]
                detail=detail,
                best_config=s.best_config,
                best_runtime_s=s.best_runtime_s,
                start_runtime_s=s.start_runtime_s,
                speedup=s.speedup,
                real_runs=s.runs,
            )
        )

    async def run_on_agent(self, config: Config) -> tuple[dict[str, Any], str | None]:
        ask = RunRequest(
            workload=self.state.workload,
            size=self.state.size,
            config=config.model_dump(),
            # a workload file's own `repeats` (issue 44: 1 for a run of minutes)
            repeats=run_repeats(self.state.workload, None, RUN_REPEATS),
            purpose="tune",
            actor=self.owner,
            session_id=self.session_id,  # its run's heartbeats say whose step it is
        )
        subject = agent_run_subject(self.ctx.settings, self.state.device_id)
        for attempt in range(AGENT_WAIT_S * 10):
            try:
                reply = await self.ctx.bus.nc.request(
                    subject, ask.model_dump_json().encode(), timeout=RUN_TIMEOUT_S
                )
                break
            except NoRespondersError:
                # The device's agent is (re)starting: the step waits for it, up to a limit.
                if attempt == AGENT_WAIT_S * 10 - 1:
                    raise
                await asyncio.sleep(0.1)
        body = orjson.loads(reply.data)
        if not body.get("ok"):
            if self.cancelled is not None:
                raise SessionCancelled(body.get("error"))  # no step of a killed run
            return {"status": "failed", "error": body.get("error")}, None
        result: dict[str, Any] = body["result"]
        return result, body.get("measurement_id")

    async def ask_decision(self, config: Config, runtime_s: float) -> dict[str, Any]:
        request = DecideRequest.model_validate(
            {
                "workload": self.state.workload,
                "size": self.state.size,
                "config": config.model_dump(),
                "telemetry": {"runtime_s": runtime_s},
                "device_id": self.state.device_id,
                "source": "session",
                "session_id": self.session_id,
            }
        )
        reply = await self.ctx.bus.nc.request(
            decide_subject(self.ctx.settings),
            request.model_dump_json().encode(),
            timeout=30.0,
            headers={"Hpc-Actor": self.owner},
        )
        body = orjson.loads(reply.data)
        if not body.get("ok"):
            raise RuntimeError(f"the decision service refused: {body.get('error')}")
        decision: dict[str, Any] = body["decision"]
        return decision


Mode = Literal["auto", "confirm", "escalate"]


def approval_id_for(session_id: str, step: int, decision_id: str) -> str:
    """The same approval id each time the same move of the same session asks for one."""
    return hashlib.sha256(f"approval:{session_id}:{step}:{decision_id}".encode()).hexdigest()[:32]


def _mode_for(confidence: float, ctx: ServiceContext) -> Mode:
    if confidence >= ctx.settings.auto_threshold:
        return "auto"
    return "confirm" if confidence >= ctx.settings.escalate_threshold else "escalate"
