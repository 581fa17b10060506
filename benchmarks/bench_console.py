"""Console benchmark: the first view with a long history. Run:
`python benchmarks/bench_console.py [N] [--repeats R] [--no-browser]` (N events in the log,
default 100,000).

1. A new home with the embedded NATS and Postgres; N events of a plausible history published
   and projected by the real projector: measurements of a setup, tuning sessions (their
   decisions, steps, a few waiting for an engineer), fleet tasks placed and finished on 20
   devices, decisions asked over the API.
2. `hpc-ds1 serve` on that home, as a user runs it; then, on loopback:
   - http: GET / then the API calls the page's sections make when it loads (LOAD_CALLS, six at a
     time as a browser does over HTTP/1.1): wall time from the first request to the last byte.
   - browser (when Playwright and Debian's chromium are installed): a real page load, by the
     page's own clock from navigation until every section has initialised (console.js stamps
     document.body.dataset.readyMs), with the calls it actually made and when each section was
     ready.
   Each is repeated R times; the first (cold) and the median are printed. Target: <= 1 s.

The speed verdict is printed, not asserted (tests/benchmarks/test_bench_console.py runs a small
N and checks only what holds anywhere)."""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import (
    ApprovalDecided,
    ApprovalRequested,
    DecisionMade,
    DeviceRegistered,
    Envelope,
    Event,
    MeasurementRecorded,
    SessionFinished,
    SessionMoveDecided,
    SessionMoveResolved,
    SessionPaused,
    SessionResumed,
    SessionStarted,
    SessionStepRun,
    TaskFinished,
    TaskPlaced,
    TaskStarted,
    TaskSubmitted,
    envelope,
)
from hpc_ds1.infra.ports import free_port
from hpc_ds1.security.credentials import read_cli_token
from hpc_ds1.settings import Settings
from hpc_ds1.stack import open_stack

TARGET_S = 1.0
HPC_DS1 = str(Path(sys.executable).parent / "hpc-ds1")
BROWSER = Path("/usr/bin/chromium")
SESSION_COOKIE = "hpc_ds1_session"
PARALLEL = 6  # connections per host a browser opens over HTTP/1.1

# The GET calls the console's sections make when the page loads (static/sections/*.js), but for
# the one that depends on the data (the latest session's steps, /v1/sessions/<id>); the browser
# mode records the calls really made and names any missing here.
LOAD_CALLS = (
    "/v1/stats",
    "/v1/model",
    "/v1/workloads",
    "/v1/measurements/summary",
    "/v1/devices",
    "/v1/tasks?limit=100",
    "/v1/fleet/join-token",
    "/v1/approvals",
    "/v1/approvals?status=decided&limit=10",
    "/v1/sessions?limit=50",
    "/v1/audit?limit=25",
    "/v1/evaluation",
)

WORKLOADS = ("gemm", "stencil", "nbody", "montecarlo")
MOVES = ("MORE_RANKS", "FEWER_RANKS", "MORE_THREADS", "FEWER_THREADS", "BIGGER_TILE", "STOP")


# --- a history -------------------------------------------------------------------------------


