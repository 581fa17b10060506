"""`setup --budget RUNS|DURATION` (issue 42, item 2): parsing, and a budgeted setup of a
recorded GPU space that measures only its share, records each run, resumes from the log and
trains a model on what it measured."""

from __future__ import annotations

import json
import subprocess

import pytest
from sqlalchemy import Engine, select

from hpc_ds1.db import tables
from hpc_ds1.settings import Settings
from hpc_ds1.setup.budget import Budget, BudgetError
from tests.support.commands import run_hpc
from tests.support.recorded import write_recorded


@pytest.mark.parametrize(
    ("text", "budget"),
    [
        ("600", Budget(runs=600)),
        ("90s", Budget(seconds=90.0)),
        ("30m", Budget(seconds=1800.0)),
        ("1.5h", Budget(seconds=5400.0)),
        (" 2 min ", Budget(seconds=120.0)),
    ],
)
def test_a_budget_is_runs_or_a_duration(text: str, budget: Budget) -> None:
    assert Budget.parse(text) == budget


@pytest.mark.parametrize("text", ["0", "-5", "ten", "5d", "0s", "1e3", ""])
def test_a_bad_budget_says_what_is_accepted(text: str) -> None:
    with pytest.raises(BudgetError, match=r"accepted: a number of runs|at least 1 run"):
        Budget.parse(text)


def test_a_budgeted_setup_measures_its_share_resumes_and_trains(settings: Settings) -> None:
    write_recorded(settings.home, "conv-a6000", "A6000")

    def setup(*args: str) -> subprocess.CompletedProcess[str]:
        return run_hpc(
            settings, "setup", "--workload", "conv-a6000", *args, env={"HPC_DS1_REPLAY_SEED": "3"}
        )

    first = setup("--budget", "12", "--no-train")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "budget 12 runs of the 36 configurations" in first.stdout, first.stdout
    assert "measured 12 runs" in first.stdout and "(0 already in the log" in first.stdout
    # the same budget again: the same choices, read back from the log, nothing run twice
    again = setup("--budget", "12")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "measured 0 runs" in again.stdout and "(12 already in the log" in again.stdout
    assert "trained model" in again.stdout, again.stdout
    bad = setup("--budget", "soon")
    assert bad.returncode == 2 and "--budget 'soon': accepted" in bad.stderr


def _runs(engine: Engine, workload: str) -> list[tuple[dict[str, object], float | None]]:
    t = tables.measurements
    with engine.connect() as conn:
        rows = conn.execute(
            select(t.c.config, t.c.runtime_s).where(t.c.workload == workload).order_by(t.c.seq)
        )
        return [(dict(r.config), r.runtime_s) for r in rows]


def test_a_warm_budgeted_setup_starts_from_the_siblings_best(
    settings: Settings, engine: Engine
) -> None:
    # The A6000 is the fleet's sibling (measured whole); the A100 is the new device, set up
    # warm with a budget of 6: its first run is the sibling's fastest configuration.
    write_recorded(settings.home, "conv-a6000", "A6000")
    write_recorded(settings.home, "conv-a100", "A100")
    env = {"HPC_DS1_REPLAY_SEED": "3"}
    sibling = run_hpc(settings, "setup", "--workload", "conv-a6000", "--no-train", env=env)
    assert sibling.returncode == 0, sibling.stdout + sibling.stderr
    measured = [(c, s) for c, s in _runs(engine, "conv-a6000") if s is not None]
    fastest = min(measured, key=lambda run: run[1])[0]

    warm = run_hpc(
        settings,
        "setup",
        "--workload",
        "conv-a100",
        "--budget",
        "6",
        "--warm-from",
        "conv-a6000",
        "--no-train",
        "--json",
        env=env,
    )
    assert warm.returncode == 0, warm.stdout + warm.stderr
    found = json.loads(warm.stdout)
    assert found["siblings"] == {"conv-a100": 1} and found["measured"] == 6, found
    assert "warm start of conv-a100: from the top of 1 siblings' consensus" in warm.stderr
    runs = _runs(engine, "conv-a100")
    assert len(runs) == 6 and runs[0][0] == fastest, (runs[0], fastest)


def test_warm_needs_a_budget_and_names(settings: Settings) -> None:
    no_budget = run_hpc(settings, "setup", "--workload", "gemm", "--warm")
    assert no_budget.returncode == 2 and "give --budget too" in no_budget.stderr
    empty = run_hpc(settings, "setup", "--workload", "gemm", "--budget", "4", "--warm-from", ",")
    assert empty.returncode == 2 and "give workload names" in empty.stderr
