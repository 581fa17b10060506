"""`evaluate` on a recorded GPU (issue 42, item 3): the landscape is the file's means, a
replayed run draws recorded repeats, the baselines with the model's information sit beside
the cold ones, and the command scores a small recorded space end to end."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from hpc_ds1.evaluation import baselines as bl
from hpc_ds1.evaluation.recorded import POLICIES, landscape_of, recorded_measure
from hpc_ds1.settings import Settings
from hpc_ds1.space import ConfigSpace, knob_view
from hpc_ds1.workloads import load_workload_file
from tests.support.commands import run_hpc

DATA = Path(__file__).resolve().parents[1] / "tuning" / "data"
CACHE = DATA / "convolution_milo_A6000_cut.json"
KERNEL = DATA / "convolution_milo_cut.json"


def _toml(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "conv.toml"
    path.write_text(f'[workload]\nname = "conv-a6000"\nrecorded = "{CACHE}"\nkernel = "{KERNEL}"\n')
    return path


def test_the_landscape_is_the_recorded_means_and_a_run_draws_recorded_repeats(
    tmp_path: Path,
) -> None:
    wl = load_workload_file(_toml(tmp_path))
    space = ConfigSpace.for_device(workload=wl)
    land = landscape_of(wl, space)  # type: ignore[arg-type]
    recorded = land.recorded
    assert len(land.cell.points) + len(land.cell.failed) == len(space.configs()) == 36
    for config, point in land.cell.points.items():
        repeats = recorded.records[recorded.space.config(dict(config.knobs))]
        assert point.runtime_s == pytest.approx(statistics.fmean(repeats))
    measure = recorded_measure(land, seed=4)
    config = land.cell.best_config
    first, again = measure(config, 0), measure(config, 0)
    assert first == again  # seeded by (seed, configuration, k)
    assert first is not None and first.runtime_s in land.repeats[config]  # median of 3 draws
    other = [measure(config, k) for k in range(1, 30)]
    assert len({r.runtime_s for r in other if r}) > 1  # the re-runs draw other repeats
    assert all(measure(c, 0) is None for c in land.cell.failed)


def test_tpe_over_knobs_runs_valid_configurations_within_its_budget(tmp_path: Path) -> None:
    wl = load_workload_file(_toml(tmp_path))
    space = ConfigSpace.for_device(workload=wl)
    land = landscape_of(wl, space)  # type: ignore[arg-type]
    cell = land.cell
    start = sorted(cell.points, key=lambda c: c.label())[0]
    cold = bl.knob_tpe_session(cell, start, space, 8, seed=1)
    assert cold.runs == len(cold.ran) == 8 and cold.ran[0] == start
    assert all(space.contains(c) for c in cold.ran)
    assert cold.pct_of_best == pytest.approx(max(cell.pct_of_best(c) for c in cold.ran))
    # warm from every configuration's mean: its prior ranks the optimum first, which TPE runs
    prior = {c: p.runtime_s for c, p in cell.points.items()}
    warm = bl.knob_tpe_session(cell, start, space, 8, seed=1, prior=prior, policy="w")
    assert warm.policy == "w" and warm.runs <= 8
    assert knob_view(space).knobs.count() == len(space.configs())


def test_the_lookup_baselines_run_nothing_or_two(tmp_path: Path) -> None:
    wl = load_workload_file(_toml(tmp_path))
    space = ConfigSpace.for_device(workload=wl)
    land = landscape_of(wl, space)  # type: ignore[arg-type]
    cell = land.cell
    best = cell.best_config
    start = max(cell.points, key=lambda c: cell.points[c].runtime_s)
    assert bl.setup_best({start: 2.0, best: 1.0, next(iter(cell.failed)): None}) == best
    lookup = bl.lookup_session(cell, start, best)
    assert lookup.runs == 0 and lookup.pct_of_best == 100.0
    both = bl.start_then_lookup_session(cell, start, best, recorded_measure(land, 0))
    assert both.runs == 2 and both.final == best
    alone = bl.start_then_lookup_session(cell, start, None, recorded_measure(land, 0))
    assert alone.runs == 1 and alone.final == start


def test_evaluate_scores_a_recorded_space_end_to_end(settings: Settings) -> None:
    _toml(settings.home / "workloads")
    env = {"HPC_DS1_REPLAY_SEED": "5"}
    done = run_hpc(settings, "setup", "--workload", "conv-a6000", "--budget", "18", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    out = run_hpc(
        settings, "evaluate", "--workload", "conv-a6000", "--starts", "6", "--json", env=env
    )
    assert out.returncode == 0, out.stdout + out.stderr
    results = json.loads(out.stdout)
    assert results["kind"] == "recorded" and results["evaluation_id"]
    assert results["landscape"]["configurations"] == 36
    assert results["landscape"]["setup_configurations"] == 18
    rows = {r["policy"]: r for r in results["sessions"]["table"]}
    assert set(rows) == set(POLICIES)
    assert all(r["sessions"] == 6 for r in rows.values())
    assert rows["lookup"]["runs_max"] == 0 and rows["start_then_lookup"]["runs_max"] <= 2
    budget = results["sessions"]["budget"]
    assert budget >= rows["model"]["runs_mean"]
    for policy in ("random", "optuna_tpe", "optuna_tpe_warm"):
        assert rows[policy]["runs_max"] <= budget
    assert all(0 < r["pct_median"] <= 100 for r in rows.values())
    assert results["calibration"]["decisions"] > 0
    text = run_hpc(settings, "evaluate", "--workload", "conv-a6000", "--starts", "3", env=env)
    assert text.returncode == 0, text.stderr
    assert "in sample, nothing held out" in text.stdout and "optuna_tpe_warm" in text.stdout
    bad = run_hpc(settings, "evaluate", "--workload", "conv-a6000", "--live", "2", env=env)
    assert bad.returncode == 2 and "--live: not for a recorded workload" in bad.stderr
