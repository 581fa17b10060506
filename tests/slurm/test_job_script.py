"""examples/slurm/job.sh, submitted with sbatch to the session's real Slurm: it evals
`hpc-ds1 recommend --format env` (a model trained on this machine's real tiny measurements,
tests/support/measured.py), starts the recommended ranks with srun, times them and records the
runtime with `hpc-ds1 observe`, which lands in the home's measurements with that configuration."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from hpc_ds1.fleet.slurm import SlurmPartition
from hpc_ds1.model import Model, TrainedModel
from hpc_ds1.models_store import save_local
from hpc_ds1.settings import Settings
from services.trainer.training import load_measurements
from tests.slurm.cluster import SlurmCluster
from tests.support.commands import HPC_DS1, cli_env
from tests.support.measured import TINY

SCRIPT = Path(__file__).parents[2] / "examples" / "slurm" / "job.sh"
SIZE = TINY["gemm"][1]


def test_the_job_script_runs_the_recommendation_and_records_it(
    slurm: SlurmCluster, settings: Settings, engine: Engine, trained: TrainedModel, tmp_path: Path
) -> None:
    data = trained.to_onnx()
    model = Model.from_onnx(data)
    save_local(settings.home / "models", model.version, trained.metadata["device_id"], data)
    expected = model.recommend("gemm", SIZE).config
    env = {
        **cli_env(settings),
        "SLURM_CONF": str(slurm.conf),
        "WORKLOAD": "gemm",
        "SIZE": str(SIZE),
        "HPC_DS1": HPC_DS1,
        "PYTHON": sys.executable,
    }
    out = tmp_path / "job.out"
    submitted = subprocess.run(
        ["sbatch", "--parsable", "-o", str(out), str(SCRIPT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    state = SlurmPartition(slurm.partition, tmp_path).wait(job_id, time.monotonic() + 300, None)
    log = out.read_text()
    assert state == "COMPLETED", log

    c = expected
    assert (
        f"hpc-ds1 recommends for gemm {SIZE}: ranks={c.ranks} threads={c.threads} tile={c.tile}"
        in log
    ), log
    rows = [r for r in load_measurements_all(engine) if r["purpose"] == "observed"]
    assert len(rows) == 1, rows
    row = rows[0]
    assert row["status"] == "ok" and row["workload"] == "gemm" and row["size"] == SIZE, row
    assert row["config"] == c.model_dump(), row
    assert row["runtime_s"] > 0 and f"ran in {row['runtime_s']:.6f} s (exit 0)" in log, log


def load_measurements_all(engine: Engine) -> list[dict[str, Any]]:
    from sqlalchemy import select

    from hpc_ds1.db import tables

    with engine.connect() as conn:
        devices = [r[0] for r in conn.execute(select(tables.devices.c.device_id))]
    return [row for device in devices for row in load_measurements(engine, device)]
