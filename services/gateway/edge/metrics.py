"""GET /metrics: the Prometheus exposition format (prometheus_client's), for a viewer's token.

Two kinds of figures:

- **Per gateway process:** `hpcds1_http_request_duration_seconds{method, route, status}`, a
  histogram measured by `RequestMetrics` around everything else (the request log, the body
  limit, the app), labelled by the route's template (`/v1/sessions/{session_id}`, never the raw
  path), the method (unknown methods are `other`) and the status class (`2xx`); a request no
  route handled (no route matches, or refused at the edge before routing) is
  `route="unmatched"`. Also the client's process and platform collectors
  (CPU, memory, file descriptors, Python version). Sum them over gateway replicas.
- **Of the whole deployment,** read at scrape time from the Postgres projection (one query,
  bounded by a statement timeout) and the event log's stream info on NATS, so that every gateway
  replica reports the same figures whether the services run in one `serve` process or each in
  its own: decisions by mode, runs and their durations, the projector's lag, the queue of each
  device, sessions by status, approvals waiting. Take them from any one replica (`max without
  (instance)`). A source that fails or takes longer than SOURCE_TIMEOUT_S is reported by
  `hpcds1_metrics_source_up{source} 0` and its figures are left out, never reported as zero.

The counters are counts of projected rows: they only grow, except across `hpc-ds1 projection
rebuild` (which empties the projection and refills it), which Prometheus sees as a counter reset.

docs/metrics.md lists every metric, the scrape configuration and example alerts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response
from prometheus_client import (
    CollectorRegistry,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from sqlalchemy import Engine, text

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.log import get_logger
from hpc_ds1.security.tokens import Principal
from hpc_ds1.settings import Settings
from hpc_ds1.version import __version__

from ..schemas import ERRORS_401_403
from .auth import require
from .middleware import ASGIApp, Message, Receive, Scope, Send

log = get_logger("gateway.metrics")

METRICS_PATH = "/metrics"
# Each source (Postgres, NATS) gets this long; Prometheus' default scrape timeout is 10 s.
SOURCE_TIMEOUT_S = 4.0

# Seconds. Fine below 25 ms, where the decide path's targets are (p99 <= 10 ms); up to the
# agents' long poll (HPC_DS1_LONG_POLL_S, 25 s by default).
REQUEST_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
# Seconds of one real run: kernels of milliseconds up to HPC_DS1_MAX_RUN_S (600 s by default).
RUN_BUCKETS = (0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "unmatched"
STATUS_CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx")

# The values the projection holds (events/catalog.py and the projector's fold); always
# reported, zero included, so that rate() and alerts have a series from the first scrape.
MODES = ("auto", "confirm", "escalate")
SESSION_STATUSES = ("running", "paused", "finished")
TASK_STATUSES = ("submitted", "waiting", "placed", "running", "finished", "failed")
RUN_PURPOSES = ("setup", "tune", "task", "evaluate", "run")
RUN_STATUSES = ("ok", "failed", "timed_out", "wrong_answer")
OTHER = "other"


# --- per request ---------------------------------------------------------------------------


def request_histogram(registry: CollectorRegistry) -> Histogram:
    return Histogram(
        "hpcds1_http_request_duration_seconds",
        "Time from a request's arrival at the gateway to the end of its response, by route "
        "template, method and status class.",
        ("method", "route", "status"),
        buckets=REQUEST_BUCKETS,
        registry=registry,
    )


def _route_template(scope: Scope) -> str:
    """The template of the route that handled the request (the router puts it in the scope);
    `unmatched` when no route did: none matches the path (404, a redirect to add or drop a
    slash), or the edge refused the request before routing (413 body too large, 422 control
    character in the path)."""
    template = getattr(scope.get("route"), "path_format", None)
    return template if isinstance(template, str) else UNMATCHED


class RequestMetrics:
    """Observes every HTTP request's duration in `histogram`, labelled by method, route
    template and status class. Outermost middleware, so the 500 RequestLog makes of an
    unhandled exception is counted as what the client got. A label set's child is looked up
    once and kept (a bounded set: methods x templates x five classes)."""

    def __init__(self, app: ASGIApp, histogram: Histogram) -> None:
        self.app = app
        self.histogram = histogram
        self._children: dict[tuple[str, str, int], Any] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        cancelled = False
        try:
            await self.app(scope, receive, send_status)
        except asyncio.CancelledError:
            cancelled = True
            raise
        finally:
            # A request cancelled before any response (its client went away during a long
            # poll) served nothing: not counted. An error without a response is a 5xx.
            if not (cancelled and status == 0):
                self._observe(scope, status, time.perf_counter() - started)

    def _observe(self, scope: Scope, status: int, elapsed: float) -> None:
        method = scope.get("method", "")
        if method not in METHODS:  # any string a client sends: one label, one cache key
            method = OTHER
        key = (method, _route_template(scope), status // 100 if 100 <= status < 600 else 5)
        child = self._children.get(key)
        if child is None:
            child = self.histogram.labels(method, key[1], STATUS_CLASSES[key[2] - 1])
            self._children[key] = child
        child.observe(elapsed)


# --- of the deployment, from the projection and the log -----------------------------------

_RUN_BUCKET_COUNTS = ", ".join(
    f"count(*) FILTER (WHERE status = 'ok' AND runtime_s <= {b!r})" for b in RUN_BUCKETS
)
_PURPOSE = "CASE WHEN purpose IN ({}) THEN purpose ELSE '{}' END".format(
    ", ".join(f"'{p}'" for p in RUN_PURPOSES), OTHER
)

# One statement, one round trip: each figure a scalar subquery (JSON where it has labels).
PROJECTION_QUERY = text(f"""
SELECT
  (SELECT last_seq FROM projection_checkpoint WHERE name = 'main') AS checkpoint,
  (SELECT count(*) FROM projection_set_aside) AS set_aside,
  (SELECT coalesce(json_object_agg(mode, n), '{{}}')
     FROM (SELECT mode, count(*) AS n FROM decisions GROUP BY mode) x) AS decisions,
  (SELECT coalesce(json_object_agg(status, n), '{{}}')
     FROM (SELECT status, count(*) AS n FROM sessions GROUP BY status) x) AS sessions,
  (SELECT coalesce(json_object_agg(status, n), '{{}}')
     FROM (SELECT status, count(*) AS n FROM tasks GROUP BY status) x) AS tasks,
  (SELECT json_build_array(count(*), extract(epoch FROM min(requested_at)))
     FROM approvals WHERE status = 'waiting') AS approvals,
  (SELECT coalesce(json_agg(json_build_array(ids.device_id, d.liveness,
                                             coalesce(q.placed, 0), coalesce(q.running, 0))
                            ORDER BY ids.device_id), '[]')
     FROM (SELECT device_id FROM devices WHERE status <> 'left'
           UNION SELECT device_id FROM tasks
                  WHERE status IN ('placed', 'running') AND device_id IS NOT NULL) ids
     LEFT JOIN devices d USING (device_id)
     LEFT JOIN (SELECT device_id,
                       count(*) FILTER (WHERE status = 'placed') AS placed,
                       count(*) FILTER (WHERE status = 'running') AS running
                  FROM tasks WHERE status IN ('placed', 'running') GROUP BY device_id) q
       USING (device_id)) AS devices,
  (SELECT coalesce(json_agg(json_build_array(purpose, status, n, ok, ok_sum, buckets)), '[]')
     FROM (SELECT {_PURPOSE} AS purpose, status, count(*) AS n,
                  count(*) FILTER (WHERE status = 'ok' AND runtime_s IS NOT NULL) AS ok,
                  coalesce(sum(runtime_s) FILTER (WHERE status = 'ok'), 0) AS ok_sum,
                  ARRAY[{_RUN_BUCKET_COUNTS}] AS buckets
             FROM measurements GROUP BY 1, 2) x) AS runs
