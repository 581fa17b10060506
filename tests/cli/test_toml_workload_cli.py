"""A user's own C/OpenMP application, declared in the home's workloads/heat.toml, goes through
the commands as a built-in does: `run` under 2 MPI ranks, a tiny `setup` (one size, every
configuration) that trains a model including it, `decide` on it."""

from __future__ import annotations

import json
from pathlib import Path

from hpc_ds1.settings import Settings
from hpc_ds1.space import ALL_ACTIONS
from tests.support.commands import run_hpc
from tests.workloads.gridapp import write_grid_toml
from tests.workloads.heatapp import build_heat, write_heat_toml


def test_a_toml_workload_is_run_set_up_and_decided(settings: Settings, tmp_path: Path) -> None:
    folder = settings.home / "workloads"
    folder.mkdir(parents=True)
    build_heat(folder)
    write_heat_toml(folder)

    ran = run_hpc(settings, "run", "--workload", "heat", "--size", "64", "--ranks", "2",
              "--threads", "1", "--tile", "64", "--repeats", "1", "--json")  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    result = json.loads(ran.stdout)
    assert result["status"] == "ok" and result["check_ok"] is True
    assert " -n 2 ./heat --n 64 --block 64" in result["command"]

    setup = run_hpc(settings, "setup", "--workload", "heat", "--sizes", "64", "--repeats", "1")
    assert setup.returncode == 0, setup.stdout + setup.stderr
    assert "measured 10 runs" in setup.stdout and "trained model" in setup.stdout, setup.stdout

    decided = run_hpc(settings, "decide", "--workload", "heat", "--size", "96", "--ranks", "1",
                  "--threads", "1", "--json")  # fmt: skip
    assert decided.returncode == 0, decided.stdout + decided.stderr
    decision = json.loads(decided.stdout)
    assert decision["workload"] == "heat" and decision["ran"] is True
    assert decision["choice"] in ALL_ACTIONS
    assert decision["config"]["tile"] == 16  # the knob's default


def test_a_workload_with_knobs_of_its_own_is_set_up_decided_and_tuned(
    settings: Settings,
) -> None:
    """Issue 42: three knobs of the application's own and two constraints, through setup (real
    MPI ranks), decide (--knob) and a tuning session (--start with knobs)."""
    folder = settings.home / "workloads"
    folder.mkdir(parents=True)
    write_grid_toml(folder)

    listed = run_hpc(settings, "workloads", "--json")
    app = next(w for w in json.loads(listed.stdout)["workloads"] if w["name"] == "gridapp")
    assert app["constraints"] == ["p * q == ranks", "p <= q"]
    assert app["knobs"]["algo"] == {
        "kind": "category", "values": ["pairwise", "sequential"], "default": "pairwise",
    }  # fmt: skip

    setup = run_hpc(settings, "setup", "--workload", "gridapp", "--repeats", "2", timeout=600)
    assert setup.returncode == 0, setup.stdout + setup.stderr
    # 2 sizes x 20 configurations: every (ranks, threads, nb, p, q, algo) the constraints allow
    assert "measured 40 runs" in setup.stdout and "trained model" in setup.stdout, setup.stdout

    slow = ["--knob", "nb=8", "--knob", "p=1", "--knob", "q=1", "--knob", "algo=sequential"]
    decided = run_hpc(settings, "decide", "--workload", "gridapp", "--size", "384", "--ranks", "1",
                  "--threads", "1", *slow, "--json")  # fmt: skip
    assert decided.returncode == 0, decided.stdout + decided.stderr
    decision = json.loads(decided.stdout)
    assert decision["config"]["knobs"] == {"algo": "sequential", "nb": 8, "p": 1, "q": 1}
    assert {"algo=pairwise", "nb+", "q+", "RANKS_UP", "STOP"} <= set(decision["alternatives"])
    # the sequential sum is a Python loop, about 5x slower than numpy's here at every size: the
    # model learns the knob from setup's measurements (its order, not a ratio a noisy run sets)
    runtimes = decision["predicted_runtimes_s"]
    assert runtimes["algo=pairwise"] < runtimes["STOP"], runtimes

    wrong = run_hpc(settings, "decide", "--workload", "gridapp", "--size", "384", "--ranks", "2",
                "--threads", "1", "--knob", "p=2", "--knob", "q=1")  # fmt: skip
    assert wrong.returncode != 0 and "violates 'p <= q'" in wrong.stderr, wrong.stderr

    start = "ranks=1,threads=1,nb=8,p=1,q=1,algo=sequential"
    tuned = run_hpc(settings, "tune", "--workload", "gridapp", "--size", "384", "--start", start,
                "--no-wait", "--json", timeout=600)  # fmt: skip
    assert tuned.returncode == 0, tuned.stdout + tuned.stderr
    body = tuned.stdout[tuned.stdout.index("{") :]
    events = json.loads(body)["events"]
    ran = [e["data"]["config"] for e in events if e["type"] == "step_run"]
    assert ran[0]["knobs"] == {"algo": "sequential", "nb": 8, "p": 1, "q": 1}
    for config in ran:  # every configuration the session ran keeps the constraints
        knobs = config["knobs"]
        assert knobs["p"] * knobs["q"] == config["ranks"] and knobs["p"] <= knobs["q"]
    moves = [e["data"]["move"] for e in events if e["type"] == "move_decided"]
    assert moves and all(isinstance(m, str) for m in moves)
