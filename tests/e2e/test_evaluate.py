"""`hpc-ds1 evaluate` on the really measured and trained device of this folder: it measures the
held-out sizes for real, publishes the evaluation, serves it over HTTP, and training never
sees what it measured."""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import orjson
import pytest
from sqlalchemy import and_, func, or_, select

from hpc_ds1.db import tables
from hpc_ds1.evaluation.policies import ALL_POLICIES, LIVE_POLICIES
from hpc_ds1.eventlog.subjects import train_subject
from hpc_ds1.infra.ports import free_port
from hpc_ds1.model import Model, State
from hpc_ds1.settings import Settings
from hpc_ds1.space import ConfigSpace
from hpc_ds1.stack import Stack, open_stack
from tests.support.commands import HPC_DS1, cli_env

from .tokens import bearer, grant

# The default run evaluates one held-out size; the slow tier (`make test-slow`) both workloads'.
# Each size is held out by no other test of this folder, so the counts below are this run's.
HELD_SMALL = "montecarlo=350000"
HELD_FULL = "gemm=240,montecarlo=300000"


def held_sizes(held: str) -> dict[str, list[int]]:
    sizes: dict[str, list[int]] = {}
    for pair in held.split(","):
        workload, size = pair.split("=")
        sizes.setdefault(workload, []).append(int(size))
    return sizes


async def cli(settings: Settings, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        HPC_DS1,
        "evaluate",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=cli_env(settings),
    )
    out, err = await asyncio.wait_for(proc.communicate(), 600)
    return proc.returncode or 0, out.decode(), err.decode()


async def retrain(stack: Stack, device_id: str) -> dict:
    reply = await stack.bus.nc.request(
        train_subject(stack.settings), orjson.dumps({"device_id": device_id}), timeout=600
    )
    answer = orjson.loads(reply.data)
    assert answer["ok"], answer
    return dict(answer)


