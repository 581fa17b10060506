"""`hpc-ds1 recommend` on a real model (trained on this machine's real measurements by the
session fixtures of tests/support/measured.py) in a home of its own: the text line, the JSON, the
shell assignments a job script evals (in real bash), the #SBATCH header, and the refusals."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from hpc_ds1.cli import main
from hpc_ds1.machine.hardware import Fingerprint
from hpc_ds1.model import Model, TrainedModel
from hpc_ds1.models_store import save_local
from tests.support.commands import HPC_DS1
from tests.support.measured import TINY

SIZE = TINY["gemm"][1]


@pytest.fixture
def home(tmp_path: Path, trained: TrainedModel, fp: Fingerprint) -> Path:
    data = trained.to_onnx()
    save_local(tmp_path / "home" / "models", Model.from_onnx(data).version, fp.device_id, data)
    return tmp_path / "home"


@pytest.fixture
def expected(model: Model, fp: Fingerprint) -> dict[str, object]:
    rec = model.recommend("gemm", SIZE, fingerprint=fp)
    return {**rec.config.model_dump(), "version": model.version}


def env_of(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPC_DS1_", "OMP_"))}
    env["HPC_DS1_HOME"] = str(home)
    return env


def test_eval_of_the_env_format_sets_the_variables_in_bash(
    home: Path, expected: dict[str, object]
) -> None:
    # The job script's own lines: eval the recommendation, then a child process sees them.
    script = (
        f'eval "$({HPC_DS1} recommend --workload gemm --size {SIZE} --format env)" || exit 9\n'
        'echo "$HPC_DS1_RANKS $HPC_DS1_THREADS $HPC_DS1_TILE $HPC_DS1_GPU $HPC_DS1_MODE"\n'
        "sh -c 'echo \"$OMP_NUM_THREADS $HPC_DS1_MODEL_VERSION\"'\n"
    )
    done = subprocess.run(
        ["bash", "-c", script], env=env_of(home), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    ranks, threads, tile, gpu, mode = first.split()
    assert (int(ranks), int(threads), int(tile)) == (
        expected["ranks"],
        expected["threads"],
        expected["tile"],
    )
    assert gpu == ("1" if expected["gpu"] else "0")
    assert mode in ("auto", "confirm", "escalate")
    assert second.split() == [str(expected["threads"]), expected["version"]]


def test_text_json_and_slurm(
    home: Path, expected: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["recommend", "--home", str(home), "--workload", "gemm", "--size", str(SIZE)]
    assert main(argv) == 0
    line = capsys.readouterr().out
    assert line.startswith(f"gemm {SIZE}: ranks={expected['ranks']} threads={expected['threads']}")
    assert f"model {expected['version']}" in line

    assert main([*argv, "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["config"] == {k: expected[k] for k in ("ranks", "threads", "tile", "gpu")}
    assert rec["model_version"] == expected["version"]
    assert rec["predicted_runtime_s"] > 0 and 0 <= rec["confidence"] <= 1
    assert rec["guard_reasons"] == [] and rec["familiar"]
    assert main([*argv, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"] == rec["config"]

    assert main([*argv, "--format", "slurm"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"#SBATCH --ntasks={expected['ranks']}" in lines
    assert f"#SBATCH --cpus-per-task={expected['threads']}" in lines
    assert f"# export OMP_NUM_THREADS={expected['threads']}" in lines
    assert all(x.startswith("#") for x in lines)

    # Outside the measured sizes the guard speaks: escalate, with its reason.
    far = ["recommend", "--home", str(home), "--workload", "gemm", "--size", "5000", "--json"]
    assert main(far) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["mode"] == "escalate"
    assert any("outside the measured range" in r for r in rec["guard_reasons"])


def test_refusals_say_what_is_accepted(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["recommend", "--home", str(home)]
    assert main([*base, "--workload", "nosuch", "--size", "10"]) == 2
    err = capsys.readouterr().err
    assert "unknown workload 'nosuch'" in err and "gemm" in err
    assert main([*base, "--workload", "gemm", "--size", "0"]) == 2
    assert "size 0 is out of range for gemm" in capsys.readouterr().err
    empty = ["recommend", "--home", str(tmp_path / "empty"), "--workload", "gemm", "--size", "64"]
    assert main(empty) == 3
    assert "hpc-ds1 setup --quick" in capsys.readouterr().err
