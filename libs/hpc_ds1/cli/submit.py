"""`hpc-ds1 submit --workload W --size N`: send a task to the coordinator, which places it on
the device expected to finish it first; waits for the result unless --no-wait."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..eventlog.idempotency import KEY_RULE, InvalidKey, parse_key
from ..infra.home import running_owner
from ..security.credentials import CredentialError, bearer_for
from . import PreconditionError, UsageError
from .common import add_home_argument, load_settings


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "submit", help="run a job on the fleet: the device expected to finish it first runs it"
    )
    parser.add_argument("--workload", required=True, help="a workload name, e.g. gemm")
    parser.add_argument("--size", required=True, type=int, help="problem size (positive)")
    parser.add_argument("--server", help="coordinator URL (default: the one serving this home)")
    parser.add_argument(
        "--token",
        help="engineer token for --server (default: this home's own, "
        "$HPC_DS1_HOME/credentials/cli.token, when the server is this home's)",
    )
    parser.add_argument(
        "--ca-cert-hash",
        metavar="sha256:HEX",
        help="an https --server's CA pin (the join command's); default: the pin this home's "
        "device credential keeps for that server, else the system trust store",
    )
    parser.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="run the command again with the same KEY after a timeout and the first task is "
        f"answered, not a second one submitted ({KEY_RULE})",
    )
    parser.add_argument("--no-wait", action="store_true", help="print the task and return")
    parser.add_argument("--json", action="store_true", help="print the task as JSON")
    parser.add_argument("--timeout", type=float, help="give up waiting after S seconds")
    add_home_argument(parser)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from ..fleet.client import FleetClient, FleetError, resolve_trust
    from ..fleet.submission import wait_for

    if args.size <= 0:
        raise UsageError(f"--size must be a positive integer, not {args.size}")
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError(f"--timeout must be positive seconds, not {args.timeout:g}")
    key = None
    if args.idempotency_key is not None:
        try:
            key = parse_key(args.idempotency_key)
        except InvalidKey as error:
            raise UsageError(f"--idempotency-key: {error}") from None
    settings = load_settings(quiet=True, home=args.home)
    owner = running_owner(settings.home)
    server = args.server or (owner.gateway_url if owner else None)
    if not server:
        raise PreconditionError(
            "no coordinator: give --server (no `hpc-ds1 serve` runs for this home)"
        )
    try:
        token = bearer_for(settings.home, server, args.token)
    except CredentialError as error:
        raise UsageError(str(error)) from None
    try:
        trust = resolve_trust(server, args.ca_cert_hash, settings.home)
        with FleetClient(server, token, trust=trust) as client:
            task = client.submit(args.workload, args.size, key)
            if not args.json:
                print(f"task {task['task_id']} submitted", flush=True)
            if not args.no_wait:
                task = wait_for(client, task, timeout=args.timeout, poll_s=0.5)
    except ValueError as error:  # a server that is not a URL, a pin that is not one
        raise UsageError(str(error)) from None
    except FleetError as error:
        hint = ""
        if error.status == 401 and not token:
            hint = " (give --token; this home's own server reads its credentials/cli.token)"
        print(f"hpc-ds1 submit: {error}{hint}", file=sys.stderr)
        return 1
    except TimeoutError as error:
        print(f"hpc-ds1 submit: {error}", file=sys.stderr)
        return 1
    print(json.dumps(task, indent=2, default=str) if args.json else render(task))
    return 1 if task.get("status") == "failed" else 0


def seconds(value: float | None) -> str:
    """4.31 s, 0.00225 s, 812.4 s."""
    if value is None:
        return "? s"
    return f"{value:.3g} s" if abs(value) < 100 else f"{value:.1f} s"


def config_text(config: dict[str, Any] | None) -> str:
    if not config:
        return "-"
    parts = [f"ranks={config.get('ranks')}", f"threads={config.get('threads')}"]
    parts += [f"{k}={v}" for k, v in (config.get("knobs") or {}).items()]
    if config.get("gpu"):
        parts.append("gpu")
    return " ".join(parts)


def render(task: dict[str, Any]) -> str:
    """The placement reason, then the outcome (or where the task stands)."""
    lines = []
    placement = task.get("placement") or {}
    if placement.get("reason"):
        lines.append(f"placed: {placement['reason']}")
    status = task.get("status")
    result = task.get("result") or {}
    if status == "finished" and result:
        expected = result.get("expected_s") or placement.get("expected_s")
        if placement.get("basis") == "none":
            expected = None  # placed without any estimate: 0 s would be a made-up figure
        runtime = result.get("runtime_s")
        lines.append(
            f"finished on {result.get('device_id')} in {seconds(runtime)}"
            + (f" (expected {seconds(expected)}, " if expected is not None else " (no estimate, ")
            + f"{config_text(result.get('config'))})"
        )
    elif status == "failed":
        reasons = task.get("failures") or []
        lines.append("failed: " + ("; ".join(reasons) if reasons else "no reason given"))
    else:
        why = task.get("waiting_for")
        lines.append(f"status: {status}" + (f" ({why})" if why else ""))
    if task.get("failures") and status == "finished":
        lines.append("earlier attempts: " + "; ".join(task["failures"]))
    return "\n".join(lines)
