"""A setup run that takes longer than the heartbeat interval sends run.heartbeat events while
it is in flight (issue 44, item 4), the projector keeps them as valid rows, the progress bar
is told what runs and for how long, and the workload's own `repeats` is what setup plans.

The interval is the campaign's (HPC_DS1_RUN_HEARTBEAT_S by default), 0.4 s here, so a real
run of 2 s (a command workload that sleeps, one rank under our mpiexec) has four."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from sqlalchemy import select

from hpc_ds1.db import tables
from hpc_ds1.eventlog.subjects import agent_run_subject
from hpc_ds1.requests import RunRequest
from hpc_ds1.settings import Settings
from hpc_ds1.setup import PROFILES, Campaign, plan_jobs
from hpc_ds1.space import ConfigSpace
from hpc_ds1.stack import open_stack
from hpc_ds1.workloads import CommandWorkload, load_workload_file, register, unregister

TOML = """
[workload]
name = "beating"
command = "{python} -c 'import sys, time; time.sleep(float(sys.argv[1])); print(\\"runtime_s=\\" + sys.argv[1])' {size}"
launcher = "mpi"
sizes = [1, 2]
warmup = false
repeats = 1
timeout = 30
[check]
exit_code = true
"""  # noqa: E501


async def test_a_long_setup_run_beats_and_the_projector_keeps_it(
    settings: Settings, tmp_path: Path
) -> None:
    (tmp_path / "beating.toml").write_text(TOML)
    wl = load_workload_file(tmp_path / "beating.toml")
    assert isinstance(wl, CommandWorkload)
    space = ConfigSpace.for_cpus(1, wl.tiles, 0)
    planned = plan_jobs([wl], {wl.name: space}, PROFILES["quick"], [2])
    assert {j.repeats for c in planned for j in c} == {1}  # the file's, not the profile's 2
    one = [j for j in planned[0] if (j.config.ranks, j.config.threads) == (1, 1)]
    plan = [one]  # one run: 1 rank, 1 thread
    assert plan_jobs([wl], {wl.name: space}, PROFILES["quick"], [1], repeats=3)[0][0].repeats == 3
    labels: list[str] = []
    register(wl, replace=True)
    try:
        async with open_stack(settings, ("projector",), "test-heartbeat") as stack:
            campaign = Campaign(stack, "dev-beating", heartbeat_s=0.4)  # no agent needed
            report = await campaign.run(plan, lambda done, total, label: labels.append(label))
            await stack.caught_up()
            with stack.engine.connect() as conn:
                t = tables.events
                rows = conn.execute(
                    select(t.c.type, t.c.subject, t.c.valid, t.c.error, t.c.data)
                    .where(t.c.type == "run.heartbeat")
                    .order_by(t.c.seq)
                ).all()
    finally:
        unregister(wl.name)
    assert report.by_status == {"ok": 1}, report
    assert len(rows) >= 2, rows  # 2 s at 0.4 s: beats at 0.4 ... 1.6 (a loaded CPU: fewer)
    assert all(r.valid and r.error is None for r in rows)
    first = rows[0].data
    assert rows[0].subject == f"{settings.subject_prefix}.run.{campaign.run_id}.heartbeat"
    assert (first["workload"], first["size"], first["purpose"]) == ("beating", 2, "setup")
    assert first["config"]["ranks"] == 1 and first["timeout_s"] == 30.0  # the file's
    assert [r.data["beat"] for r in rows] == list(range(1, len(rows) + 1))
    assert rows[-1].data["elapsed_s"] >= 0.4 * len(rows)
    assert any(label.startswith("beating 2 · 1x1") for label in labels), labels


async def test_a_session_steps_long_run_on_the_agent_beats_with_its_session(
    settings: Settings, tmp_path: Path
) -> None:
    """A tuning session's step runs on the device's agent: its heartbeats name the session."""
    (tmp_path / "beating.toml").write_text(TOML)
    wl = load_workload_file(tmp_path / "beating.toml")
    assert isinstance(wl, CommandWorkload)
    fast = settings.model_copy(update={"run_heartbeat_s": 0.4})
    ask = RunRequest(
        workload="beating",
        size=2,
        config={"ranks": 1, "threads": 1, "tile": 1},
        repeats=1,
        purpose="tune",
        actor="alice",
        session_id="s-beating",
    )
    register(wl, replace=True)
    try:
        async with open_stack(fast, ("projector", "agent"), "test-heartbeat-agent") as stack:
            device = await stack.local_device()
            reply = await stack.bus.nc.request(
                agent_run_subject(fast, device), ask.model_dump_json().encode(), timeout=120
            )
            assert orjson.loads(reply.data)["result"]["status"] == "ok", reply.data
            await stack.caught_up()
            with stack.engine.connect() as conn:
                t = tables.events
                rows = conn.execute(
                    select(t.c.subject, t.c.actor, t.c.data)
                    .where(t.c.type == "run.heartbeat")
                    .order_by(t.c.seq)
                ).all()
    finally:
        unregister(wl.name)
    assert len(rows) >= 2, rows
    assert rows[0].subject == f"{fast.subject_prefix}.run.s-beating.heartbeat"
    data = rows[0].data
    assert (data["session_id"], data["purpose"], data["device_id"]) == ("s-beating", "tune", device)
    assert rows[0].actor == "alice" and data["timeout_s"] == 30.0  # the file's, under the cap


def test_tune_shows_a_step_in_flight_and_keeps_it_out_of_its_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from hpc_ds1.cli.tune import StepTable

    beat = {
        "config": {"ranks": 2, "threads": 1, "tile": 1, "gpu": False, "knobs": {"nb": 64}},
        "elapsed_s": 65.2,
        "timeout_s": 600.0,
    }
    StepTable("s-1").show("heartbeat", beat)
    line = capsys.readouterr().out.splitlines()[-1]
    assert "… running" in line and "ranks=2 threads=1 tile=1 nb=64" in line, line
    assert "1m05s" in line and "timeout 10m00s" in line, line
    quiet = StepTable("s-1", as_json=True)
    quiet.show("heartbeat", beat)
    assert quiet.found["events"] == [] and capsys.readouterr().out == ""
