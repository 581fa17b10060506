"""benchmarks/bench_warm_setup.py on the two 36-configuration fixtures (CI's small version):
each GPU set up on a budget as the fleet's knowledge, then the other one set up warm from it and
cold, through the CLI, each scored by the best recorded mean it ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_warm_setup
from tests.support.recorded import DATA, KERNEL


def test_warm_and_cold_budgeted_setups_leaving_one_gpu_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "warm.json"
    code = bench_warm_setup.main(
        [str(DATA), "--gpus", "A100,A6000", "--pattern", "convolution_milo_{gpu}_cut.json",
         "--kernel", str(KERNEL), "--sibling-fraction", "0.5",
         "--budgets", "4", "--seeds", "1", "--json", str(out)]
    )  # fmt: skip
    assert code == 0
    figures = json.loads(out.read_text())
    for gpu in ("A100", "A6000"):
        (row,) = figures["gpus"][gpu]["4"]
        for mode in ("warm", "cold"):
            assert row[mode]["runs"] == 4 and 0 < row[mode]["fraction"] <= 1
    summary = figures["budgets"]["4"]
    lo, hi = summary["interval"]
    assert lo <= summary["warm_minus_cold"] <= hi
    assert "spaces whose warm median reaches 0.90" in capsys.readouterr().out