def history(n: int, seed: int = 7) -> list[tuple[Event, str]]:
    """About n events (event, actor) of a facility's plausible past, in causal order."""
    rng = random.Random(seed)
    devices = [f"dev-{i:02d}" for i in range(20)]
    events: list[tuple[Event, str]] = [
        (DeviceRegistered(device_id=d, hostname=f"node{i:02d}"), d) for i, d in enumerate(devices)
    ]

    def config() -> dict[str, Any]:
        return {
            "ranks": rng.choice((1, 2, 4, 8)),
            "threads": rng.choice((1, 2, 4)),
            "tile": rng.choice((32, 64, 128)),
        }

    measurement = 0
    session = 0
    task = 0
    decision = 0
    while len(events) < n:
        kind = rng.random()
        if kind < 0.35:  # a setup's measurements: a burst of 20
            device, workload = rng.choice(devices), rng.choice(WORKLOADS)
            for _ in range(20):
                measurement += 1
                events.append(
                    (
                        MeasurementRecorded(
                            measurement_id=f"m{measurement}",
                            device_id=device,
                            workload=workload,
                            size=rng.choice((256, 512, 1024, 2048)),
                            config=config(),
                            status="ok",
                            runtime_s=rng.uniform(0.01, 2.0),
                            repeats=3,
                            check_ok=True,
                            purpose="setup",
                        ),
                        "setup",
                    )
                )
        elif kind < 0.70:  # a tuning session: 4 moves, sometimes one waits for an engineer
            session += 1
            sid, device = f"s{session}", rng.choice(devices)
            workload, size, cfg = rng.choice(WORKLOADS), rng.choice((512, 1024, 2048)), config()
            events.append(
                (
                    SessionStarted(
                        session_id=sid, device_id=device, workload=workload, size=size, start=cfg
                    ),
                    "alice",
                )
            )
            events.append(
                (
                    SessionStepRun(session_id=sid, step=0, config=cfg, status="ok", runtime_s=1.0),
                    "coordinator",
                )
            )
            waits = rng.random() < 0.1
            for step in range(1, 5):
                decision += 1
                did, move = f"d{decision}", rng.choice(MOVES[:-1])
                mode = "confirm" if waits and step == 2 else "auto"
                confidence = 0.7 if mode == "confirm" else rng.uniform(0.85, 1.0)
                events.append(
                    (
                        DecisionMade(
                            decision_id=did,
                            device_id=device,
                            source="session",
                            workload=workload,
                            size=size,
                            config=cfg,
                            choice=move,
                            confidence=confidence,
                            mode=mode,
                            session_id=sid,
                            model_version="v1",
                        ),
                        "decision",
                    )
                )
                events.append(
                    (
                        SessionMoveDecided(
                            session_id=sid,
                            step=step,
                            decision_id=did,
                            move=move,
                            confidence=confidence,
                            mode=mode,
                            config=cfg,
                        ),
                        "coordinator",
                    )
                )
                if mode == "confirm":
                    aid = f"a{decision}"
                    events.append(
                        (
                            ApprovalRequested(
                                approval_id=aid,
                                session_id=sid,
                                decision_id=did,
                                device_id=device,
                                workload=workload,
                                size=size,
                                config=cfg,
                                move=move,
                                confidence=confidence,
                                mode=mode,
                            ),
                            "coordinator",
                        )
                    )
                    events.append((SessionPaused(session_id=sid, step=step, approval_id=aid), "c"))
                    if len(events) > n - 200:  # the latest few still wait
                        break
                    events.append(
                        (
                            ApprovalDecided(
                                approval_id=aid,
                                session_id=sid,
                                decision_id=did,
                                approved=True,
                                by="bob",
                                role="engineer",
                            ),
                            "bob",
                        )
                    )
                    events.append(
                        (SessionResumed(session_id=sid, approval_id=aid, approved=True), "c")
                    )
                cfg = config()
                runtime = rng.uniform(0.1, 1.5)
                events.append(
                    (
                        SessionStepRun(
                            session_id=sid,
                            step=step,
                            move=move,
                            config=cfg,
                            status="ok",
                            runtime_s=runtime,
                        ),
                        "coordinator",
                    )
                )
                events.append(
                    (
                        SessionMoveResolved(
                            session_id=sid,
                            step=step,
                            move=move,
                            kept=runtime < 1.0,
                            config=cfg,
                            runtime_s=runtime,
                            misses_in_a_row=0,
                        ),
                        "coordinator",
                    )
                )
            else:
                events.append(
                    (
                        SessionFinished(
                            session_id=sid,
                            reason="stop",
                            best_config=cfg,
                            best_runtime_s=0.5,
                            start_runtime_s=1.0,
                            speedup=2.0,
                            real_runs=5,
                        ),
                        "coordinator",
                    )
                )
        elif kind < 0.90:  # a fleet task, placed and run
            task += 1
            tid, device, cfg = f"t{task}", rng.choice(devices), config()
            workload, size = rng.choice(WORKLOADS), rng.choice((1024, 4096))
            events += [
                (TaskSubmitted(task_id=tid, workload=workload, size=size, submitted_by="ci"), "ci"),
                (
                    TaskPlaced(
                        task_id=tid,
                        attempt=1,
                        device_id=device,
                        config=cfg,
                        expected_s=1.0,
                        queue_s=0.0,
                        basis="measured",
                        reason="earliest expected finish",
                    ),
                    "placement",
                ),
                (TaskStarted(task_id=tid, attempt=1, device_id=device), device),
                (
                    TaskFinished(
                        task_id=tid, attempt=1, device_id=device, config=cfg, runtime_s=1.1
                    ),
                    device,
                ),
            ]
        else:  # a decision asked over the API
            decision += 1
            events.append(
                (
                    DecisionMade(
                        decision_id=f"d{decision}",
                        device_id=rng.choice(devices),
                        source="api",
                        workload=rng.choice(WORKLOADS),
                        size=1024,
                        config=config(),
                        choice=rng.choice(MOVES),
                        confidence=rng.uniform(0.3, 1.0),
                        mode=rng.choice(("auto", "auto", "confirm", "escalate")),
                        model_version="v1",
                    ),
                    "api",
                )
            )
    return events


