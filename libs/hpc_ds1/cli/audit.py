"""`hpc-ds1 audit verify`: whether the audit file's hash chain is intact, and where it breaks."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..audit import verify
from .common import add_home_argument, load_settings


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("audit", help="check the tamper-evident audit file")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    check = actions.add_parser("verify", help="check every line's hash chain")
    check.add_argument("--file", type=Path, help="default: $HPC_DS1_HOME/audit.jsonl")
    add_home_argument(check)
    check.set_defaults(handler=handle_verify)


def handle_verify(args: argparse.Namespace) -> int:
    path: Path = args.file if args.file is not None else load_settings(home=args.home).audit_path
    verdict = verify(path)
    if verdict.intact:
        print(f"intact: {verdict.lines} lines ({path})")
        return 0
    if verdict.broken_at is None:
        print(f"not verified: {verdict.problem}")
    else:
        print(f"broken at line {verdict.broken_at}: {verdict.problem} ({path})")
    return 1
