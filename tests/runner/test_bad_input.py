from __future__ import annotations

import argparse
import json

import pytest

from hpc_ds1.cli import UsageError
from hpc_ds1.cli import run as run_cli
from hpc_ds1.runner import InvalidJob, Job, run, run_many
from hpc_ds1.space import Config

C = Config(ranks=1, threads=1, tile=64)


@pytest.mark.parametrize(
    ("workload", "size", "config", "message"),
    [
        ("nosuch", 10, C, r"unknown workload 'nosuch'; known workloads: gemm, montecarlo"),
        ("gemm", 0, C, r"size must be a positive integer, not 0"),
        ("gemm", -5, C, r"size must be a positive integer"),
        ("gemm", "ten", C, r"size must be a positive integer, not 'ten'"),
        ("gemm", 2.5, C, r"size must be a positive integer"),
        ("gemm", 10**6, C, r"needs about .* GiB; only .* GiB is available"),
        ("gemm", 100, Config(ranks=3, threads=1, tile=64), r"ranks=3 is not accepted"),
        ("gemm", 100, Config(ranks=1, threads=64, tile=64), r"threads=64 is not accepted"),
        ("gemm", 100, Config(ranks=1, threads=1, tile=5), r"tile=5 is not accepted"),
        ("gemm", 100, Config(ranks=1, threads=1, tile=64, gpu=True), r"no CUDA GPU"),
        ("stencil", 4, Config(ranks=4, threads=1, tile=8), r"too small for 4 ranks"),
    ],
)
def test_bad_input_is_refused_before_launch(
    workload: str, size: object, config: Config, message: str
) -> None:
    with pytest.raises(InvalidJob, match=message):
        run(workload, size, config)  # type: ignore[arg-type]


def test_run_many_refuses_the_whole_batch_up_front() -> None:
    with pytest.raises(InvalidJob, match="repeats"):
        run_many([Job(workload="gemm", size=10, config=C, repeats=0)])


def _cli(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    run_cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["run", *argv])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workload", "nosuch", "--size", "1"], "known workloads"),
        (["--workload", "gemm", "--size", "0"], "positive integer"),
        (["--workload", "gemm", "--size", "1e3"], "positive integer"),
        (["--workload", "gemm", "--size", "8", "--ranks", "3"], "ranks must be one of"),
        (["--workload", "gemm", "--size", "8", "--ranks", "0"], "ranks"),
        (["--workload", "gemm", "--size", "8", "--tile", "7"], "tile must be one of"),
        (["--workload", "gemm", "--size", "99999999"], "GiB"),
        (["--workload", "c", "--size", "1", "--command", "x {bogus}"], "unknown placeholder"),
    ],
)
def test_cli_bad_input_is_a_usage_error(argv: list[str], message: str) -> None:
    args = _cli(*argv)
    with pytest.raises(UsageError, match=message):
        args.handler(args)


def test_cli_prints_a_result(capsys: pytest.CaptureFixture[str]) -> None:
    args = _cli("--workload", "gemm", "--size", "64", "--ranks", "2", "--threads", "1", "--json")
    assert args.handler(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["status"] == "ok" and data["config"]["ranks"] == 2 and data["check_ok"] is True
    args = _cli("--workload", "nbody", "--size", "64", "--repeats", "1")
    assert args.handler(args) == 0
    text = capsys.readouterr().out
    assert "nbody size=64" in text and "check passed" in text and "command:" in text