async def fill(settings: Settings, n: int, say: Any = print) -> int:
    """Publish about n events into the home's log and wait until they are projected; returns
    the log's last sequence."""
    events = history(n)
    async with open_stack(settings, ("projector",), "bench-console") as stack:
        bus: EventBus = stack.bus
        started = time.perf_counter()
        envs: list[Envelope] = [
            envelope(e, actor=actor, source="bench", prefix=bus.prefix) for e, actor in events
        ]
        for at in range(0, len(envs), 5000):
            await bus.publish_many(envs[at : at + 5000])
        published = time.perf_counter() - started
        await stack.caught_up(within_s=max(60.0, n / 200))
        say(
            f"  {len(envs):,} events published in {published:.1f} s, projected after "
            f"{time.perf_counter() - started:.1f} s"
        )
        return await bus.last_sequence()


# --- serving and measuring ------------------------------------------------------------------


def serve_env(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    env.update(HPC_DS1_HOME=str(settings.home), HPC_DS1_LOG_LEVEL="warning")
    if settings.nats_url:
        env["HPC_DS1_NATS_URL"] = settings.nats_url
    if settings.database_url:
        env["HPC_DS1_DATABASE_URL"] = settings.database_url
    env.update(HPC_DS1_STREAM=settings.stream, HPC_DS1_SUBJECT_PREFIX=settings.subject_prefix)
    return env


@contextlib.contextmanager
def served(settings: Settings, logs: Path) -> Any:
    """`hpc-ds1 serve` on the home until it answers /readyz; yields (base URL, CLI token)."""
    port = free_port()
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "serve.log", "w") as log:
        proc = subprocess.Popen(
            [HPC_DS1, "serve", "--port", str(port)],
            env=serve_env(settings),
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 180
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"serve exited: {(logs / 'serve.log').read_text()[-3000:]}")
                token = read_cli_token(settings.home)
                if token:
                    with contextlib.suppress(httpx.HTTPError):
                        auth = {"Authorization": f"Bearer {token}"}
                        if httpx.get(f"{base}/readyz", headers=auth, timeout=2).status_code == 200:
                            break
                if time.monotonic() > deadline:
                    raise TimeoutError("serve did not get ready within 180 s")
                time.sleep(0.3)
            yield base, token
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@dataclass
class View:
    """One first view: its wall time and each call's status and time."""

    wall_s: float
    calls: dict[str, tuple[int, float]] = field(default_factory=dict)  # path -> (status, s)
    page_bytes: int = 0
    phases: dict[str, float] = field(default_factory=dict)  # browser: ms since navigation