""")


@dataclass
class Projection:
    """What the projection says, read in one query."""

    checkpoint: int
    set_aside: int
    decisions: dict[str, int]
    sessions: dict[str, int]
    tasks: dict[str, int]
    approvals_waiting: int
    oldest_waiting_at: float | None  # Unix time of the oldest waiting approval
    # (device_id, liveness or None, tasks placed on it and not started, tasks running)
    devices: list[tuple[str, str | None, int, int]]
    # (purpose, status, runs, ok runs with a runtime, their runtime sum, cumulative buckets)
    runs: list[tuple[str, str, int, int, float, list[int]]]


def read_projection(engine: Engine, timeout_s: float = SOURCE_TIMEOUT_S) -> Projection:
    with engine.begin() as conn:
        # Bounded: a scrape never holds a connection longer than this.
        conn.execute(text(f"SET LOCAL statement_timeout = {int(timeout_s * 1000)}"))
        row = conn.execute(PROJECTION_QUERY).mappings().one()
    waiting, oldest = row["approvals"]
    return Projection(
        checkpoint=int(row["checkpoint"] or 0),
        set_aside=int(row["set_aside"]),
        decisions={str(k): int(v) for k, v in row["decisions"].items()},
        sessions={str(k): int(v) for k, v in row["sessions"].items()},
        tasks={str(k): int(v) for k, v in row["tasks"].items()},
        approvals_waiting=int(waiting),
        oldest_waiting_at=float(oldest) if oldest is not None else None,
        devices=[(str(d), lv, int(p), int(r)) for d, lv, p, r in row["devices"]],
        runs=[
            (str(p), str(s), int(n), int(ok), float(total), [int(b) for b in buckets])
            for p, s, n, ok, total, buckets in row["runs"]
        ],
    )


@dataclass
class LogState:
    """The event log's end on NATS, and when the first event the projection lacks was
    appended (None: it lacks none, or it was not asked)."""

    last_seq: int
    first_unprojected_at: float | None = None


async def read_log(bus: EventBus, checkpoint: int | None) -> LogState:
    info = await bus.js.stream_info(bus.stream)
    last = int(info.state.last_seq)
    if checkpoint is None or last <= checkpoint:
        return LogState(last)
    # The first stored event after the checkpoint (next_by_subj skips any gap in the stream).
    msg = await bus.js.get_msg(bus.stream, seq=checkpoint + 1, subject=f"{bus.prefix}.>", next=True)
    return LogState(last, msg.time.timestamp() if msg.time is not None else None)


@dataclass
class Sources:
    projection: Projection | None = None
    log: LogState | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    now: float = field(default_factory=time.time)


async def gather_sources(bus: EventBus, engine: Engine, timeout_s: float) -> Sources:
    """Postgres and NATS at once; each one that fails or times out is left None (and logged)."""
    sources = Sources()

    async def projection() -> None:
        started = time.perf_counter()
        try:
            sources.projection = await asyncio.wait_for(
                asyncio.to_thread(read_projection, engine, timeout_s), timeout_s + 0.5
            )
        except Exception as error:
            log.warning("metrics_source_failed", source="postgres", error=_describe(error))
        sources.seconds["postgres"] = time.perf_counter() - started

    async def stream() -> None:
        started = time.perf_counter()
        try:
            sources.log = await asyncio.wait_for(read_log(bus, None), timeout_s)
        except Exception as error:
            log.warning("metrics_source_failed", source="nats", error=_describe(error))
        sources.seconds["nats"] = time.perf_counter() - started

    await asyncio.gather(projection(), stream())
    # The age of the oldest event not yet projected: one more NATS call, only when some is.
    if sources.projection is not None and sources.log is not None:
        if sources.log.last_seq > sources.projection.checkpoint:
            started = time.perf_counter()
            try:
                state = await asyncio.wait_for(
                    read_log(bus, sources.projection.checkpoint), timeout_s
                )
                sources.log.first_unprojected_at = state.first_unprojected_at
            except Exception as error:  # lag in events is still reported
                log.warning("metrics_source_failed", source="nats", error=_describe(error))
            sources.seconds["nats"] += time.perf_counter() - started
    sources.now = time.time()
    return sources


def _describe(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return "timed out"
    return f"{type(error).__name__}: {error}"[:300]


def _counts(values: dict[str, int], known: Iterable[str]) -> dict[str, int]:
    """Every known label with its count (0 when absent), then any other the table holds."""
    return {k: values.get(k, 0) for k in known} | {
        k: v for k, v in sorted(values.items()) if k not in known
    }


def domain_families(sources: Sources) -> Iterator[Metric]:
    """The figures of the deployment, as metric families."""
    up = GaugeMetricFamily(
        "hpcds1_metrics_source_up",
        "1: this scrape read the source; 0: it failed or timed out, and its figures are absent.",
        labels=["source"],
    )
    up.add_metric(["postgres"], 1.0 if sources.projection is not None else 0.0)
    up.add_metric(["nats"], 1.0 if sources.log is not None else 0.0)
    yield up
    took = GaugeMetricFamily(
        "hpcds1_metrics_source_seconds",
        "How long this scrape took to read each source.",
        labels=["source"],
    )
    for name, seconds in sorted(sources.seconds.items()):
        took.add_metric([name], seconds)
    yield took

    p, events = sources.projection, sources.log
    if events is not None:
        yield GaugeMetricFamily(
            "hpcds1_eventlog_last_sequence",
            "Sequence of the last event appended to the log (the JetStream stream).",
            value=events.last_seq,
        )
    if p is not None:
        yield GaugeMetricFamily(
            "hpcds1_projector_checkpoint_sequence",
            "Sequence of the last event folded into the Postgres projection.",
            value=p.checkpoint,
        )
        yield GaugeMetricFamily(
            "hpcds1_projector_set_aside_events",
            "Events the projector set aside because Postgres refused them (each one in the "
            "projection_set_aside table, with its reason).",
            value=p.set_aside,
        )
    if p is not None and events is not None:
        behind = max(0, events.last_seq - p.checkpoint)
        yield GaugeMetricFamily(
            "hpcds1_projector_lag_events",
            "Events in the log not yet in the projection.",
            value=behind,
        )
        if behind == 0 or events.first_unprojected_at is not None:
            age = (
                0.0
                if behind == 0 or events.first_unprojected_at is None
                else max(0.0, sources.now - events.first_unprojected_at)
            )
            yield GaugeMetricFamily(
                "hpcds1_projector_lag_seconds",
                "Age of the oldest event in the log not yet in the projection (0: none).",
                value=age,
            )
    if p is None:
        return

    decisions = CounterMetricFamily(
        "hpcds1_decisions", "Decisions made, by mode (auto, confirm, escalate).", labels=["mode"]
    )
    for mode, n in _counts(p.decisions, MODES).items():
        decisions.add_metric([mode], n)
    yield decisions

    runs = CounterMetricFamily(
        "hpcds1_runs",
        "Real runs measured (every measurement), by purpose and status.",
        labels=["purpose", "status"],
    )
    durations = HistogramMetricFamily(
        "hpcds1_run_duration_seconds",
        "Runtime of each successful real run (status ok), by purpose.",
        labels=["purpose"],
    )
    seen: dict[tuple[str, str], int] = {}
    ok: dict[str, tuple[int, float, list[int]]] = {}
    for purpose, status, n, n_ok, total, buckets in p.runs:
        seen[(purpose, status)] = seen.get((purpose, status), 0) + n
        if n_ok:
            count, summed, cumulative = ok.get(purpose, (0, 0.0, [0] * len(RUN_BUCKETS)))
            ok[purpose] = (
                count + n_ok,
                summed + total,
                [a + b for a, b in zip(cumulative, buckets, strict=True)],
            )
    for purpose in (*RUN_PURPOSES, *sorted({k[0] for k in seen} - set(RUN_PURPOSES))):
        for status in (*RUN_STATUSES, *sorted({k[1] for k in seen} - set(RUN_STATUSES))):
            if (purpose, status) in seen or (purpose in RUN_PURPOSES and status == "ok"):
                runs.add_metric([purpose, status], seen.get((purpose, status), 0))
        count, summed, cumulative = ok.get(purpose, (0, 0.0, [0] * len(RUN_BUCKETS)))
        if count or purpose in RUN_PURPOSES:
            bounds = [(repr(b), float(c)) for b, c in zip(RUN_BUCKETS, cumulative, strict=True)]
            durations.add_metric([purpose], [*bounds, ("+Inf", float(count))], summed)
    yield runs
    yield durations

    sessions = GaugeMetricFamily(
        "hpcds1_sessions",
        "Tuning sessions, by status (running, paused, finished).",
        labels=["status"],
    )
    for status, n in _counts(p.sessions, SESSION_STATUSES).items():
        sessions.add_metric([status], n)
    yield sessions

    yield GaugeMetricFamily(
        "hpcds1_approvals_waiting",
        "Moves waiting for an engineer's approval.",
        value=p.approvals_waiting,
    )
    yield GaugeMetricFamily(
        "hpcds1_approvals_oldest_waiting_seconds",
        "How long the oldest waiting approval has waited (0: none waits).",
        value=max(0.0, sources.now - p.oldest_waiting_at) if p.oldest_waiting_at else 0.0,
    )

    tasks = GaugeMetricFamily(
        "hpcds1_tasks",
        "Fleet tasks, by status (waiting: no device can take it yet; placed: queued on a device).",
        labels=["status"],
    )
    for status, n in _counts(p.tasks, TASK_STATUSES).items():
        tasks.add_metric([status], n)
    yield tasks

    queued = GaugeMetricFamily(
        "hpcds1_device_queue_depth",
        "Tasks placed on the device and not yet started.",
        labels=["device_id"],
    )
    running = GaugeMetricFamily(
        "hpcds1_device_tasks_running", "Tasks running on the device.", labels=["device_id"]
    )
    online = GaugeMetricFamily(
        "hpcds1_device_online",
        "1: the device's heartbeats arrive; 0: it went silent (or was never heard from).",
        labels=["device_id"],
    )
    for device_id, liveness, placed, now_running in p.devices:
        queued.add_metric([device_id], placed)
        running.add_metric([device_id], now_running)
        online.add_metric([device_id], 1.0 if liveness == "online" else 0.0)
    yield queued
    yield running
    yield online


class _Scrape:
    """A collector of one scrape: the gateway's registry, then the deployment's figures."""

    def __init__(self, registry: CollectorRegistry, sources: Sources) -> None:
        self.registry = registry
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        yield from self.registry.collect()
        yield from domain_families(self.sources)


def install_metrics(app: FastAPI, settings: Settings, bus: EventBus, engine: Engine) -> None:
    """GET /metrics and the request histogram's middleware. Call after every other
    add_middleware: it must be the outermost."""
    # No `_created` series beside each histogram in the text format: a series per label set
    # that no query of ours needs (process-wide; the gateway's process has no other metrics).
    disable_created_metrics()
    registry = CollectorRegistry(auto_describe=False)
    histogram = request_histogram(registry)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    info = GaugeMetricFamily("hpcds1_build_info", "The gateway's version.", labels=["version"])
    info.add_metric([__version__], 1.0)

    class _Info:
        def collect(self) -> Iterator[Metric]:
            yield info

    registry.register(_Info())
    app.state.metrics = registry

    @app.get(
        METRICS_PATH,
        tags=["health"],
        response_class=Response,
        responses={
            **ERRORS_401_403,
            200: {
                "description": "The Prometheus text exposition format (OpenMetrics when the "
                "scraper asks for it).",
                "content": {"text/plain": {}},
            },
        },
    )
    async def metrics(
        request: Request, _: Annotated[Principal, Depends(require("viewer"))]
    ) -> Response:
        """Prometheus metrics: request latency per route on this gateway; decisions by mode,
        runs and their durations, the projector's lag, each device's queue, sessions and
        approvals waiting, from the projection (docs/metrics.md). Needs a viewer's token."""
        sources = await gather_sources(bus, engine, SOURCE_TIMEOUT_S)
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(_Scrape(registry, sources)), media_type=content_type)  # type: ignore[arg-type]

    app.add_middleware(RequestMetrics, histogram=histogram)
