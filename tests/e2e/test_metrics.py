"""GET /metrics from a real gateway over HTTP, on the really measured and trained device: the
setup's runs are counted, and decisions made over HTTP move the counters by exactly what was
decided."""

from __future__ import annotations

from collections import Counter

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from hpc_ds1.db import tables
from hpc_ds1.infra.ports import free_port
from hpc_ds1.settings import Settings
from hpc_ds1.stack import open_stack

from .tokens import bearer, grant

SERVICES = ("projector", "agent", "decision", "gateway")
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(http: httpx.AsyncClient, url: str) -> Samples:
    reply = await http.get(f"{url}/metrics")
    assert reply.status_code == 200, reply.text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(reply.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def test_metrics_count_what_the_deployment_did(e2e_settings: Settings, trained: dict) -> None:
    settings = e2e_settings.model_copy(update={"port": free_port()})
    body = {
        "workload": "gemm",
        "size": 288,
        "config": {"ranks": 1, "threads": 1, "tile": 32},
        "telemetry": {"runtime_s": 0.004},
    }
    async with open_stack(settings, SERVICES, "e2e-metrics") as stack:
        await stack.local_device()
        url = f"http://127.0.0.1:{settings.port}"
        viewer = await grant(stack, "viewer", "prometheus")
        async with httpx.AsyncClient(timeout=60) as http:
            assert (await http.get(f"{url}/metrics")).status_code == 401
            http.headers.update(bearer(viewer))
            before = await scrape(http, url)
            modes = Counter()
            for _ in range(3):
                reply = await http.post(f"{url}/v1/decide", json=body)
                assert reply.status_code == 200, reply.text
                modes[reply.json()["mode"]] += 1
            await stack.caught_up()
            after = await scrape(http, url)
        with stack.engine.connect() as conn:
            m = tables.measurements
            setup_ok = conn.execute(
                select(func.count()).where(
                    m.c.purpose == "setup", m.c.status == "ok", m.c.runtime_s.is_not(None)
                )
            ).scalar_one()

    for mode in ("auto", "confirm", "escalate"):
        made = value(after, "hpcds1_decisions_total", mode=mode) - value(
            before, "hpcds1_decisions_total", mode=mode
        )
        assert made == modes[mode], (mode, made, modes)
    decide = {"method": "POST", "route": "/v1/decide", "status": "2xx"}
    count = "hpcds1_http_request_duration_seconds_count"
    assert value(after, count, **decide) - value(before, count, **decide) == 3
    # The setup's real runs, as the projection holds them.
    assert setup_ok > 0
    assert value(after, "hpcds1_run_duration_seconds_count", purpose="setup") == setup_ok
    assert value(after, "hpcds1_run_duration_seconds_sum", purpose="setup") > 0
    assert value(after, "hpcds1_metrics_source_up", source="postgres") == 1
    assert value(after, "hpcds1_metrics_source_up", source="nats") == 1
    assert value(after, "hpcds1_projector_checkpoint_sequence") <= value(
        after, "hpcds1_eventlog_last_sequence"
    )