# Where a browser load's time goes, from the page's own Performance entries (ms).
PHASES_JS = """() => {
  const nav = performance.getEntriesByType("navigation")[0];
  const res = performance.getEntriesByType("resource");
  const api = res.filter((r) => new URL(r.name).pathname.startsWith("/v1/")
                             && !r.name.includes("/v1/stream"));
  const mods = res.filter((r) => new URL(r.name).pathname.startsWith("/static/"));
  const last = (xs) => Math.max(0, ...xs.map((r) => r.responseEnd));
  const first = (xs) => (xs.length ? Math.min(...xs.map((r) => r.startTime)) : 0);
  return {
    "html": nav.responseEnd,
    "static done": last(mods),
    "DOMContentLoaded": nav.domContentLoadedEventEnd,
    "first API call": first(api),
    "last API answer": last(api),
    "ready": Number(document.body.dataset.readyMs),
    ...Object.fromEntries([...document.querySelectorAll("main > section[data-ready-ms]")]
      .map((s) => [`#${s.id}`, Number(s.dataset.readyMs)])),
  };
}"""


def console_session(base: str, token: str) -> str:
    """A console session of the token's person, as the sign-in form opens one (the cookie
    holds a session id of its own, never the token: issue 45)."""
    reply = httpx.post(
        f"{base}/",
        data={"token": token},
        headers={"Origin": base},
        follow_redirects=False,
        timeout=60,
    )
    session = reply.cookies.get(SESSION_COOKIE)
    if reply.status_code != 303 or not session:
        raise RuntimeError(
            f"the console's sign-in answered {reply.status_code}: {reply.text[:200]}"
        )
    return session


def http_view(base: str, session: str, calls: tuple[str, ...] = LOAD_CALLS) -> View:
    """GET / with the session cookie, then the page's load calls PARALLEL at a time."""
    cookies = {SESSION_COOKIE: session}
    headers = {"X-Requested-With": "hpc-ds1-console"}
    view = View(0.0)
    limits = httpx.Limits(max_connections=PARALLEL, max_keepalive_connections=PARALLEL)
    with httpx.Client(base_url=base, cookies=cookies, limits=limits, timeout=60) as http:

        def get(path: str) -> tuple[str, int, float]:
            t = time.perf_counter()
            reply = http.get(path, headers=headers)
            reply.read()
            return path, reply.status_code, time.perf_counter() - t

        started = time.perf_counter()
        page = http.get("/")
        view.page_bytes = len(page.content)
        view.calls["/"] = (page.status_code, time.perf_counter() - started)
        with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
            for path, status, took in pool.map(get, calls):
                view.calls[path] = (status, took)
        view.wall_s = time.perf_counter() - started
    return view


def browser_missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed"
    if not BROWSER.exists():
        return f"{BROWSER} is missing (deploy/install-browser.sh installs it)"
    return None


def browser_views(base: str, session: str, repeats: int) -> list[View]:
    """Real page loads in chromium, each in a fresh context (no cache): from navigation to
    every section initialised (console.js sets document.body.dataset.ready)."""
    from playwright.sync_api import sync_playwright

    views: list[View] = []
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(BROWSER), args=["--no-sandbox"])
        try:
            for _ in range(repeats):
                context = chromium.new_context()
                context.add_cookies([{"name": SESSION_COOKIE, "value": session, "url": base}])
                page = context.new_page()
                view = View(0.0)
                sent: dict[Any, float] = {}

                def on_request(request: Any, sent: dict[Any, float] = sent) -> None:
                    sent[request] = time.perf_counter()

                def on_finished(
                    request: Any, view: View = view, sent: dict[Any, float] = sent
                ) -> None:
                    path = request.url.split(base, 1)[-1]
                    if path.startswith("/v1/") and not path.startswith("/v1/stream"):
                        response = request.response()
                        status = response.status if response else 0
                        view.calls[path] = (status, time.perf_counter() - sent[request])

                page.on("request", on_request)
                page.on("requestfinished", on_finished)
                page.goto(f"{base}/", wait_until="commit")
                # A selector, not a JS predicate: the page's CSP forbids eval.
                page.wait_for_selector("body[data-ready='true']", state="attached", timeout=60_000)
                view.phases = page.evaluate(PHASES_JS)
                # The page's own clock: from navigation to every section initialised (what
                # Playwright's polling and round trips would add is not the page's).
                view.wall_s = view.phases["ready"] / 1000
                views.append(view)
                context.close()
        finally:
            chromium.close()
    return views


