"""A first real application (issue 44): Debian's hpcc (HPC Challenge) under Open MPI's own
mpirun, from examples/workloads/hpcc.toml, run, set up, decided for and tuned for real at
small sizes; and the launch environment, which never mixes MPI implementations.

`make install` installs hpcc (deploy/install-apps.sh); without it the tests that run it skip."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from hpc_ds1.runner import Status, mpienv, run
from hpc_ds1.runner.command import command_argv, command_env, missing_programs
from hpc_ds1.settings import Settings
from hpc_ds1.space import Config, ConfigSpace
from hpc_ds1.workloads import CommandWorkload, WorkloadFileError, load_workload_file
from tests.support.commands import HPC_DS1, run_hpc

ROOT = Path(__file__).resolve().parents[2]
HPCC_TOML = ROOT / "examples" / "workloads" / "hpcc.toml"
VENV_BIN = str(Path(sys.executable).parent)
needs_hpcc = pytest.mark.skipif(
    shutil.which("hpcc") is None or shutil.which("mpirun.openmpi") is None,
    reason="Debian's hpcc (and its Open MPI mpirun) is not installed: `make apps` as root "
    "(deploy/install-apps.sh) installs it",
)


def _hpcc() -> CommandWorkload:
    wl = load_workload_file(HPCC_TOML)
    assert isinstance(wl, CommandWorkload)
    return wl


def _space(wl: CommandWorkload) -> ConfigSpace:
    return ConfigSpace.for_cpus(2, wl.tiles, 0, knobs=wl.knobs, constraints=wl.constraints)


def test_the_example_file_parses_with_its_knobs_launcher_input_and_package() -> None:
    wl = _hpcc()
    assert wl.name == "hpcc" and wl.launcher == "openmpi" and wl.package == "hpcc"
    assert [k.name for k in wl.knobs] == ["nb", "p", "q"]
    assert wl.constraints == ("p * q == ranks", "p <= q", "threads == 1")
    assert wl.output == "hpccoutf.txt" and [n for n, _ in wl.inputs] == ["hpccinf.txt"]
    configs = _space(wl).configs()
    assert configs and all(c.knob("p") * c.knob("q") == c.ranks for c in configs)  # type: ignore[operator]
    values = wl.values(Config(ranks=2, threads=1, tile=1, knobs={"nb": 64, "p": 1, "q": 2}), 400)
    text = wl.input_files(values)["hpccinf.txt"].splitlines()
    # HPL's lines 6, 8, 11, 12: N, NB, P, Q
    assert [text[i].split()[0] for i in (5, 7, 10, 11)] == ["400", "64", "1", "2"]
    argv = command_argv(wl, values, env={"PATH": "/usr/bin:/bin"})
    if shutil.which("mpirun.openmpi", path="/usr/bin:/bin"):
        assert argv[-6:] == ["--oversubscribe", "-np", "2", "--bind-to", "none", "hpcc"]
        assert ("--allow-run-as-root" in argv) == (os.geteuid() == 0)


def test_input_files_and_the_fresh_folder_are_checked(tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("n={size} nb={nb} {nodes}\n")
    text = (
        '[workload]\nname = "x"\ncommand = "app"\nlauncher = "openmpi"\nsizes = [1]\n'
        'inputs = { "in.txt" = "in.txt" }\noutput = "out.txt"\n{extra}'
        "[knobs]\nnb = [1, 2]\n[check]\nexit_code = true\n"
    )
    path = tmp_path / "x.toml"
    path.write_text(text.replace("{extra}", ""))
    with pytest.raises(WorkloadFileError, match=r"inputs\.in\.txt: .*unknown placeholder.*nodes"):
        load_workload_file(path)
    (tmp_path / "in.txt").write_text("n={size} nb={nb}\n")
    assert load_workload_file(path).fresh_folder  # type: ignore[union-attr]
    path.write_text(text.replace("{extra}", 'workdir = "."\n'))
    with pytest.raises(WorkloadFileError, match=r"workdir: .*fresh folder"):
        load_workload_file(path)


def test_the_launch_environment_does_not_mix_mpi_implementations() -> None:
    ours = ["/v/bin", "/v/lib", "/v/lib64"]
    env = {
        "PATH": "/v/bin:/usr/bin:/opt/ompi/bin:/bin",
        "LD_LIBRARY_PATH": "/v/lib:/v/lib/mpich:/opt/ompi/lib",
        "MPIR_CVAR_CH3_NOLOCAL": "1", "MPICH_PORT_RANGE": "1:2", "HYDRA_LAUNCHER": "fork",
        "PMI_RANK": "0", "OMPI_MCA_btl": "self", "PMIX_RANK": "0", "OPAL_PREFIX": "/opt",
        "OMP_NUM_THREADS": "2", "HOME": "/root",
    }  # fmt: skip
    openmpi = mpienv.mpi_env(env, "openmpi", ours)
    assert openmpi == {
        "PATH": "/usr/bin:/opt/ompi/bin:/bin",
        "LD_LIBRARY_PATH": "/opt/ompi/lib",
        "OMPI_MCA_btl": "self", "PMIX_RANK": "0", "OPAL_PREFIX": "/opt",
        "OMP_NUM_THREADS": "2", "HOME": "/root",
    }  # fmt: skip
    mpich = mpienv.mpi_env(env, "mpich", ["/opt/ompi/bin", "/opt/ompi/lib"])
    assert mpich == {
        "PATH": "/v/bin:/usr/bin:/bin",
        "LD_LIBRARY_PATH": "/v/lib:/v/lib/mpich",
        "MPIR_CVAR_CH3_NOLOCAL": "1", "MPICH_PORT_RANGE": "1:2", "HYDRA_LAUNCHER": "fork",
        "PMI_RANK": "0", "OMP_NUM_THREADS": "2", "HOME": "/root",
    }  # fmt: skip
    # a system folder stays on PATH even when an implementation lives there; an emptied
    # LD_LIBRARY_PATH goes; the input is not changed
    only = mpienv.mpi_env(
        {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/v/lib"}, "openmpi", ["/usr/bin", "/v/lib"]
    )
    assert only == {"PATH": "/usr/bin"} and env["HYDRA_LAUNCHER"] == "fork"


def test_a_command_workload_launch_gets_only_its_own_mpi(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's environment as an MPICH launch leaves it, through command_env."""
    monkeypatch.setenv("PATH", f"{VENV_BIN}:/usr/bin:/bin")
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{Path(VENV_BIN).parent / 'lib'}:/opt/lib")
    for name in ("HYDRA_PROXY_PORT", "MPIR_CVAR_X", "PMI_SIZE", "OMPI_MCA_x", "PMIX_NAMESPACE"):
        monkeypatch.setenv(name, "1")
    wl = _hpcc()
    values = wl.values(Config(ranks=2, threads=1, tile=1, knobs={"nb": 64, "p": 1, "q": 2}), 400)
    env = command_env(wl, values)
    assert VENV_BIN not in env["PATH"].split(":") and "/usr/bin" in env["PATH"].split(":")
    assert env.get("LD_LIBRARY_PATH") == "/opt/lib"
    assert not [k for k in env if k.startswith(("HYDRA_", "MPIR_", "PMI_"))]
    assert env["OMPI_MCA_x"] == "1" and env["OMP_NUM_THREADS"] == "1"
    mpich = command_env(replace(wl, launcher="mpi"), values, "mpiexec")
    assert not [k for k in mpich if k.startswith(("OMPI_", "PMIX_"))]
    assert VENV_BIN in mpich["PATH"].split(":") and mpich["HYDRA_PROXY_PORT"] == "1"


