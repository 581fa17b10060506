"""Binding is a knob (issue 44, item 3): a workload file says which knob is the launcher's rank
binding (`launcher = "bind"`) and which knob sets an environment variable (`env = "VAR"`,
e.g. OMP_PROC_BIND, OMP_PLACES); the launch carries them for each launcher (our mpiexec's
Hydra `-bind-to`, srun's `--cpu-bind`, Open MPI's `--bind-to`), and a real run under 2 ranks
is bound as asked (each rank reads its own CPU affinity)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from hpc_ds1.runner import Status, run
from hpc_ds1.runner.command import command_argv, command_env
from hpc_ds1.space import Config, ConfigSpace
from hpc_ds1.workloads import CommandWorkload, WorkloadFileError, load_workload_file

# Each rank writes its CPU affinity and the binding variables it sees, then prints a runtime.
REPORTER = """\
import json, os, sys
rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
seen = {"cpus": sorted(os.sched_getaffinity(0)),
        **{v: os.environ.get(v) for v in ("OMP_PROC_BIND", "OMP_PLACES")}}
with open(os.path.join(sys.argv[1], f"rank-{rank}.json"), "w") as out:
    json.dump(seen, out)
print("runtime_s=0.01")
"""
OPENMPI = shutil.which("mpirun.openmpi") is not None
# The launcher's binding and two OpenMP variables, each a knob.
KNOBS = """\
bind = { values = ["none", "core", "socket"], default = "none", launcher = "bind" }
proc_bind = { values = ["false", "close", "spread"], default = "false", env = "OMP_PROC_BIND" }
places = { values = ["cores", "sockets"], env = "OMP_PLACES" }"""


def write(folder: Path, launcher: str = "mpi", knobs: str = "", extra: str = "") -> Path:
    (folder / "reporter.py").write_text(REPORTER)
    path = folder / "bound.toml"
    path.write_text(
        f"""
