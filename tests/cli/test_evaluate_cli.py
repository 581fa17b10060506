"""`hpc-ds1 evaluate`: bad input is exit 2 with what is accepted, before anything runs; a frozen
test set is written by `--freeze`, verified, and measured once by `--final` (issue 43)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from hpc_ds1.cli import EXIT_FAILURE, EXIT_PRECONDITION, EXIT_USAGE, main
from hpc_ds1.evaluation import frozen as fz
from hpc_ds1.model import TrainedModel
from hpc_ds1.models_store import save_local
from hpc_ds1.settings import Settings
from tests.support.commands import run_hpc


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
        settings: object, args: object, model: object, profile: object, chunks: list[Any], *_: Any
    ) -> int:
        seen.append({(job.workload, job.size) for chunk in chunks for job in chunk})
        return 0

    monkeypatch.setattr(cli_evaluate, "_evaluate", plan_only)
    assert main(["evaluate", "--home", str(home), *args]) == 0
    if planned is None:
        stencil = EVAL_PROFILES["full"].sizes(get_workload("stencil"))
        planned = {("gemm", 80), *(("stencil", s) for s in stencil)}
    assert seen == [planned]


def _freeze(home: Path, capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["evaluate", "--home", str(home), "--freeze", "--json", *args]) == 0
    return dict(json.loads(capsys.readouterr().out))


def _planned(monkeypatch: pytest.MonkeyPatch) -> list[tuple[set[tuple[str, int]], Any]]:
    """What `evaluate` would measure, and the frozen set it was given, instead of running."""
    from hpc_ds1.cli import evaluate as cli_evaluate

    seen: list[tuple[set[tuple[str, int]], Any]] = []

    async def plan_only(*args: Any) -> int:
        chunks, frozen = args[4], args[5] if len(args) > 5 else None
        seen.append(({(job.workload, job.size) for chunk in chunks for job in chunk}, frozen))
        return 0

    monkeypatch.setattr(cli_evaluate, "_evaluate", plan_only)
    return seen


def test_final_without_a_frozen_set_says_to_freeze_first(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["evaluate", "--home", str(home), "--final"]) == EXIT_PRECONDITION
    assert "run `hpc-ds1 evaluate --freeze` first" in capsys.readouterr().err


def test_freeze_writes_the_set_with_its_hash_before_anything_is_measured(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["evaluate", "--home", str(home), "--freeze", "--seed", "7"]) == 0
    out = capsys.readouterr().out
    (path,) = (home / "evaluation" / "frozen").glob("*.json")
    document = fz.load_verified(path)
    assert f"file    {path}" in out and f"sha256  {document['sha256']}" in out
    assert "nothing of it is measured yet" in out and "hpc-ds1 evaluate --final" in out
    assert document["seed"] == 7 and document["profile"] == {"repeats": 2, "truth_repeats": 5}
    assert not fz.marker(path).exists()
    trained = document["model"]["trained_sizes"]
    for cell in fz.cells_of(document, "extrapolation"):  # 2-4x beyond the trained range
        assert (
            2 * max(trained[cell["workload"]]) <= cell["size"] <= 4 * max(trained[cell["workload"]])
        )
        assert f"extrapolation  {cell['workload']} {cell['size']}" in out
    assert {c["workload"] for c in fz.cells_of(document, "extrapolation")} == {"gemm", "stencil"}
    # a second --freeze writes a new set (another time: another hash), the newest --final's
    again = _freeze(home, capsys, "--seed", "7")
    assert again["sha256"] != document["sha256"] and Path(again["file"]).is_file()
    assert fz.find(home, None) == Path(again["file"])


def test_an_edited_set_is_refused(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document = _freeze(home, capsys)
    path = Path(document.pop("file"))
    path.chmod(0o644)
    document["cells"] = document["cells"][1:]  # a cell dropped after freezing
    path.write_bytes(orjson.dumps(document, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2))
    assert main(["evaluate", "--home", str(home), "--final"]) == EXIT_FAILURE
    assert "was edited after it was frozen" in capsys.readouterr().err


def test_final_measures_the_sets_cells_and_a_second_measured_run_is_refused(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    document = _freeze(home, capsys)
    path = Path(document["file"])
    seen = _planned(monkeypatch)
    assert main(["evaluate", "--home", str(home), "--final", "--set", path.stem[:6]]) == 0
    (planned, frozen) = seen.pop()
    (kernel,) = fz.cells_of(document, "unseen_kernel")  # a built-in: measured too
    assert planned == {
        *((c["workload"], c["size"]) for c in document["cells"] if c["kind"] in fz.MEASURED_KINDS),
        (kernel["workload"], kernel["size"]),
    }
    assert frozen.sha256 == document["sha256"] and frozen.rescore is False
    # what a measured --final does before it measures anything
    frozen.claim(argparse.Namespace(seed=document["seed"]))
    assert fz.marker(path).exists()
    assert main(["evaluate", "--home", str(home), "--final"]) == EXIT_PRECONDITION
    err = capsys.readouterr().err
    assert f"frozen set {path.stem} was claimed by a measured `evaluate --final`" in err
    assert "a set is measured once" in err and "still counts as measured" in err
    # re-scoring what was measured stays allowed, and says so
    assert main(["evaluate", "--home", str(home), "--final", "--no-measure"]) == 0
    assert seen.pop()[1].rescore is True


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--final", "--sizes", "80"], "--sizes: not with --final"),
        (["--final", "--workload", "gemm"], "--workload: not with --final"),
        (["--final", "--seed", "9"], "was frozen with seed 0, which --final uses"),
        (["--freeze", "--live", "2"], "--live: not with --freeze"),
        (["--set", "abc"], "--set goes with --final"),
    ],
)
def test_flags_that_would_change_a_frozen_set_are_refused(
    home: Path, args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _freeze(home, capsys)
    assert main(["evaluate", "--home", str(home), *args]) == EXIT_USAGE
    assert says in capsys.readouterr().err


def test_a_set_for_another_model_and_its_sizes_before_final(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = _freeze(home, capsys)
    (cell, *_) = fz.cells_of(document, "interpolation")
    # --sizes may not measure a cell of a set not measured yet: only --final looks at it
    sizes = f"{cell['workload']}={cell['size']}"
    assert main(["evaluate", "--home", str(home), "--sizes", sizes]) == EXIT_USAGE
    assert "belong to a frozen test set not measured yet" in capsys.readouterr().err
    # a set frozen for another model (a valid file, hashed as frozen) is refused
    other = {k: v for k, v in document.items() if k != "file"}
    other["model"] = {**other["model"], "version": "0123456789abcdef"}
    other["created_at"] = "2026-01-01T00:00:00+00:00"
    other["sha256"] = fz.digest(other)
    path = fz.write(home, other)
    assert main(["evaluate", "--home", str(home), "--final", "--set", str(path)]) == 3
    assert "was frozen for model 0123456789abcdef" in capsys.readouterr().err


def test_a_frozen_set_measured_once_end_to_end(settings: Settings) -> None:
    """A tiny real setup (montecarlo, three small sizes), `--freeze`, then `--final` measures
    the set for real and publishes its hash; a second measured run is refused and a re-score
    (--no-measure) measures nothing."""
    sizes = "100000,200000,400000"
    done = run_hpc(settings, "setup", "--workload", "montecarlo", "--sizes", sizes)
    assert done.returncode == 0, done.stdout + done.stderr
    frozen = run_hpc(settings, "evaluate", "--freeze", "--seed", "2", "--json")
    assert frozen.returncode == 0, frozen.stderr
    document = json.loads(frozen.stdout)
    path = Path(document["file"])
    fast = ("--no-truth", "--no-guard", "--json")
    final = run_hpc(settings, "evaluate", "--final", *fast, timeout=600)
    assert final.returncode == 0, final.stdout + final.stderr
    results = json.loads(final.stdout)
    assert results["frozen_set"]["sha256"] == document["sha256"]
    assert results["frozen_set"]["cells"] == document["cells"]
    assert results["frozen_set"]["rescore"] is False and results["held_out_set"] == "frozen"
    (beyond,) = fz.cells_of(document, "extrapolation")
    extrapolation = results["by_kind"]["extrapolation"]
    assert extrapolation["cells"] == [f"montecarlo {beyond['size']}"]
    assert {r["policy"] for r in extrapolation["table"]} >= {"model", "random", "optuna_tpe"}
    assert extrapolation["flagged_by_guard"] == extrapolation["decisions"] > 0  # out of range
    kernel = results["unseen"]["unseen_kernel"]
    assert kernel["workload"] not in ("montecarlo",) and kernel["flagged"] is True
    assert kernel["scored"] is True and 0 < kernel["system1"]["pct_of_best"] <= 100
    assert "absent" in results["unseen"]["unseen_device"]
    assert json.loads(fz.marker(path).read_text())["evaluation_id"] == results["evaluation_id"]

    again = run_hpc(settings, "evaluate", "--final", *fast)
    assert again.returncode == EXIT_PRECONDITION
    assert "a set is measured once" in again.stderr and results["evaluation_id"] in again.stderr
    rescore = run_hpc(settings, "evaluate", "--final", "--no-measure", *fast, timeout=600)
    assert rescore.returncode == 0, rescore.stderr
    rescored = json.loads(rescore.stdout)
    assert rescored["frozen_set"]["rescore"] is True
    assert rescored["measurement"]["observed_runs_measured"] == 0
