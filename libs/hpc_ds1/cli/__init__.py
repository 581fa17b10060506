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
    "cancel",
    "token",
    "audit",
    "evaluate",
    "backup",
    "archive",
    "devices",
    "agent",
    "submit",
    "recommend",
    "status",
    "modelinfo",
    "workloads",
    "observe",
)


# Exit statuses of every command, defined here once (and listed in `hpc-ds1 --help`).
EXIT_OK = 0
EXIT_FAILURE = 1  # the command ran and what it did failed: a failed run, session or check
EXIT_USAGE = 2  # bad input: an unknown option or value (argparse exits 2 as well)
EXIT_PRECONDITION = 3  # something the command needs is missing: no model, no server
EXIT_INTERRUPTED = 130

EXIT_CODES_TEXT = (
    "exit status: 0 ok; 1 failure (a failed run, session or check); 2 usage error (bad "
    "option or value); 3 missing precondition (no model yet: run `hpc-ds1 setup --quick`; no "
    "server; unreachable server); 130 interrupted."
)


class UsageError(Exception):
    """Bad input from the user: printed as one clear line, exit status 2."""


class PreconditionError(Exception):
    """Something the command needs is not there (a model, a server): printed as one clear line
    saying how to get it, exit status 3."""


class CommandFailed(Exception):
    """The command ran and what it did failed: printed as one line, exit status 1."""


def build_parser() -> argparse.ArgumentParser:
    from hpc_ds1.version import __version__

    parser = argparse.ArgumentParser(
        prog="hpc-ds1",
        description="HPC-DS1: learn this machine, tune jobs one change at a time, audit every "
        "decision. Start with `hpc-ds1 status`.",
        epilog=EXIT_CODES_TEXT,
    )
    parser.add_argument(
        "--version", action="version", version=f"hpc-ds1 {__version__}", help="print the version"
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
    from hpc_ds1.api import NoModelError
    from hpc_ds1.eventlog.bus import MissingStream
    from hpc_ds1.infra.home import OwnerMismatch

    try:
        result = args.handler(args)
    except (UsageError, OwnerMismatch) as error:
        print(f"hpc-ds1 {args.command}: {error}", file=sys.stderr)
        return EXIT_USAGE
    except (PreconditionError, NoModelError, MissingStream) as error:
        print(f"hpc-ds1 {args.command}: {error}", file=sys.stderr)
        return EXIT_PRECONDITION
    except CommandFailed as error:
        print(f"hpc-ds1 {args.command}: {error}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`hpc-ds1 token join | head -1`): not an error of ours.
        sys.stderr.close()
        return EXIT_OK
    return int(result or 0)