@pytest.mark.parametrize(
    "held", [HELD_SMALL, pytest.param(HELD_FULL, marks=pytest.mark.slow)], ids=["one", "both"]
)
async def test_evaluate_measures_publishes_and_never_trains_on_held_out(
    e2e_settings: Settings, trained: dict, held: str
) -> None:
    sizes = held_sizes(held)
    # other tests of this folder may have added runs: the model before is trained on what the
    # log holds now, and evaluate adds only held-out runs
    async with open_stack(e2e_settings, ("projector", "trainer"), "e2e-eval-train") as stack:
        first = await retrain(stack, trained["device_id"])
    code, out, err = await cli(e2e_settings, "--sizes", "gemm=288")
    assert code == 2 and "used in training" in err and "gemm 288" in err

    code, out, err = await cli(
        e2e_settings, "--sizes", held, "--seed", "5", "--live", "1", "--json"
    )
    assert code == 0, err
    results = json.loads(out)
    assert results["model_version"] == first["version"] and results["seed"] == 5
    assert results["landscape"]["sizes"] == sizes
    policies = {row["policy"] for row in results["sessions"]["table"]}
    assert policies == set(ALL_POLICIES)  # every policy replayed, and the live sessions
    live = results["live"]  # from the recommendation and one seeded start per size, for real
    assert {r["policy"] for r in live["table"]} == set(LIVE_POLICIES)
    # one seeded start per size, and the recommendation where it ran at that size
    sessions = live["all"]["live"]["sessions"]
    n = sum(len(s) for s in sizes.values())
    assert n <= sessions <= 2 * n and live["all"]["replayed"]["sessions"] == sessions
    assert live["runs"] >= sessions and live["failed_runs"] == 0 and live["run_seconds"] > 0
    assert f"live session {sessions}: " in err
    plot = trained["home"] / "evaluation" / f"{first['version']}-full.png"
    assert plot.read_bytes()[:4] == b"\x89PNG"

    configs = {
        w: len(ConfigSpace.for_device(workload=w).configs()) * len(s) for w, s in sizes.items()
    }
    settings = e2e_settings.model_copy(update={"port": free_port()})
    async with open_stack(settings, ("projector", "gateway", "trainer"), "e2e-eval") as stack:
        m = tables.measurements
        these = or_(*(and_(m.c.workload == w, m.c.size == n) for w, s in sizes.items() for n in s))
        with stack.engine.connect() as conn:
            measured, truth, live_runs = (
                conn.execute(
                    select(func.count()).where(
                        m.c.purpose == purpose, m.c.held_out.is_(True), these
                    )
                ).scalar_one()
                for purpose in ("evaluate", "truth", "live")
            )
            # and every held-out run of the folder so far (an earlier case's too)
            held_out = conn.execute(select(func.count()).where(m.c.held_out.is_(True))).scalar_one()
        assert measured == sum(configs.values()) == results["landscape"]["measurements"]
        # the truth pass re-measured (held out too) what the scores are taken against
        assert truth > 0 and "truth" in results
        assert live_runs == live["runs"]  # every live run recorded, apart from the passes

        base = f"http://127.0.0.1:{settings.port}"
        headers = bearer(await grant(stack, "viewer"))
        async with httpx.AsyncClient(base_url=base, headers=headers) as http:
            got = (await http.get("/v1/evaluation")).json()
            png = await http.get(f"/v1/evaluation/plots/{got['plots'][0]}")
        assert got["evaluation_id"] == results["evaluation_id"]
        assert got["results"]["sessions"] == results["sessions"]
        assert png.status_code == 200 and png.content == plot.read_bytes()

        # the held-out runs are in the log now: training again must fit exactly the same model
        again = await retrain(stack, trained["device_id"])
        assert again["metrics"]["counts"]["held_out_ignored"] == held_out
    before = Model.from_file(trained["home"] / "models" / f"{first['version']}.onnx")
    after = Model.from_file(trained["home"] / "models" / f"{again['version']}.onnx")
    assert after.sizes == before.sizes
    rows = [
        before.state_features(State(workload=w, size=s, config=c, runtime_s=0.01))
        for w, s in (("gemm", 240), ("montecarlo", 300000), ("gemm", 288))
        for c in ConfigSpace.for_device(workload=w).configs()
    ]
    X = np.vstack(rows)
    for a, b in zip(before.raw(X), after.raw(X), strict=True):
        np.testing.assert_array_equal(a, b)

    # a replay of what is in the log measures nothing more (the retrained model's sessions may
    # end on configurations the truth pass never re-measured: scored without it)
    code, out, err = await cli(
        e2e_settings, "--sizes", held, "--no-measure", "--no-guard", "--no-truth"
    )
    assert code == 0, err
    assert "Tuning sessions on held-out sizes" in out and "Targets" in out


async def test_evaluate_truth_all_measures_each_size_in_one_window(
    e2e_settings: Settings, trained: dict
) -> None:
    """--truth-all: a size's observed and truth passes share one window, its rounds
    interleaved (tests/evaluation/test_measure_way.py), its live sessions inside it: recorded
    after its observed pass is whole and before its truth pass is."""
    size = 250_000  # between two trained sizes, and held out by no other test of this folder
    code, out, err = await cli(
        e2e_settings,
        *("--workload", "montecarlo", "--sizes", f"montecarlo={size}"),
        *("--truth-all", "--live", "1"),
        *("--no-guard", "--seed", "2", "--json"),
    )
    assert code == 0, err
    results = json.loads(out)
    assert results["measurement"]["passes"] == "one window per size"
    assert results["landscape"]["sizes"] == {"montecarlo": [size]}
    assert "observed and truth passes: one window per size" in err
    async with open_stack(e2e_settings, ("projector",), "e2e-eval-window") as stack:
        m = tables.measurements
        with stack.engine.connect() as conn:
            seqs = {
                purpose: [
                    row.seq
                    for row in conn.execute(
                        select(m.c.seq).where(
                            m.c.purpose == purpose, m.c.workload == "montecarlo", m.c.size == size
                        )
                    )
                ]
                for purpose in ("evaluate", "truth", "live")
            }
    configs = len(ConfigSpace.for_device(workload="montecarlo").configs())
    # every configuration in both passes
    assert len(seqs["evaluate"]) == len(seqs["truth"]) == configs
    assert results["measurement"]["truth_runs_measured"] == configs
    assert len(seqs["live"]) == results["live"]["runs"] > 0
    assert max(seqs["evaluate"]) < min(seqs["live"]) and max(seqs["live"]) < min(seqs["truth"])
