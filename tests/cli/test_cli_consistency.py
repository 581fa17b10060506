"""The CLI as one tool: help on every option of every command, --version, --json on every
command that prints results, the exit statuses (2 usage, 3 missing precondition, 1 failure),
and `status` / `model show` on an empty home and on a home with a real model."""

from __future__ import annotations

import argparse
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpc_ds1 import __version__
from hpc_ds1.cli import EXIT_FAILURE, EXIT_PRECONDITION, EXIT_USAGE, build_parser, main
from hpc_ds1.machine.hardware import Fingerprint
from hpc_ds1.model import Model, TrainedModel
from hpc_ds1.models_store import save_local
from hpc_ds1.settings import Settings
from tests.support.commands import HPC_DS1, cli_env

# Long-running processes print a banner and their logs, not a result.
DAEMONS = frozenset({"serve", "service", "agent"})

BROKEN_TOML = """\
[workload]
name = "broken"
description = "always fails: exits 3"
command = "sh -c 'exit 3' {ranks}"
launcher = "none"
sizes = [8, 16]

[check]
exit_code = true
"""


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every (sub-)command's parser, by its words."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
    ]


def leaves() -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Commands that do something of their own (a parser's handler, not only sub-commands)."""
    return [(p, sub) for p, sub in commands(build_parser()) if sub.get_default("handler")]


def test_every_option_of_every_command_has_help() -> None:
    missing = [
        f"hpc-ds1 {' '.join(path)} {'/'.join(a.option_strings) or a.dest}"
        for path, parser in commands(build_parser())
        for a in options(parser)
        if not (a.help and a.help.strip())
    ]
    assert missing == []
    assert len(leaves()) >= 20  # the walk reached the sub-commands


def test_every_command_that_prints_results_takes_json() -> None:
    without = [
        " ".join(path)
        for path, parser in leaves()
        if path[0] not in DAEMONS
        and "--json" not in {o for a in options(parser) for o in a.option_strings}
    ]
    assert without == []


def test_version_and_the_exit_statuses_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    done = subprocess.run([HPC_DS1, "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == f"hpc-ds1 {__version__}"
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for said in ("0 ok", "1 failure", "2 usage error", "3 missing precondition"):
        assert said in text


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["recommend", "--workload", "gemm", "--size", "many"])
    assert exited.value.code == EXIT_USAGE
    assert "invalid int value" in capsys.readouterr().err
    home = str(tmp_path / "home")
    assert main(["setup", "--home", home, "--sizes", "1,x"]) == EXIT_USAGE
    assert "--sizes '1,x'" in capsys.readouterr().err
    assert main(["tune", "--home", home, "--workload", "gemm", "--size", "0"]) == EXIT_USAGE


def test_no_model_exits_3_with_the_next_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = str(tmp_path / "empty")
    for argv in (
        ["recommend", "--workload", "gemm", "--size", "64"],
        ["tune", "--workload", "gemm", "--size", "64"],
        ["model", "show"],
    ):
        assert main([*argv, "--home", home]) == EXIT_PRECONDITION, argv
        assert "hpc-ds1 setup --quick" in capsys.readouterr().err, argv
    assert not (tmp_path / "empty" / "owner.json").exists()  # nothing was started
    assert main(["model", "show", "--home", home, "--json"]) == EXIT_PRECONDITION
    shown = json.loads(capsys.readouterr().out)
    assert shown["model"] is None and "hpc-ds1 setup --quick" in shown["missing"]


def test_status_of_an_empty_home(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "empty"
    assert main(["status", "--home", str(home)]) == 0
    text = capsys.readouterr().out
    assert "model    none yet" in text and "server   not running" in text
    assert "next     run `hpc-ds1 setup --quick`" in text
    assert main(["status", "--home", str(home), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["home"] == str(home) and found["home_exists"] is False
    assert found["model"] is None and found["server"] is None
    assert "hpc-ds1 setup --quick" in found["next_step"]


def test_status_and_model_show_with_a_model(
    tmp_path: Path, trained: TrainedModel, fp: Fingerprint, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    data = trained.to_onnx()
    model = Model.from_onnx(data)
    save_local(home / "models", model.version, fp.device_id, data)

    assert main(["status", "--home", str(home), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["model"]["version"] == model.version
    assert found["model"]["this_machine"] is True
    assert found["model"]["workloads"] == {w: model.sizes[w] for w in sorted(model.workloads)}
    assert found["server"] is None
    assert "hpc-ds1 recommend --workload" in found["next_step"]

    assert main(["model", "show", "--home", str(home), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["model"]
    assert shown["version"] == model.version and shown["device_id"] == fp.device_id
    assert shown["trained_at"] == model.trained_at and shown["this_machine"] is True
    assert set(shown["workloads"]) == set(model.workloads)
    assert shown["workloads"]["gemm"]["sizes"] == model.sizes["gemm"]
    assert shown["metrics"] == model.metrics
    assert main(["model", "show", "--home", str(home)]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"model {model.version}") and "machine   this one" in text
    assert "gemm" in text


def test_a_failed_session_exits_1(
    settings: Settings, trained: TrainedModel, fp: Fingerprint
) -> None:
    """A session whose start configuration fails ends 'failed': the command says so and exits 1
    (it exited 0)."""
    data = trained.to_onnx()
    save_local(settings.models_dir, Model.from_onnx(data).version, fp.device_id, data)
    folder = settings.home / "workloads"
    folder.mkdir(parents=True)
    (folder / "broken.toml").write_text(BROKEN_TOML)
    done = subprocess.run(
        [HPC_DS1, "tune", "--workload", "broken", "--size", "8", "--no-wait", "--json"],
        env=cli_env(settings),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == EXIT_FAILURE, done.stdout + done.stderr
    session = json.loads(done.stdout)
    assert session["finished"]["reason"] == "failed"
    assert "exit status 3" in session["finished"]["detail"]
    assert [e["type"] for e in session["events"]][-1] == "finished"
