"""The fleet, approvals, sessions and decisions sections in a real browser (Debian's chromium
through Playwright's async API) against the gateway on a loopback socket, with the projector
folding real events from the test's own stream: the tasks' timeline per device, a session's
steps with its runtime plot (baseline, kept and reverted moves marked), the decisions paged on
the server and filtered, and the page following new events without a reload (a new decision
on top, an approval decided elsewhere leaving the queue with who decided).

No setup or model here (tests/console/test_browser.py has the real one): the events are the
ones those services append, so this stays quick."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI
from sqlalchemy import Engine

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import (
    ApprovalDecided,
    ApprovalRequested,
    DecisionMade,
    DeviceRegistered,
    EvaluationPublished,
    MeasurementRecorded,
    SessionMoveDecided,
    SessionMoveResolved,
    SessionPaused,
    SessionStarted,
    SessionStepRun,
    TaskFinished,
    TaskPlaced,
    TaskStarted,
    TaskSubmitted,
    TaskWaiting,
    envelope,
)
from hpc_ds1.process.runtime import run_service
from hpc_ds1.services.gateway import create_app
from hpc_ds1.settings import Settings
from tests.support.gateway import ROLE_TOKENS, role_token_events

from .served import BROWSER, browser_missing

pytestmark = pytest.mark.skipif(browser_missing() is not None, reason=browser_missing() or "")

CONFIG = {"ranks": 1, "threads": 1, "tile": 64, "gpu": False}
DECISIONS = 60  # more than a page (50)
WAIT_MS = 15_000


def decision(n: int, mode: str = "auto") -> DecisionMade:
    return DecisionMade(
        decision_id=f"dec-{n:03d}",
        device_id="dev-local",
        source="api",
        workload="gemm" if n % 2 else "nbody",
        size=512 + n,
        config=CONFIG,
        choice="ADD_RANK",
        confidence=0.91 if mode == "auto" else 0.3,
        mode=mode,  # type: ignore[arg-type]
    )


def placed(task_id: str, device: str) -> TaskPlaced:
    return TaskPlaced(
        task_id=task_id,
        attempt=1,
        device_id=device,
        config=CONFIG,
        expected_s=1.5,
        queue_s=0.0,
        basis="measured",
        reason=f"{device}: queue 0 s + best measured 1.5 s = 1.5 s",
        runner_up="dev-b" if device == "dev-local" else "dev-local",
    )


def history() -> list[Any]:
    session = "sess-0001"
    step_run = SessionStepRun
    return [
        *role_token_events(),
        DeviceRegistered(device_id="dev-local", hostname="coord", local=True),
        DeviceRegistered(device_id="dev-b", hostname="node-b"),
        MeasurementRecorded(
            measurement_id="m-1",
            device_id="dev-local",
            workload="gemm",
            size=512,
            config=CONFIG,
            status="ok",
            runtime_s=0.4,
        ),
        TaskSubmitted(task_id="task-done-1", workload="gemm", size=512, submitted_by="engineer"),
        placed("task-done-1", "dev-local"),
        TaskStarted(task_id="task-done-1", attempt=1, device_id="dev-local"),
        TaskFinished(
            task_id="task-done-1", attempt=1, device_id="dev-local", config=CONFIG, runtime_s=1.4
        ),
        TaskSubmitted(task_id="task-runs-2", workload="nbody", size=4096, submitted_by="engineer"),
        placed("task-runs-2", "dev-b"),
        TaskStarted(task_id="task-runs-2", attempt=1, device_id="dev-b"),
        TaskSubmitted(task_id="task-wait-3", workload="gemm", size=64, submitted_by="engineer"),
        TaskWaiting(task_id="task-wait-3", reason="no device online takes gemm"),
        SessionStarted(
            session_id=session, device_id="dev-local", workload="gemm", size=512, start=CONFIG
        ),
        step_run(session_id=session, step=0, config=CONFIG, status="ok", runtime_s=2.0),
        SessionMoveDecided(
            session_id=session,
            step=1,
            decision_id="sd-1",
            move="ADD_RANK",
            confidence=0.93,
            mode="auto",
            config=CONFIG,
        ),
        step_run(
            session_id=session,
            step=1,
            move="ADD_RANK",
            config={**CONFIG, "ranks": 2},
            status="ok",
            runtime_s=1.2,
        ),
        SessionMoveResolved(
            session_id=session,
            step=1,
            move="ADD_RANK",
            kept=True,
            config={**CONFIG, "ranks": 2},
            runtime_s=1.2,
            best_runtime_s=2.0,
            misses_in_a_row=0,
        ),
        SessionMoveDecided(
            session_id=session,
            step=2,
            decision_id="sd-2",
            move="ADD_THREAD",
            confidence=0.9,
            mode="auto",
            config={**CONFIG, "ranks": 2},
        ),
        step_run(
            session_id=session,
            step=2,
            move="ADD_THREAD",
            config={**CONFIG, "ranks": 2, "threads": 2},
            status="ok",
            runtime_s=1.6,
        ),
        SessionMoveResolved(
            session_id=session,
            step=2,
            move="ADD_THREAD",
            kept=False,
            config={**CONFIG, "ranks": 2, "threads": 2},
            runtime_s=1.6,
            best_runtime_s=1.2,
            misses_in_a_row=1,
        ),
        SessionMoveDecided(
            session_id=session,
            step=3,
            decision_id="sd-3",
            move="USE_GPU",
            confidence=0.62,
            mode="confirm",
            config={**CONFIG, "ranks": 2},
        ),
        ApprovalRequested(
            approval_id="appr-3",
            session_id=session,
            decision_id="sd-3",
            device_id="dev-local",
            workload="gemm",
            size=512,
            config={**CONFIG, "ranks": 2},
            move="USE_GPU",
            confidence=0.62,
            mode="confirm",
            reasons=["confidence 0.62 is below 0.85"],
        ),
        SessionPaused(session_id=session, step=3, approval_id="appr-3"),
        *(decision(n, "escalate" if n % 10 == 0 else "auto") for n in range(DECISIONS)),
        EvaluationPublished(
            evaluation_id="eval-1",
            device_id="dev-local",
            model_version="m-live",
            profile="final",
            seed=0,
            landscape_runs=480,
            results={"targets": TARGETS, "calibration": calibration()},
        ),
    ]


def calibration() -> dict[str, Any]:
    """The calibration summary `hpc-ds1 evaluate` publishes, of 40 hand-made held-out
    decisions: the confident ones right to run unattended and within 5 % of the best, the
    others mostly not (what the Evaluation section's reliability diagram and selective-risk
    curve draw)."""
    from hpc_ds1.evaluation.decisions import Checked, calibration_summary
    from hpc_ds1.model import Thresholds
    from hpc_ds1.space import STOP, Config

    here = Config(ranks=1, threads=1, tile=64)
    checks = []
    for i in range(40):
        confidence = 0.3 + 0.0175 * i  # 0.30 .. 0.98
        fine = confidence >= 0.85 or i % 3 == 0
        mode = "auto" if confidence >= 0.85 else "confirm" if confidence >= 0.5 else "escalate"
        checks.append(
            Checked(
                workload="gemm",
                size=512,
                config=here,
                choice="ADD_RANK",
                best_move=STOP,
                confidence=confidence,
                mode=mode,
                reasons=(),
                far=False,
                slower=not fine,
                good=fine,
                unattended=fine,
                worse_5=not fine,
            )
        )
    return calibration_summary(checks, Thresholds(auto=0.85, escalate=0.5))


# The rows as `evaluation.headline.truth_targets` writes them: a note where the figure has one.
TARGETS = [
    {
        "target": "model sessions: true 10th percentile % of best",
        "value": 85.33,
        "goal": ">= 92.0",
        "met": False,
        "note": "exhaustive search 87.55 in 40 runs on the same truth pass",
    },
    {"target": "model sessions: median real runs", "value": 4.0, "goal": "<= 5", "met": True},
]


async def publish(bus: EventBus, *events: Any) -> None:
    for event in events:
        await bus.publish(envelope(event, actor="alice", source="test", prefix=bus.prefix))


@pytest.fixture
async def base(settings: Settings, bus: EventBus, engine: Engine) -> AsyncIterator[str]:
    assert settings.nats_url and settings.database_url
    stop = asyncio.Event()
    projector = asyncio.create_task(
        run_service("projector", settings, settings.nats_url, settings.database_url, stop)
    )
    events = history()
    await publish(bus, *events)
    app: FastAPI = create_app(settings, bus, engine)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(1500):
        if server.started:
            break
        await asyncio.sleep(0.02)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        yield url
    finally:
        server.should_exit = True
        await app.state.stream_hub.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(serving, 30)
        sock.close()
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(projector, 30)


async def test_the_fleet_sessions_and_decisions_sections_follow_the_log(
    settings: Settings, bus: EventBus, engine: Engine, base: str
) -> None:
    from playwright.async_api import async_playwright

    from hpc_ds1.db import tables

    # The projection has folded the history (the last decision).
    for _ in range(400):
        with engine.connect() as conn:
            if conn.execute(
                tables.decisions.select().where(
                    tables.decisions.c.decision_id == f"dec-{DECISIONS - 1:03d}"
                )
            ).first():
                break
        await asyncio.sleep(0.05)

    async with async_playwright() as p:
        chromium = await p.chromium.launch(executable_path=str(BROWSER), args=["--no-sandbox"])
        try:
            context = await chromium.new_context(
                viewport={"width": 1400, "height": 1000},
                extra_http_headers={"Authorization": f"Bearer {ROLE_TOKENS['engineer']}"},
            )
            page = await context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            await page.goto(base + "/")
            await page.wait_for_selector("body[data-ready='true']", timeout=WAIT_MS)
            for name in ("fleet", "approvals", "sessions", "decisions"):
                state = await page.get_attribute(f"#{name}", "data-ready")
                assert state == "true", (name, await page.inner_text(f"#{name}"))
            assert not errors, errors

            # Evaluation: each target row with its note (the interval, the exhaustive ceiling).
            targets = page.locator("#evaluation .evaluation-targets")
            await targets.locator("summary").click()
            table = await targets.inner_text()
            assert "Targets: 1 of 2 met" in table and "Note" in table, table
            assert "exhaustive search 87.55 in 40 runs on the same truth pass" in table, table
            # Issue 43: the reliability diagram on "right unattended" and the selective-risk
            # curve with the auto threshold's point, both drawn (uPlot's canvas).
            trust = page.locator("#evaluation .evaluation-trust")
            said = await trust.inner_text()
            assert "could not be drawn" not in said and "no reliability diagram" not in said, said
            for plot in ("evaluation-reliability-unattended", "evaluation-selective-risk"):
                assert await trust.locator(f".{plot} canvas").count() == 1, (plot, said)
            reliability = await trust.locator(".evaluation-reliability-unattended").inner_text()
            assert "perfectly calibrated" in reliability and "decisions in the bin" in reliability
            assert "0.97 stated, 1.00 observed (2)" in reliability, reliability
            risk = await trust.locator(".evaluation-selective-risk").inner_text()
            assert "auto threshold (confidence ≥ 0.85)" in risk, risk
            assert "AUROC" in said and "end within 5 % of the best available" in said, said

            # Every control of these sections has an accessible name (chromium's tree).
            controls = page.locator(
                ":is(#fleet, #approvals, #sessions, #decisions) "
                ":is(a[href], button, input, select, textarea):visible"
            )
            assert await controls.count() > 15
            for i in range(await controls.count()):
                snapshot = (await controls.nth(i).aria_snapshot()).strip().splitlines()
                assert snapshot and '"' in snapshot[0], await controls.nth(i).evaluate(
                    "e => e.outerHTML"
                )

            # Fleet: both devices, the measured kernel, the tasks and where they went.
            devices = await page.inner_text("#fleet [data-part='devices']")
            assert "coord" in devices and "node-b" in devices and "gemm" in devices, devices
            assert "this coordinator" in devices
            tasks = await page.inner_text("#fleet [data-part='tasks']")
            assert "task-done-1" in tasks and "finished" in tasks and "1.40 s" in tasks, tasks
            assert "no device online takes gemm" in tasks
            assert "dev-b: queue 0 s + best measured 1.5 s" in tasks
            # The timeline: a lane per device that had a task, a bar per placed task.
            lanes = page.locator("#fleet [data-part='timeline'] svg .lane")
            assert await lanes.count() == 2
            assert await page.locator("#fleet svg .bar.finished").count() == 1
            assert await page.locator("#fleet svg .bar.running").count() == 1
            # The engineer's task form offers the registered workloads.
            options = await page.locator("#fleet-workload option").all_inner_texts()
            assert "gemm" in options and "stencil" in options, options
            # Both forms start from the job measured on this machine.
            for form in ("fleet", "sessions"):
                assert await page.input_value(f"#{form}-workload") == "gemm"
                assert await page.input_value(f"#{form}-size") == "512"

            # Approvals: the waiting move with its reason, buttons enabled for an engineer.
            waiting = page.locator("#approvals [data-part='waiting'] [data-approval-id='appr-3']")
            said = await waiting.inner_text()
            assert "confidence 0.62 is below 0.85" in said and "ranks=2 threads=1 tile=64" in said
            assert await waiting.get_by_role("button", name="Approve USE_GPU").is_enabled()

            # Sessions: the paused session chosen, its steps and the plot's marks.
            detail = page.locator("#sessions [data-part='detail']")
            await detail.locator("table.session-steps").wait_for(timeout=WAIT_MS)
            steps = detail.locator("table.session-steps tbody tr")
            assert await steps.count() == 4
            outcomes = await detail.locator("tbody tr td:last-child").all_inner_texts()
            assert [o.split()[0] for o in outcomes] == ["baseline", "kept", "reverted", "waiting"]
            assert await detail.locator("svg .mark.baseline").count() == 1
            assert await detail.locator("svg .mark.kept").count() == 1
            assert await detail.locator("svg .mark.reverted").count() == 1

            # Decisions: the audit file named where this server keeps it; pages of 25 from
            # the server (its cursors), older and back.
            lead = await page.inner_text("#decisions .lead")
            assert f"{settings.audit_path} on the coordinator" in lead, lead
            rows = page.locator("#decisions [data-part='rows'] tr")
            assert await rows.count() == 25
            newest = int(await rows.first.get_attribute("data-seq") or 0)
            count = "() => document.querySelectorAll('#decisions [data-part=rows] tr').length"
            older = page.get_by_role("button", name="Older →")
            for shown in (25, 10):
                await older.click()
                await page.wait_for_function(f"() => ({count})() === {shown}")
            assert await older.is_disabled()
            first = await rows.first.get_attribute("data-seq")
            assert int(first or 0) == newest - 50, (first, newest)
            await page.get_by_role("button", name="← Newer").click()
            await page.wait_for_function(f"() => ({count})() === 25")
            await page.get_by_role("button", name="Newest").click()
            await page.wait_for_function(
                "() => document.querySelector('#decisions [data-part=rows] tr')?.dataset.seq"
                f" === '{newest}'"
            )
            await page.select_option("#decisions-mode", "escalate")
            await page.wait_for_function(
                "() => document.querySelectorAll('#decisions [data-part=rows] tr').length === 6"
            )
            modes = await page.locator(
                "#decisions [data-part='rows'] td:nth-child(7)"
            ).all_inner_texts()
            assert set(modes) == {"escalate"}, modes
            await page.select_option("#decisions-mode", "")
            await page.wait_for_function(f"() => ({count})() === 25")

            # Live: a new decision comes on top, marked new; an approval decided elsewhere
            # leaves the queue and shows who decided; no reload.
            await page.wait_for_function(
                "() => document.getElementById('live')?.classList.contains('on')",
                timeout=WAIT_MS,
            )
            await publish(bus, decision(DECISIONS))
            await page.wait_for_function(
                f"""() => {{
                    const top = document.querySelector('#decisions [data-part=rows] tr');
                    return top && Number(top.dataset.seq) > {newest}
                               && top.classList.contains('new');
                }}""",
                timeout=WAIT_MS,
            )
            await publish(
                bus,
                ApprovalDecided(
                    approval_id="appr-3",
                    session_id="sess-0001",
                    decision_id="sd-3",
                    approved=False,
                    by="alice",
                    role="engineer",
                    note="not on this node",
                ),
            )
            await waiting.wait_for(state="detached", timeout=WAIT_MS)
            decided = page.locator("#approvals [data-part='decided'] [data-approval-id='appr-3']")
            await decided.wait_for(timeout=WAIT_MS)
            said = await decided.inner_text()
            assert "alice" in said and "rejected" in said and "not on this node" in said, said
            assert not errors, errors
            # A viewer sees the same sections, every engineer control disabled, and why.
            viewer = await chromium.new_context(
                viewport={"width": 1400, "height": 1000},
                extra_http_headers={"Authorization": f"Bearer {ROLE_TOKENS['viewer']}"},
            )
            page = await viewer.new_page()
            page.on("pageerror", lambda error: errors.append(str(error)))
            await page.goto(base + "/")
            await page.wait_for_selector("body[data-ready='true']", timeout=WAIT_MS)
            for form in ("#fleet [data-part='submit']", "#sessions [data-part='start']"):
                controls = page.locator(f"{form} :is(select, input, button)")
                assert await controls.count() >= 3
                for i in range(await controls.count()):
                    assert await controls.nth(i).is_disabled(), form
            for part in ("submit-status", "start-status"):
                said = await page.inner_text(f"[data-part='{part}']")
                assert "needs an engineer token" in said and "viewer" in said, said
            assert "--token …" in await page.inner_text("#fleet [data-part='join-command']")
            assert not errors, errors
        finally:
            await chromium.close()
