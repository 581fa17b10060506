"""benchmarks/bench_budget_setup.py on the 36-configuration fixture: a whole and a budgeted
setup through the CLI, each scored by System 1's pick (CI's small version of the benchmark)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_budget_setup
from tests.support.recorded import DATA, KERNEL


def test_whole_and_budgeted_setups_are_scored_by_their_picks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "budget.json"
    code = bench_budget_setup.main(
        [str(DATA / "convolution_milo_A6000_cut.json"), "--kernel",
         str(KERNEL), "--seeds", "1", "--fraction", "0.5",
         "--json", str(out)]
    )  # fmt: skip
    assert code == 0
    figures = json.loads(out.read_text())
    (row,) = figures[str(DATA / "convolution_milo_A6000_cut.json")]["rows"]
    assert row["whole"]["measured"] == 36 and row["budget"]["measured"] == 18
    for label in ("whole", "budget"):
        assert 0 <= row[label]["fraction"] <= 1
    lo, hi = figures["difference"]["interval"]
    assert lo <= figures["difference"]["mean"] <= hi
    assert "System 1 median fraction of the optimum" in capsys.readouterr().out