@dataclass
class Result:
    events: int
    http: list[View]
    browser: list[View]
    browser_skipped: str | None


def bench(
    settings: Settings, n: int, repeats: int, browser: bool = True, say: Any = print
) -> Result:
    marker = Path(settings.home) / "bench-console-events"
    if marker.exists() and int(marker.read_text()) >= n:
        events = int(marker.read_text())  # a home filled by an earlier run (--home)
        say(f"  the home already holds {events:,} events")
    else:
        events = asyncio.run(fill(settings, n, say))
        marker.write_text(str(events))
    with served(settings, Path(settings.home) / "bench-logs") as (base, token):
        session = console_session(base, token)
        http_view(base, session)  # the server's first request of each kind (imports, plans)
        views = [http_view(base, session) for _ in range(repeats)]
        skipped = browser_missing() if browser else "not asked"
        pages = browser_views(base, session, repeats) if skipped is None else []
    return Result(events=events, http=views, browser=pages, browser_skipped=skipped)


def report(result: Result) -> str:
    lines = [f"console first view, {result.events:,} events in the log, loopback:"]

    def row(label: str, views: list[View]) -> None:
        walls = [v.wall_s for v in views]
        median = statistics.median(walls)
        verdict = "meets" if median <= TARGET_S else "MISSES"
        lines.append(
            f"  {label:<8} first {walls[0] * 1000:7.0f} ms   median {median * 1000:7.0f} ms   "
            f"max {max(walls) * 1000:7.0f} ms   ({len(walls)} loads; {verdict} the "
            f"{TARGET_S:.0f} s target)"
        )
        slowest: dict[str, float] = {}
        for v in views:
            for path, (_, took) in v.calls.items():
                slowest[path] = max(slowest.get(path, 0.0), took)
        top = sorted(slowest.items(), key=lambda kv: -kv[1])[:4]
        lines.append(
            "           slowest calls: " + ", ".join(f"{p} {t * 1000:.0f} ms" for p, t in top)
        )
        failed = sorted({f"{p} {s}" for v in views for p, (s, _) in v.calls.items() if s != 200})
        if failed:
            lines.append("           not 200: " + ", ".join(failed))

    row("http", result.http)
    lines.append(
        f"           page {result.http[0].page_bytes:,} bytes, then {len(LOAD_CALLS)} "
        f"API calls, {PARALLEL} at a time"
    )
    if result.browser:
        row("browser", result.browser)
        names = [k for k in result.browser[0].phases if all(k in v.phases for v in result.browser)]
        medians = {k: statistics.median(v.phases[k] for v in result.browser) for k in names}
        phases = {k: ms for k, ms in medians.items() if not k.startswith("#")}
        sections = sorted(
            ((k, ms) for k, ms in medians.items() if k.startswith("#")), key=lambda kv: -kv[1]
        )
        lines.append(
            "           median phases (ms): "
            + ", ".join(f"{k} {ms:.0f}" for k, ms in phases.items())
        )
        lines.append(
            "           sections ready at (ms): " + ", ".join(f"{k} {ms:.0f}" for k, ms in sections)
        )
        made = {p for v in result.browser for p in v.calls}
        unlisted = sorted(p for p in made - set(LOAD_CALLS) if not p.startswith("/v1/sessions/"))
        if unlisted:
            lines.append(
                "           the page also called (add to LOAD_CALLS): " + ", ".join(unlisted)
            )
    else:
        lines.append(f"  browser  skipped: {result.browser_skipped}")
    lines.append(f"  machine: {os.cpu_count()} CPUs")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("events", nargs="?", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-browser", action="store_true")
    parser.add_argument("--home", type=Path, help="reuse the home of an earlier run (its log)")
    args = parser.parse_args(argv)
    if args.events < 100 or args.repeats < 1:
        parser.error("events must be >= 100 and repeats >= 1")
    home = args.home or Path(tempfile.mkdtemp(prefix="hpcds1-bench-console-")) / "home"
    print(f"home {home}: the log (embedded NATS and Postgres) ...")
    settings = Settings(home=home, log_level="warning")
    result = bench(settings, args.events, args.repeats, not args.no_browser)
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
