"""TOML workload files: validation that names the file and the field, discovery, and a real
C/OpenMP program (data/heat.c, built with this machine's gcc) run under MPI ranks."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest

from hpc_ds1.cli import main
from hpc_ds1.runner import Status, run
from hpc_ds1.runner.command import command_env
from hpc_ds1.space import Config
from hpc_ds1.workloads import (
    UnknownWorkload,
    WorkloadFileError,
    get_workload,
    list_workloads,
    load_errors,
    load_file,
    load_workload_file,
    registry,
    source_of,
    use_home,
)
from hpc_ds1.workloads.command import CheckSpec, CommandWorkload, RuntimeSpec
from hpc_ds1.workloads.outcome import read_check, read_runtime
from tests.workloads.heatapp import HEAT_TOML, build_heat, write_heat_toml

VALID = """\
[workload]
name = "app"
command = "./app {size} {block}"
sizes = [1, 2]
[knobs.block]
values = [4, 1, 2]
[check]
exit_code = true
"""


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """A registry of its own (built-ins only) and an empty home; yields the home."""
    home = tmp_path / "home"
    monkeypatch.setenv("HPC_DS1_HOME", str(home))
    monkeypatch.delenv("HPC_DS1_WORKLOAD_PATH", raising=False)
    for name in ("_registry", "_sources", "_errors"):
        monkeypatch.setattr(registry, name, {})
    monkeypatch.setattr(registry, "_homes", set())
    monkeypatch.setattr(registry, "_pending", [])
    monkeypatch.setattr(registry, "_loaded", False)
    yield home


def write(folder: Path, text: str, name: str = "app.toml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


def test_a_valid_file_declares_a_command_workload(tmp_path: Path) -> None:
    wl = load_workload_file(write(tmp_path, VALID))
    assert isinstance(wl, CommandWorkload)
    assert (wl.name, wl.sizes, wl.held_out) == ("app", (1, 2), ())
    assert (wl.tiles, wl.default_tile, wl.knob) == ((1, 2, 4), 2, "block")
    assert wl.launcher == "mpi" and wl.env == (("OMP_NUM_THREADS", "{threads}"),)
    assert wl.runtime == RuntimeSpec("wall") and wl.check == CheckSpec("exit_code")
    assert wl.workdir == str(tmp_path.resolve())
    values = wl.values(Config(ranks=2, threads=3, tile=4), 100)
    assert wl.argv(values) == ["./app", "100", "4"]
    assert wl.environment(values) == {"OMP_NUM_THREADS": "3"}


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        ("[workload]", "[job]", "unknown section(s) ['job']"),
        ('name = "app"\n', "", "[workload] name: None; accepted: 1-64 letters"),
        ('name = "app"', 'name = "my app"', "[workload] name: 'my app'"),
        ("{size} {block}", "{size} {block} {nodes}", "unknown placeholder(s) ['nodes']"),
        ("{size} {block}", "{size:05d} {block}", "write the bare placeholder"),
        ("{size} {block}", "{size}", "neither the command nor env uses {block}"),
        ("sizes = [1, 2]", "sizes = [2, 1]", "[workload] sizes: sizes must be strictly increasing"),
        ("sizes = [1, 2]", "sizes = []", "[workload] sizes: must be a non-empty list"),
        ("sizes = [1, 2]", "sizes = [1, 2]\nheld_out = [2]", "[2] are training sizes too"),
        ("sizes = [1, 2]", 'sizes = [1, 2]\nlauncher = "srun"', 'accepted: "mpi"'),
        ("sizes = [1, 2]", 'sizes = [1, 2]\nlauncher = "none"', "uses {ranks}"),
        ("sizes = [1, 2]", "sizes = [1, 2]\nenv = {}", "uses {threads}"),
        ("sizes = [1, 2]", 'sizes = [1, 2]\nenv = { HPC_DS1_HOME = "x" }', "env.HPC_DS1_HOME"),
        ("sizes = [1, 2]", "sizes = [1, 2]\nnodes = 2", "unknown key(s) ['nodes']"),
        ("values = [4, 1, 2]", "values = [4, 4]", "[knobs.block] values: [4, 4] repeats a value"),
        ("values = [4, 1, 2]", "values = [1, 2]\ndefault = 3", "default: 3 is not one of"),
        ("[knobs.block]", "[knobs.size]", "[knobs.size]: 'size' is not accepted as a name"),
        (
            "[check]",
            "[knobs.other]\nvalues = [1]\n[check]",
            "neither the command nor env uses {other}",
        ),
        ("[check]\nexit_code = true\n", "", "[check]: missing"),
        ("exit_code = true", 'exit_code = true\nregex = "ok"', "give exactly one of"),
        ("exit_code = true", "exit_code = false", "[check] exit_code: accepted: true"),
        ("exit_code = true", 'regex = "err=("', "not a valid regular expression"),
        ("exit_code = true", 'regex = "err=(.*)"', "[check] max_error: a regex with a capture"),
        ("exit_code = true", 'regex = "ok"\nmax_error = 1', "needs a regex with one capture"),
        ("exit_code = true", 'command = "diff {output} {expected}"', "['expected']"),
        ("exit_code = true", 'exit_code = true\n[runtime]\nregex = "t=.*"', "0 capture group"),
        ("exit_code = true", "exit_code = true\n[runtime]\nwall = 1", "[runtime] wall"),
        (
            "exit_code = true",
            'exit_code = true\n[runtime]\nregex = "t=(.*)"\ncombine = "sum"',
            "[runtime] combine: 'sum'; accepted: max",
        ),
        ("exit_code = true", "exit_code = true\n[work]\nflops = 3", "[work] flops: must be"),
        ("[workload]", "[workload", "not valid TOML"),
    ],
)
def test_bad_files_are_refused_naming_the_file_and_the_field(
    tmp_path: Path, old: str, new: str, says: str
) -> None:
    assert old in VALID
    path = write(tmp_path, VALID.replace(old, new, 1))
    with pytest.raises(WorkloadFileError) as caught:
        load_workload_file(path)
    assert str(caught.value).startswith(str(path)), caught.value
    assert says in str(caught.value)


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(WorkloadFileError, match="cannot read the workload file"):
        load_workload_file(tmp_path / "nowhere.toml")


def test_declared_work_gives_the_features_their_flops(tmp_path: Path) -> None:
    text = VALID + "[work]\nflops = { scale = 2.0, power = 3 }\nbytes = { scale = 8, power = 2 }\n"
    wl = load_workload_file(write(tmp_path, text))
    work = wl.work(10)
    assert (work.flops, work.bytes_moved, work.memory_bytes) == (2000.0, 800.0, 0)
    assert wl.throughput_unit == "GFLOP/s"
    plain = load_workload_file(write(tmp_path, VALID)).work(10)
    assert (plain.flops, plain.bytes_moved, plain.items) == (0.0, 0.0, 10.0)


def test_runtime_and_check_are_read_over_every_rank() -> None:
    out = "rank=0 time=0.5 error=0\nrank=1 time=0.75 error=2e-9\n"
    assert read_runtime(RuntimeSpec("regex", r"time=([0-9.]+)"), out, 9.0) == 0.75
    assert read_runtime(RuntimeSpec("regex", r"time=([0-9.]+)", "last"), out, 9.0) == 0.75
    assert read_runtime(RuntimeSpec("wall"), out, 9.0) == 9.0
    strict = read_check(CheckSpec("regex", r"error=(\S+)", max_error=1e-9), out)
    loose = read_check(CheckSpec("regex", r"error=(\S+)", max_error=1e-8), out)
    assert strict is not None and not strict.ok and strict.error == 2e-9
    assert loose is not None and loose.ok
    missing = read_check(CheckSpec("regex", r"residual=(\S+)", max_error=1.0), out)
    assert missing is not None and not missing.ok and "no line" in missing.detail


def test_home_and_path_files_are_found_and_a_clash_is_refused(
    fresh: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(fresh / "workloads", VALID)
    extra = write(tmp_path / "more", VALID.replace('"app"', '"app2"'), "app2.toml")
    clash = write(tmp_path / "clash", VALID.replace('"app"', '"gemm"'), "gemm.toml")
    again = write(tmp_path / "again", VALID, "app.toml")
    broken = write(tmp_path / "broken", "[workload]\nname = 3\n", "broken.toml")
    monkeypatch.setenv("HPC_DS1_WORKLOAD_PATH", f"{extra.parent}:{clash}:{again}:{broken}")
    assert {"app", "app2", "gemm"} <= set(list_workloads())
    assert source_of("app") == str((fresh / "workloads" / "app.toml").resolve())
    assert source_of("gemm") == "built-in"
    errors = load_errors()
    assert "taken by the built-in workload gemm" in errors[str(clash.resolve())]
    assert (
        "is taken by " + str((fresh / "workloads" / "app.toml").resolve())
        in errors[str(again.resolve())]
    )
    with pytest.raises(UnknownWorkload, match=r"not loaded: .*broken.toml: \[workload\] name"):
        get_workload("broken")


def test_a_home_given_later_is_read_and_a_file_can_be_reloaded(fresh: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-home"
    path = write(other / "workloads", VALID)
    assert "app" not in list_workloads()
    use_home(other)
    assert get_workload("app").sizes == (1, 2)
    path.write_text(VALID.replace("[1, 2]", "[1, 2, 3]"))
    assert load_file(path).sizes == (1, 2, 3) and get_workload("app").sizes == (1, 2, 3)


def test_python_load_of_a_home_reads_its_workload_files(fresh: Path, tmp_path: Path) -> None:
    import hpc_ds1

    other = tmp_path / "python-home"
    write(other / "workloads", VALID)
    assert "app" not in list_workloads()
    with pytest.raises(hpc_ds1.NoModelError):  # no model there, but its workloads are known
        hpc_ds1.load(other)
    assert get_workload("app").sizes == (1, 2)


def test_a_broken_entry_point_does_not_hide_the_others(
    fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = EntryPoint(name="gone", value="tests.no_such_module:X", group="hpc_ds1.workloads")
    good = EntryPoint(name="liar", value="tests.runner.plugins:LIAR", group="hpc_ds1.workloads")
    monkeypatch.setattr(registry, "entry_points", lambda group: [broken, good])
    assert "test-liar" in list_workloads() and "gemm" in list_workloads()
    assert source_of("test-liar").startswith("plug-in liar")
    assert "ModuleNotFoundError" in load_errors()["plug-in gone = tests.no_such_module:X"]


def test_run_command_refuses_a_workload_name_and_names_itself(
    fresh: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "--workload", "gemm", "--size", "8", "--command", "echo hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hpc-ds1 run: --workload gemm with --command"), err
    assert "already a workload (built-in)" in err
    assert main(["run", "--workload", "x", "--size", "1", "--command", "run {nodes}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hpc-ds1 run: --command: command template uses unknown"), err


@pytest.fixture
def heat(tmp_path: Path) -> Path:
    """A folder with the heat binary and its workload file."""
    folder = tmp_path / "app"
    folder.mkdir()
    build_heat(folder)
    return write_heat_toml(folder)


def test_a_c_openmp_program_runs_under_two_mpi_ranks(heat: Path) -> None:
    wl = load_workload_file(heat)
    r = run(wl, 64, Config(ranks=2, threads=1, tile=16), repeats=2)
    assert r.status is Status.OK, r.error
    assert r.check_ok and r.check_error == 0.0 and "2 value(s)" in r.check_detail
    assert r.runtime_s is not None and r.runtime_s > 0 and r.repeats == 2
    words = ["-n", "2", "./heat", "--n", "64", "--block", "16", "--steps", "5"]
    assert r.command.split()[1:] == words


def test_the_env_template_decides_the_threads(heat: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each rank prints how many OpenMP threads it has; the check passes only with 2.
    text = HEAT_TOML.replace(
        'regex = "error=([0-9.eE+-]+)"\nmax_error = 1e-12', 'regex = "threads=2 "'
    )
    wl = load_workload_file(write_heat_toml(heat.parent, "heat2", text))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the user's shell: the template wins
    assert (
        command_env(wl, wl.values(Config(ranks=1, threads=2, tile=16), 64))["OMP_NUM_THREADS"]
        == "2"
    )
    # More threads than the box has CPUs: the program's OpenMP threads wait passively.
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    threads = (os.cpu_count() or 1) + 1
    crowded = command_env(wl, wl.values(Config(ranks=1, threads=threads, tile=16), 64))
    assert crowded["OMP_WAIT_POLICY"] == "PASSIVE"
    two = run(wl, 64, Config(ranks=1, threads=2, tile=64), repeats=1)
    one = run(wl, 64, Config(ranks=1, threads=1, tile=64), repeats=1)
    assert two.status is Status.OK, two.error
    assert one.status is Status.WRONG_ANSWER and not one.check_ok


def test_a_check_command_reads_the_output(heat: Path) -> None:
    text = HEAT_TOML.replace(
        'regex = "error=([0-9.eE+-]+)"\nmax_error = 1e-12',
        "command = \"grep -q 'error=0.000e+00' {{output}}\"",
    )
    good = load_workload_file(write_heat_toml(heat.parent, "heat3", text))
    bad = load_workload_file(
        write_heat_toml(heat.parent, "heat4", text.replace("error=0.000e+00", "error=7"))
    )
    config = Config(ranks=2, threads=1, tile=16)
    assert run(good, 64, config, repeats=1).status is Status.OK
    failed = run(bad, 64, config, repeats=1)
    assert failed.status is Status.WRONG_ANSWER and "exit status 1" in failed.check_detail


def test_run_takes_a_workload_file(
    fresh: Path, heat: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", "--workload-file", str(heat), "--size", "64", "--ranks", "1"]
    assert main([*argv, "--threads", "2", "--repeats", "1"]) == 0
    assert capsys.readouterr().out.startswith(
        "heat size=64 ranks=1 threads=2 tile=16 gpu=False: ok"
    )
    bad = heat.with_name("bad.toml")
    bad.write_text(heat.read_text().replace("[check]", "[checks]"))
    assert main(["run", "--workload-file", str(bad), "--size", "64"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hpc-ds1 run: {bad}: file: unknown section(s) ['checks']"), err
    assert main([*argv, "--workload", "other"]) == 2
    assert "the file declares 'heat'; drop --workload" in capsys.readouterr().err


def test_the_workloads_command_lists_files_and_refusals(
    fresh: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(fresh / "workloads", VALID)
    broken = write(fresh / "workloads", VALID.replace("exit_code = true", ""), "broken.toml")
    assert main(["workloads", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    app = next(w for w in listed["workloads"] if w["name"] == "app")
    assert app["tile"] == {"name": "block", "values": [1, 2, 4], "default": 2}
    assert app["source"].endswith("app.toml") and app["launcher"] == "mpi"
    assert "[check]: give exactly one of" in listed["not_loaded"][str(broken.resolve())]
    assert main(["workloads", "--check", str(broken)]) == 2
    assert "[check]: give exactly one of exit_code | regex | command" in capsys.readouterr().err


def test_threads_that_look_up_while_the_registry_is_first_read_wait_for_all_of_it(
    fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The gateway answers GET /v1/workloads from a thread pool, and the console asks twice at
    # once: a lookup racing the first read must not see a registry half read (it showed no
    # workload). Each registration is slowed so the first reader is mid-read when the others
    # ask.
    slow = registry.register

    def register(workload: Any, *, replace: bool = False) -> Any:
        time.sleep(0.02)
        return slow(workload, replace=replace)

    monkeypatch.setattr(registry, "register", register)
    start = threading.Barrier(4)
    seen: list[list[str]] = []

    def look() -> None:
        start.wait()
        seen.append(list_workloads())

    threads = [threading.Thread(target=look) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    builtins = ["gemm", "montecarlo", "nbody", "stencil"]
    assert len(seen) == 4
    assert all(set(builtins) <= set(names) for names in seen), seen