[workload]
name = "bound-{launcher}"
command = "{{python}} reporter.py {folder / "seen"}"
launcher = "{launcher}"
sizes = [1, 2]
warmup = false
{extra}
[knobs]
{knobs or KNOBS}
[check]
exit_code = true
"""
    )
    return path


def load(path: Path) -> CommandWorkload:
    wl = load_workload_file(path)
    assert isinstance(wl, CommandWorkload)
    return wl


def config(bind: str = "core", proc_bind: str = "close", ranks: int = 2) -> Config:
    knobs = {"bind": bind, "proc_bind": proc_bind, "places": "cores"}
    return Config(ranks=ranks, threads=1, tile=1, knobs=knobs)


def test_each_launcher_carries_the_binding_and_the_env_knobs(tmp_path: Path) -> None:
    wl = load(write(tmp_path))
    assert wl.bind_knob == "bind"
    values = wl.values(config(), 1, "/x/mpiexec")
    env = command_env(wl, values)
    assert (env["OMP_PROC_BIND"], env["OMP_PLACES"]) == ("close", "cores")
    mpiexec = command_argv(wl, values, "mpiexec", env)
    assert mpiexec[1:5] == ["-n", "2", "-bind-to", "core"], mpiexec
    if shutil.which("srun") is not None:  # the words only: nothing is started
        srun = command_argv(wl, values, "srun", env)
        assert srun[:3] == ["srun", "-n", "2"] and "--cpu-bind=cores" in srun, srun
        none = command_argv(wl, wl.values(config("none"), 1), "srun", env)
        assert "--cpu-bind=none" in none
    if OPENMPI:
        ompi = load(write(tmp_path, "openmpi"))
        words = command_argv(ompi, ompi.values(config("socket"), 1), "mpiexec", env)
        assert words[words.index("--bind-to") + 1] == "socket:overload-allowed", words
        words = command_argv(ompi, ompi.values(config("none"), 1), "mpiexec", env)
        assert words[words.index("--bind-to") + 1] == "none", words


def test_a_knob_named_bind_to_is_the_binding_as_first_written(tmp_path: Path) -> None:
    knobs = 'bind_to = { values = ["none", "core"] }'
    wl = load(write(tmp_path, knobs=knobs, extra='env = { OMP_NUM_THREADS = "{threads}" }'))
    assert wl.bind_knob == "bind_to"
    cfg = Config(ranks=2, threads=1, tile=1, knobs={"bind_to": "core"})
    assert "-bind-to" in command_argv(wl, wl.values(cfg, 1), "mpiexec", {})


@pytest.mark.parametrize(
    ("launcher", "knobs", "field", "words"),
    [
        ("none", 'b = { values = ["core"], launcher = "bind" }', "[knobs.b] launcher",
         "binds no ranks"),
        ("mpi", 'b = { values = ["core", "fast"], launcher = "bind" }', "[knobs.b] values",
         "'fast'"),
        ("mpi", 'b = { values = ["core"], launcher = "pin" }', "[knobs.b] launcher",
         'accepted: "bind"'),
        ("mpi", 'b = { values = ["core"], launcher = "bind" }\nc = { values = ["none"], '
         'launcher = "bind" }', "[knobs.c] launcher", "one knob may be"),
        ("mpi", 'b = { values = ["close"], env = "HPC_DS1_X" }', "[knobs.b] env", "not HPC_DS1_"),
        ("mpi", 'b = { values = ["close"], env = "OMP_NUM_THREADS" }', "[knobs.b] env",
         "set it once"),
    ],
)  # fmt: skip
def test_a_wrong_role_names_the_file_the_field_and_what_is_accepted(
    tmp_path: Path, launcher: str, knobs: str, field: str, words: str
) -> None:
    path = write(tmp_path, launcher, knobs)
    if launcher == "none":  # the command must use {ranks} itself
        path.write_text(path.read_text().replace("reporter.py", "reporter.py {ranks}"))
    with pytest.raises(WorkloadFileError) as error:
        load_workload_file(path)
    message = str(error.value)
    assert str(path) in message and field in message and words in message, message


def _space(wl: CommandWorkload) -> ConfigSpace:
    return ConfigSpace.for_cpus(2, wl.tiles, 0, knobs=wl.knobs, constraints=wl.constraints)


@pytest.mark.parametrize(
    "launcher",
    [
        "mpi",
        pytest.param(
            "openmpi",
            marks=pytest.mark.skipif(not OPENMPI, reason="Debian's Open MPI is not installed"),
        ),
    ],
)
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two ranks bound to two CPUs")
def test_a_real_run_under_two_ranks_is_bound_as_the_knobs_say(
    tmp_path: Path, launcher: str
) -> None:
    (tmp_path / "seen").mkdir()
    wl = load(write(tmp_path, launcher))
    result = run(wl, 1, config("core", "spread"), repeats=1, space=_space(wl))
    assert result.status is Status.OK, result.error
    seen = [json.loads(p.read_text()) for p in sorted((tmp_path / "seen").glob("rank-*.json"))]
    assert len(seen) == 2, seen
    # bound to a core each, different ones (this machine has 2), with the env knobs' values
    assert [len(s["cpus"]) for s in seen] == [1, 1] and seen[0]["cpus"] != seen[1]["cpus"], seen
    assert {(s["OMP_PROC_BIND"], s["OMP_PLACES"]) for s in seen} == {("spread", "cores")}
    for p in (tmp_path / "seen").iterdir():
        p.unlink()
    free = run(wl, 1, config("none", "false"), repeats=1, space=_space(wl))
    assert free.status is Status.OK, free.error
    seen = [json.loads(p.read_text()) for p in sorted((tmp_path / "seen").glob("rank-*.json"))]
    assert all(len(s["cpus"]) == len(seen[0]["cpus"]) >= 1 for s in seen)  # unbound: all CPUs


def test_hpc_ds1_run_takes_the_knobs_on_its_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hpc_ds1.cli import main

    (tmp_path / "seen").mkdir()
    path = write(tmp_path)
    monkeypatch.setenv("HPC_DS1_HOME", str(tmp_path / "home"))
    argv = ["run", "--workload-file", str(path), "--size", "1", "--ranks", "2", "--threads", "1"]
    argv += ["--repeats", "1"]
    assert main([*argv, "--knob", "bind=socket", "--knob", "proc_bind=close", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["config"]["knobs"] == {"bind": "socket", "places": "cores", "proc_bind": "close"}
    assert " -bind-to socket " in f" {result['command']} ", result["command"]
    assert main([*argv, "--knob", "pin=core"]) == 2
    assert "--knob pin: not a knob of bound-mpi; bind, proc_bind, places" in capsys.readouterr().err
