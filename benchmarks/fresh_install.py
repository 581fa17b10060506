"""A first-time user's path, as the README says (issue 44): a fresh venv, `pip install .`
without extras, then `hpc-ds1 setup --quick` on the embedded default (no HPC_DS1_NATS_URL or
HPC_DS1_DATABASE_URL, a new home), timed. The MPICH wheel is a default dependency, so the
setup's ranks start without any MPI on the machine; PATH is this machine's, without this
project's .venv/bin (on a Debian box with openmpi-bin, /usr/bin/mpiexec is Open MPI's, which
the runner passes over for the wheel's: runner/launch.py choose_mpiexec).

    .venv/bin/python benchmarks/fresh_install.py [--sizes 100000,200000,400000] [--repeats N]
        [--keep DIR] [--no-mpich] [--json]

--no-mpich installs with HPC_DS1_NO_MPICH=1 and checks that the wheel is left out (the setup
then needs a site MPI: it runs only when one is on PATH). `resolve` is the quick check that
CI runs with the suite: what `pip install --dry-run --report` of this project resolves.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = "montecarlo"
SIZES = "100000,200000,400000"  # the smallest sizes the CLI tests set up for real
INSTALL_TIMEOUT_S = 1200
SETUP_TIMEOUT_S = 900


@dataclass
class FreshInstall:
    install_s: float  # python -m venv + pip install . (no extras)
    setup_s: float | None  # hpc-ds1 setup --quick, the embedded default; None: not run
    distributions: dict[str, str]  # what the fresh venv holds: name -> version
    mpiexec: str | None  # the mpiexec the fresh venv's runner picks
    setup: dict[str, Any] = field(default_factory=dict)  # setup --json's answer


def base_python() -> str:
    """The interpreter a venv is made from: this one's base (not this venv's python)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def clean_env(no_mpich: bool = False) -> dict[str, str]:
    """This environment without HPC_DS1_* settings or this venv's bin on PATH: a new user's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    env.pop("VIRTUAL_ENV", None)
    ours = os.path.dirname(sys.executable)
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", os.defpath).split(os.pathsep) if p and p != ours
    )
    if no_mpich:
        env["HPC_DS1_NO_MPICH"] = "1"
    return env


def resolve(no_mpich: bool = False) -> dict[str, str]:
    """What `pip install .` (no extras) would install in an empty environment: name -> version,
    from pip's own resolver (`--dry-run --ignore-installed --report`)."""
    with tempfile.TemporaryDirectory(prefix="hpc-ds1-resolve-") as tmp:
        report = Path(tmp) / "report.json"
        argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed"]
        argv += ["--quiet", "--report", str(report), str(ROOT)]
        done = subprocess.run(
            argv, capture_output=True, text=True, env=clean_env(no_mpich), cwd=tmp, timeout=600
        )
        if done.returncode != 0:
            raise RuntimeError(f"pip could not resolve {ROOT}: {done.stderr[-2000:]}")
        items = json.loads(report.read_text())["install"]
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in items}


def fresh_install(
    venv: Path, sizes: str = SIZES, repeats: int | None = None, no_mpich: bool = False
) -> FreshInstall:
    """Make `venv`, install this project into it without extras, then run the quick setup in
    a home inside it (skipped with no_mpich when no site MPI is on PATH)."""
    env = clean_env(no_mpich)
    started = time.perf_counter()
    subprocess.run([base_python(), "-m", "venv", str(venv)], check=True, env=env)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    done = subprocess.run(
        [*pip, str(ROOT)],
        capture_output=True,
        text=True,
        env=env,
        cwd=venv,
        timeout=INSTALL_TIMEOUT_S,
    )
    install_s = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"pip install {ROOT} failed: {done.stderr[-3000:]}")
    python = str(venv / "bin" / "python")
    listed = subprocess.run(
        [python, "-m", "pip", "list", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    dists = {d["name"].lower(): d["version"] for d in json.loads(listed.stdout)}
    probe = "from hpc_ds1.runner.launch import mpiexec_path; print(mpiexec_path())"
    picked = subprocess.run(
        [python, "-c", probe], capture_output=True, text=True, env=env, cwd=venv, check=True
    ).stdout.strip()
    mpiexec = shutil.which(picked, path=env["PATH"]) if os.sep not in picked else picked
    result = FreshInstall(install_s, None, dists, mpiexec)
    if no_mpich and mpiexec is None:
        return result  # no MPI at all: setup would only say "no MPI found"
    argv = [str(venv / "bin" / "hpc-ds1"), "setup", "--quick", "--workload", WORKLOAD]
    argv += ["--sizes", sizes, "--home", str(venv / "home"), "--json"]
    if repeats is not None:
        argv += ["--repeats", str(repeats)]
    started = time.perf_counter()
    done = subprocess.run(
        argv, capture_output=True, text=True, env=env, cwd=venv, timeout=SETUP_TIMEOUT_S
    )
    result.setup_s = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"setup --quick failed ({done.returncode}): {done.stderr[-3000:]}")
    result.setup = json.loads(done.stdout)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=SIZES, help=f"setup's sizes (default {SIZES})")
    parser.add_argument("--repeats", type=int, default=None, help="setup's timed repeats")
    parser.add_argument("--keep", type=Path, default=None, help="make the venv here, keep it")
    parser.add_argument("--no-mpich", action="store_true", help="install with HPC_DS1_NO_MPICH=1")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hpc-ds1-fresh-") as tmp:
        venv = args.keep or Path(tmp) / "venv"
        if venv.exists():
            parser.error(f"{venv} exists: the point is a fresh venv")
        result = fresh_install(venv, args.sizes, args.repeats, args.no_mpich)
    if args.json:
        print(json.dumps(asdict(result), indent=2, default=str))
        return 0
    wheel = result.distributions.get("mpich")
    n = len(result.distributions)
    print(f"pip install . (no extras): {result.install_s:.1f} s, {n} distributions")
    print(f"  MPICH wheel: {wheel or 'not installed'}; mpiexec picked: {result.mpiexec}")
    if result.setup_s is None:
        print("setup --quick: not run (no MPI on PATH and no wheel)")
    else:
        s = result.setup
        print(f"setup --quick ({WORKLOAD}, sizes {args.sizes}): {result.setup_s:.1f} s, ", end="")
        print(f"{s.get('measured')} runs {s.get('by_status')}, model {s['model']['version']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
