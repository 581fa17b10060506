"""Decisions on a really measured and trained device, over every surface."""

from __future__ import annotations

import asyncio
import json

import httpx
import orjson
from sqlalchemy import select

import hpc_ds1
from hpc_ds1.db import tables
from hpc_ds1.eventlog.subjects import decide_subject
from hpc_ds1.infra.ports import free_port
from hpc_ds1.machine.hardware import fingerprint
from hpc_ds1.model import State
from hpc_ds1.requests import DecideRequest
from hpc_ds1.settings import Settings
from hpc_ds1.space import Config, ConfigSpace
from hpc_ds1.stack import open_stack
from tests.support.commands import HPC_DS1, cli_env

from .tokens import bearer, grant

SERVICES = ("projector", "agent", "decision", "gateway")


async def test_python_nats_http_and_cli_give_the_same_decision(
    e2e_settings: Settings, trained: dict
) -> None:
    settings = e2e_settings.model_copy(update={"port": free_port()})
    config = Config(ranks=1, threads=1, tile=32)
    runtime = 0.004
    model = hpc_ds1.load(trained["home"])
    assert model.version == trained["version"]
    local = model.decide(
        State(workload="gemm", size=288, config=config, runtime_s=runtime),
        space=ConfigSpace.for_device(workload="gemm"),
        fingerprint=fingerprint(),
    )
    body = {
        "workload": "gemm",
        "size": 288,
        "config": {"ranks": 1, "threads": 1, "tile": 32},
        "telemetry": {"runtime_s": runtime},
    }
    async with open_stack(settings, SERVICES, "e2e-decide") as stack:
        await stack.local_device()
        reply = await stack.bus.nc.request(
            decide_subject(settings),
            DecideRequest.model_validate(body).model_dump_json().encode(),
            timeout=30,
        )
        over_nats = orjson.loads(reply.data)["decision"]
        url = f"http://127.0.0.1:{settings.port}"
        viewer = await grant(stack, "viewer", "vic")
        async with httpx.AsyncClient(headers=bearer(viewer)) as http:
            over_http = (await http.post(f"{url}/v1/decide", json=body)).json()
            # Defect 8: who asks, for which session, is the credential's to say, not the body's.
            for field, value in (("session_id", "s-of-someone"), ("source", "session")):
                refused = await http.post(f"{url}/v1/decide", json={**body, field: value})
                assert refused.status_code == 422 and field in refused.json()["error"]
        # The gateway serves from this event loop: the CLI must not block it.
        cli = await asyncio.create_subprocess_exec(
            HPC_DS1,
            "decide",
            "--server",
            url,
            "--workload",
            "gemm",
            "--size",
            "288",
            "--ranks",
            "1",
            "--threads",
            "1",
            "--tile",
            "32",
            "--runtime-s",
            str(runtime),
            "--token",
            viewer,
            "--json",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=cli_env(settings),
        )
        out, err = await asyncio.wait_for(cli.communicate(), 120)
        assert cli.returncode == 0, err.decode()
        over_cli = json.loads(out)
        await stack.caught_up()
        with stack.engine.connect() as conn:
            logged = conn.execute(
                select(tables.decisions.c.decision_id, tables.decisions.c.choice).where(
                    tables.decisions.c.decision_id.in_(
                        [d["decision_id"] for d in (over_nats, over_http, over_cli)]
                    )
                )
            ).all()
    for answer in (over_http, over_cli):
        assert answer["source"] == "api" and answer["actor"] == "vic"
        assert answer["session_id"] is None
    for answer in (over_nats, over_http, over_cli):
        assert answer["choice"] == local.choice
        assert abs(answer["confidence"] - local.confidence) < 1e-6
        assert answer["mode"] == local.mode
        assert answer["model_version"] == model.version
        assert answer["ran"] is False
    assert len(logged) == 3 and {c for _, c in logged} == {local.choice}


async def test_without_telemetry_the_job_runs_first_for_real(
    e2e_settings: Settings, trained: dict
) -> None:
    settings = e2e_settings.model_copy(update={"port": free_port()})
    async with open_stack(settings, SERVICES, "e2e-decide") as stack:
        await stack.local_device()
        job = {"workload": "montecarlo", "size": 200_000, "config": {"ranks": 2, "threads": 1}}
        url = f"http://127.0.0.1:{settings.port}/v1/decide"
        viewer, engineer = await grant(stack, "viewer"), await grant(stack, "engineer")
        async with httpx.AsyncClient(timeout=300) as http:
            # Defect 2: a run for real needs an engineer.
            assert (await http.post(url, json=job)).status_code == 401
            denied = await http.post(url, json=job, headers=bearer(viewer))
            assert denied.status_code == 403 and "engineer" in denied.json()["error"]
            reply = await http.post(url, json=job, headers=bearer(engineer))
        assert reply.status_code == 200, reply.text
        answer = reply.json()
        await stack.caught_up()
        with stack.engine.connect() as conn:
            measured = (
                conn.execute(
                    select(tables.measurements.c.runtime_s).where(
                        tables.measurements.c.purpose == "decide"
                    )
                )
                .scalars()
                .all()
            )
    assert answer["ran"] is True and answer["telemetry"]["runtime_s"] > 0
    assert answer["config"]["tile"] == 4096  # the workload's default tile
    assert answer["telemetry"]["runtime_s"] in measured


async def test_the_guard_and_bad_input(e2e_settings: Settings, trained: dict) -> None:
    settings = e2e_settings.model_copy(update={"port": free_port()})
    url = f"http://127.0.0.1:{settings.port}/v1/decide"
    telemetry = {"runtime_s": 0.01}
    async with open_stack(settings, SERVICES, "e2e-decide") as stack:
        await stack.local_device()
        viewer = await grant(stack, "viewer")
        async with httpx.AsyncClient(timeout=60, headers=bearer(viewer)) as http:

            async def post(workload: str, size: int, ranks: int, threads: int) -> httpx.Response:
                config = {"ranks": ranks, "threads": threads}
                body = {"workload": workload, "size": size, "config": config}
                return await http.post(url, json={**body, "telemetry": telemetry})

            unknown = (await post("spmv", 1000, 1, 1)).json()
            too_big = (await post("gemm", 2048, 1, 2)).json()
            oversubscribed = (await post("gemm", 288, 2, 4)).json()
            infeasible = await post("gemm", 288, 3, 1)
            nan = await http.post(
                url,
                content=b'{"workload": "gemm", "size": 288, "config": '
                b'{"ranks": 1, "threads": 1}, "telemetry": {"runtime_s": NaN}}',
                headers={"Content-Type": "application/json"},
            )
            unknown_key = await http.post(
                url,
                json={
                    "workload": "gemm",
                    "size": 288,
                    "config": {"ranks": 1, "threads": 1, "nodes": 2},
                },
            )
            negative = await http.post(
                url, json={"workload": "gemm", "size": -5, "config": {"ranks": 1, "threads": 1}}
            )
    assert unknown["mode"] == "escalate"
    assert any("'spmv' was never measured on this machine" in r for r in unknown["reasons"])
    assert too_big["mode"] == "escalate"
    assert any("outside the measured range 192" in r for r in too_big["reasons"])
    assert oversubscribed["mode"] == "escalate"
    assert any("outside the space measured" in r for r in oversubscribed["reasons"])
    assert infeasible.status_code == 422 and "ranks=3 is not accepted" in infeasible.text
    assert nan.status_code == 422
    assert unknown_key.status_code == 422 and "nodes" in unknown_key.text
    assert negative.status_code == 422 and "size" in negative.text
