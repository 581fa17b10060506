from __future__ import annotations

import sys

import pytest

from hpc_ds1.runner import Status, run
from hpc_ds1.space import Config
from hpc_ds1.workloads import command_workload
from hpc_ds1.workloads.command import CommandOutputError, parse_output

CONFIG = Config(ranks=2, threads=1, tile=1)
PY = sys.executable


def job(name: str, body: str) -> object:
    return command_workload(name, f"{PY} -c {body!r}")


def test_command_template_runtime_is_read_from_its_output() -> None:
    wl = command_workload(
        "test-cmd",
        PY + ' -c \'import sys; print("ranks", sys.argv[1:]); print("runtime_s=0.25")\''
        " {ranks} {threads} {tile} {size}",
    )
    r = run(wl, 7, CONFIG, repeats=2)
    assert r.status is Status.OK
    assert r.runtime_s == 0.25 and r.repeats == 2
    assert r.command.endswith("2 1 1 7")


def test_command_that_reports_a_failed_check_is_a_wrong_answer() -> None:
    wl = job(
        "test-cmd-wrong", "print('runtime_s=1e-3'); print('check=failed'); print('check_error=0.5')"
    )
    r = run(wl, 1, CONFIG, repeats=1)
    assert r.status is Status.WRONG_ANSWER and r.check_error == 0.5


def test_command_that_fails_or_prints_no_time_is_failed() -> None:
    failing = run(job("test-cmd-exit", "import sys; sys.exit('boom')"), 1, CONFIG, repeats=1)
    assert failing.status is Status.FAILED and "exit status 1" in failing.error
    assert "boom" in failing.error
    silent = run(job("test-cmd-silent", "print('done')"), 1, CONFIG, repeats=1)
    assert silent.status is Status.FAILED and "runtime_s=" in silent.error
    missing = run(command_workload("test-cmd-missing", "/nonexistent/tool {ranks}"), 1, CONFIG)
    assert missing.status is Status.FAILED and "cannot start" in missing.error


def test_bad_templates_and_outputs() -> None:
    with pytest.raises(ValueError, match="unknown placeholder"):
        command_workload("x", "run --nodes {nodes}")
    with pytest.raises(ValueError, match="empty"):
        command_workload("x", "  ")
    with pytest.raises(CommandOutputError):
        parse_output("runtime_s=-1")
    assert parse_output("a\nruntime_s=2\nruntime_s=3.5\n")[0] == 3.5
