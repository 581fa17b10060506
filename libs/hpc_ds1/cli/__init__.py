"""The `hpc-ds1` command. Each sub-command lives in its own module with a `register(subparsers)`."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Modules under hpc_ds1.cli that add sub-commands; each exposes register(subparsers).
COMMAND_MODULES: tuple[str, ...] = (
    "serve",
    "service",
    "db",
    "projection",
    "run",
    "setup",
    "decide",
    "tune",
    "token",
    "audit",
    "evaluate",
    "backup",
    "devices",
    "agent",
    "submit",
)


class UsageError(Exception):
    """Bad input from the user: printed as one clear line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hpc-ds1",
        description="HPC-DS1: learn this machine, tune jobs one change at a time, audit every "
        "decision.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"hpc_ds1.cli.{name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.handler(args)
    except UsageError as error:
        print(f"hpc-ds1 {args.command}: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`hpc-ds1 token join | head -1`): not an error of ours.
        sys.stderr.close()
        return 0
    return int(result or 0)
