"""`hpc-ds1 evaluate`: bad input is exit 2 with what is accepted, before anything runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hpc_ds1.cli import EXIT_PRECONDITION, main
from hpc_ds1.model import TrainedModel
from hpc_ds1.models_store import save_local


@pytest.fixture
def home(tmp_path: Path, trained: TrainedModel) -> Path:
    save_local(
        tmp_path / "models", trained.version, trained.metadata["device_id"], trained.to_onnx()
    )
    return tmp_path


def test_no_model_says_how_to_get_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evaluate", "--home", str(tmp_path)]) == EXIT_PRECONDITION  # no model: 3
    assert "hpc-ds1 setup --quick" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--workload", "nbody"], "the model was not trained on ['nbody']"),
        (["--sizes", "gemm=big"], "is not a size"),
        (["--sizes", "gemm=64"], "used in training, so they cannot be held out: gemm 64"),
        (["--repeats", "1"], "--repeats must be at least 2"),
        (["--live", "-1"], "--live -1: accepted is 0 to 20 starts per size"),
        (["--live", "2", "--no-measure"], "it cannot go with --no-measure or --no-truth"),
        (["--separate-passes"], "--separate-passes only applies with --truth-all"),
    ],
)
def test_bad_input_is_refused_before_anything_runs(
    home: Path, args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["evaluate", "--home", str(home), *args]) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "planned"),
    [
        (["--sizes", "gemm=80"], {("gemm", 80)}),
        (["--sizes", "80"], {("gemm", 80), ("stencil", 80)}),
        (["--sizes", "gemm=80", "--workload", "stencil", "--workload", "gemm"], None),
    ],
)
def test_sizes_by_name_evaluate_only_the_workloads_named(
    home: Path,
    args: list[str],
    planned: set[tuple[str, int]] | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without --workload, "--sizes gemm=80" measures gemm 80 alone; with it, the workloads
    --workload names, each at its --sizes or else its profile's held-out sizes."""
    from hpc_ds1.cli import evaluate as cli_evaluate
    from hpc_ds1.evaluation import EVAL_PROFILES
    from hpc_ds1.workloads import get_workload

    seen: list[set[tuple[str, int]]] = []

    async def plan_only(
        settings: object, args: object, model: object, profile: object, chunks: list[Any]
    ) -> int:
        seen.append({(job.workload, job.size) for chunk in chunks for job in chunk})
        return 0

    monkeypatch.setattr(cli_evaluate, "_evaluate", plan_only)
    assert main(["evaluate", "--home", str(home), *args]) == 0
    if planned is None:
        stencil = EVAL_PROFILES["full"].sizes(get_workload("stencil"))
        planned = {("gemm", 80), *(("stencil", s) for s in stencil)}
    assert seen == [planned]
