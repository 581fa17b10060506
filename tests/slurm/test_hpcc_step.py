"""A real application under the session's real Slurm (issue 44, item 6): Debian's hpcc, built
against Open MPI, runs as a job step (`srun --mpi=pmix`, Slurm's mpi/pmix plugin); and, in
the slow tier, a job script whose header is `hpc-ds1 recommend --format slurm` for hpcc
(examples/slurm/submit.sh + app-job.sh) runs the recommendation as a step and records it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from hpc_ds1.db import tables
from hpc_ds1.fleet.slurm import SlurmPartition
from hpc_ds1.runner import Status, run
from hpc_ds1.settings import Settings
from hpc_ds1.space import Config, ConfigSpace
from hpc_ds1.workloads import CommandWorkload, load_workload_file
from tests.slurm.cluster import SlurmCluster
from tests.support.commands import HPC_DS1, cli_env, run_hpc

ROOT = Path(__file__).resolve().parents[2]
HPCC_TOML = ROOT / "examples" / "workloads" / "hpcc.toml"
SUBMIT = ROOT / "examples" / "slurm" / "submit.sh"
# what Slurm's mpi/pmix plugin loads (Debian's libpmix-dev), in the multiarch folder
LIBPMIX = sorted(Path("/usr/lib").glob("*/pmix2/lib/libpmix.so"))
needs_hpcc = pytest.mark.skipif(
    shutil.which("hpcc") is None or not LIBPMIX,
    reason="Debian's hpcc and libpmix-dev (Slurm's mpi/pmix plugin loads libpmix.so) are not "
    "installed: `make apps` as root (deploy/install-apps.sh) installs them",
)


def _hpcc() -> CommandWorkload:
    wl = load_workload_file(HPCC_TOML)
    assert isinstance(wl, CommandWorkload)
    return wl


@needs_hpcc
def test_hpcc_runs_as_a_job_step_with_pmix(slurm: SlurmCluster) -> None:
    wl = _hpcc()
    space = ConfigSpace.for_cpus(2, wl.tiles, 0, knobs=wl.knobs, constraints=wl.constraints)
    config = Config(ranks=2, threads=1, tile=1, knobs={"nb": 32, "p": 1, "q": 2})
    r = run(wl, 400, config, repeats=1, space=space, launcher="srun")
    assert r.status is Status.OK, r.error
    assert r.command.startswith("srun -n 2 --cpus-per-task 1") and "--mpi=pmix" in r.command
    assert r.command.endswith(" hpcc") and "mpirun" not in r.command
    # HPL's time and residual, read from the output file the two ranks' hpcc wrote
    assert r.runtime_s and r.runtime_s > 0 and r.check_ok and 0 < (r.check_error or 0) < 16


@needs_hpcc
@pytest.mark.slow
def test_recommend_format_slurm_feeds_hpccs_job_script(
    slurm: SlurmCluster, settings: Settings, engine: Engine, tmp_path: Path
) -> None:
    folder = settings.home / "workloads"
    (folder / "hpcc").mkdir(parents=True)
    shutil.copy(HPCC_TOML.parent / "hpcc" / "hpccinf.txt", folder / "hpcc" / "hpccinf.txt")
    text = HPCC_TOML.read_text().replace("sizes = [400, 800, 1200]", "sizes = [400, 600]")
    (folder / "hpcc.toml").write_text(text.replace("held_out = [600, 1000]", "held_out = [500]"))
    setup = run_hpc(settings, "setup", "--workload", "hpcc", "--budget", "6", "--repeats", "1")
    assert setup.returncode == 0, setup.stdout + setup.stderr
    asked = run_hpc(
        settings, "recommend", "--workload", "hpcc", "--size", "400", "--format", "json"
    )
    assert asked.returncode == 0, asked.stderr
    want = json.loads(asked.stdout)["config"]
    header = run_hpc(
        settings, "recommend", "--workload", "hpcc", "--size", "400", "--format", "slurm"
    )
    assert f"#SBATCH --ntasks={want['ranks']}" in header.stdout, header.stdout

    env = {
        **cli_env(settings),
        "SLURM_CONF": str(slurm.conf),
        "WORKLOAD": "hpcc",
        "SIZE": "400",
        "HPC_DS1": HPC_DS1,
        "PYTHON": sys.executable,
    }
    out = tmp_path / "job.out"
    # --overcommit: the model may recommend more ranks than this node's 2 CPUs
    submitted = subprocess.run(
        [str(SUBMIT), "--parsable", "--overcommit", "-o", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    state = SlurmPartition(slurm.partition, tmp_path).wait(job_id, time.monotonic() + 300, None)
    log = out.read_text()
    assert state == "COMPLETED", log
    knobs = " ".join(f"--knob {k}={v}" for k, v in want["knobs"].items())
    line = f"for hpcc 400: ranks={want['ranks']} threads={want['threads']} {knobs}"
    assert line in log, log  # the header's --ntasks and --cpus-per-task, the model's knobs
    assert f"ran srun -n {want['ranks']} " in log and "--mpi=pmix" in log and ": ok in" in log
    with engine.connect() as conn:
        t = tables.measurements
        rows = conn.execute(
            select(t.c.config, t.c.status, t.c.runtime_s).where(t.c.purpose == "observed")
        ).all()
    assert len(rows) == 1, rows
    assert rows[0].status == "ok" and rows[0].runtime_s > 0
    assert rows[0].config["knobs"] == want["knobs"] and rows[0].config["ranks"] == want["ranks"]