def test_workloads_check_names_what_is_missing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    env.update(HPC_DS1_HOME=str(tmp_path / "home"), PATH=str(tmp_path))  # no hpcc, no mpirun
    bare = subprocess.run(
        [HPC_DS1, "workloads", "--check", str(HPCC_TOML)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bare.returncode == 1, bare.stdout + bare.stderr
    assert "missing here: hpcc is not installed (not on PATH): install hpcc" in bare.stdout
    assert "missing here: Open MPI's mpirun" in bare.stdout and "openmpi-bin" in bare.stdout
    assert missing_programs(replace(_hpcc(), template="./nothing-here")) != []


@needs_hpcc
def test_hpcc_runs_under_two_ranks_with_its_own_mpirun() -> None:
    wl = _hpcc()
    config = Config(ranks=2, threads=1, tile=1, knobs={"nb": 32, "p": 1, "q": 2})
    assert missing_programs(wl) == []
    started = time.monotonic()
    result = run(wl, 400, config, repeats=1, space=_space(wl))
    assert result.status is Status.OK, result.error
    assert re.search(
        r"mpirun\.openmpi .*--oversubscribe -np 2 --bind-to none hpcc$", result.command
    )
    # HPL's time (well under the whole run's), its residual (PASSED: at most 16) read back
    assert 0 < result.runtime_s < time.monotonic() - started
    assert result.check_ok and 0 < result.check_error < 16
    wrong = run(replace(wl, output="nothing.txt"), 400, config, repeats=1, space=_space(wl))
    assert wrong.status is Status.FAILED and "wrote no nothing.txt" in wrong.error


def test_the_binding_example_is_hpcc_with_a_binding_knob_and_its_own_name() -> None:
    wl = load_workload_file(HPCC_TOML.with_name("hpcc-bind.toml"))
    assert isinstance(wl, CommandWorkload)
    assert wl.name == "hpcc-bind" and wl.bind_knob == "bind" and wl.timeout_s == 600.0
    assert [k.name for k in wl.knobs] == ["nb", "p", "q", "bind"]
    assert [k.name for k in _hpcc().knobs] == ["nb", "p", "q"]  # hpcc's space is unchanged


@needs_hpcc
def test_hpcc_runs_under_two_ranks_bound_to_cores() -> None:
    wl = load_workload_file(HPCC_TOML.with_name("hpcc-bind.toml"))
    assert isinstance(wl, CommandWorkload)
    config = Config(ranks=2, threads=1, tile=1, knobs={"nb": 32, "p": 1, "q": 2, "bind": "core"})
    result = run(wl, 400, config, repeats=1, space=_space(wl))
    assert result.status is Status.OK, result.error
    assert result.command.endswith("-np 2 --bind-to core:overload-allowed hpcc"), result.command
    assert result.check_ok and 0 < result.check_error < 16


@needs_hpcc
def test_setup_decide_and_tune_hpcc_for_real(settings: Settings) -> None:
    folder = settings.home / "workloads"
    folder.mkdir(parents=True)
    # the example, at the two smallest sizes, with its input template beside it
    (folder / "hpcc").mkdir()
    shutil.copy(HPCC_TOML.parent / "hpcc" / "hpccinf.txt", folder / "hpcc" / "hpccinf.txt")
    text = HPCC_TOML.read_text().replace("sizes = [400, 800, 1200]", "sizes = [400, 600]")
    (folder / "hpcc.toml").write_text(text.replace("held_out = [600, 1000]", "held_out = [500]"))
    timings = {}

    def hpc(*args: str) -> subprocess.CompletedProcess[str]:
        started = time.monotonic()
        done = run_hpc(settings, *args, timeout=240)
        timings[args[0]] = round(time.monotonic() - started, 1)
        assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"
        return done

    setup = hpc("setup", "--workload", "hpcc", "--budget", "6", "--repeats", "1")
    assert "measured 6 runs" in setup.stdout and "trained model" in setup.stdout, setup.stdout
    decided = hpc(
        "decide", "--workload", "hpcc", "--size", "500", "--ranks", "1", "--threads", "1",
        "--knob", "nb=64", "--knob", "p=1", "--knob", "q=1",
    )  # fmt: skip
    assert (
        "hpcc 500 · ranks=1 threads=1 tile=1 gpu=False nb=64 p=1 q=1 · ran for real"
        in (decided.stdout)
        and "choice" in decided.stdout
    ), decided.stdout
    tuned = hpc("tune", "--workload", "hpcc", "--size", "500", "--no-wait",
                "--start", "ranks=1,threads=1,nb=64,p=1,q=1")  # fmt: skip
    # the session runs its start for real; it goes on, or stops, or waits for an engineer
    assert re.search(
        r"^0 +\(start\) +ranks=1 threads=1 tile=1 nb=64 p=1 q=1 +[0-9.]+ s +ok", tuned.stdout, re.M
    ), tuned.stdout
    print("timings (s):", timings)  # 2 CPUs: setup 33-35, decide 9, tune 12-17
