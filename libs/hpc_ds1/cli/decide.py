"""`hpc-ds1 decide`: the model's next move for a job, through the decision service."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
from typing import Any

import httpx
import orjson
from pydantic import ValidationError

from ..eventlog.idempotency import HEADER, ID_HEADER, KEY_RULE, InvalidKey, derived_id, parse_key
from ..eventlog.subjects import decide_subject
from ..infra.home import running_owner
from ..requests import DecideBody, DecideRequest
from ..security.credentials import CredentialError, bearer_for
from ..settings import Settings
from ..stack import open_stack
from . import PreconditionError, UsageError
from .common import (
    add_home_argument,
    config_words,
    knob_assignments,
    load_settings,
    validation_message,
)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("decide", help="the next move for a job, with its confidence")
    parser.add_argument("--workload", required=True, help="a workload name, e.g. gemm")
    parser.add_argument("--size", required=True, type=int, help="problem size (positive)")
    parser.add_argument("--ranks", required=True, type=int, help="MPI ranks the job runs with now")
    parser.add_argument(
        "--threads", required=True, type=int, help="threads per rank the job runs with now"
    )
    parser.add_argument("--tile", type=int, help="default: the workload's default tile")
    parser.add_argument(
        "--block",
        type=int,
        default=None,
        help="the kernel's second block, where it has one (default: the workload's)",
    )
    parser.add_argument("--gpu", action="store_true", help="the job runs on the GPU now")
    parser.add_argument(
        "--knob",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a knob of the workload's own and its value now (repeat for each, e.g. --knob nb=64)",
    )
    parser.add_argument("--runtime-s", type=float, help="observed runtime: decide without running")
    parser.add_argument("--throughput", type=float, help="observed GFLOP/s or GB/s")
    parser.add_argument("--server", help="coordinator URL (default: the one serving this home)")
    parser.add_argument(
        "--token",
        help="bearer token for --server (default: this home's own, "
        "$HPC_DS1_HOME/credentials/cli.token, when the server is this home's)",
    )
    parser.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="run the command again with the same KEY after a timeout or a 503 and the first "
        f"decision is answered, not a second one made ({KEY_RULE})",
    )
    parser.add_argument("--json", action="store_true", help="print the decision as JSON")
    add_home_argument(parser)
    parser.set_defaults(handler=handle)


def build_request(args: argparse.Namespace) -> DecideRequest:
    body: dict[str, Any] = {
        "workload": args.workload,
        "size": args.size,
        "config": {"ranks": args.ranks, "threads": args.threads, "gpu": args.gpu},
        "source": "cli",
    }
    if args.tile is not None:
        body["config"]["tile"] = args.tile
    if args.block is not None:
        body["config"]["block"] = args.block
    if args.knob:
        body["config"]["knobs"] = knob_assignments(args.knob, "--knob")
    if args.runtime_s is not None or args.throughput is not None:
        body["telemetry"] = {"runtime_s": args.runtime_s, "throughput": args.throughput}
    try:
        return DecideRequest.model_validate(body)
    except ValidationError as error:
        raise UsageError(validation_message(error)) from None


def handle(args: argparse.Namespace) -> int:
    settings = load_settings(quiet=True, home=args.home)
    request = build_request(args)
    key = None
    if args.idempotency_key is not None:
        try:
            key = parse_key(args.idempotency_key)
        except InvalidKey as error:
            raise UsageError(f"--idempotency-key: {error}") from None
    owner = running_owner(settings.home)
    server = args.server or (owner.gateway_url if owner else None)
    if server:
        try:
            token = bearer_for(settings.home, server, args.token)
        except CredentialError as error:
            raise UsageError(str(error)) from None
        decision = over_http(server, request, token, key)
    else:
        decision = asyncio.run(over_local_stack(settings, request, key))
    print(json.dumps(decision, indent=2) if args.json else render(decision))
    return 0


def over_http(
    server: str, request: DecideRequest, token: str | None, key: str | None = None
) -> dict[str, Any]:
    """POST /v1/decide: the job only (the server sets who asks from the token)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if key is not None:
        headers[HEADER] = key
    job = DecideBody(
        workload=request.workload,
        size=request.size,
        config=request.config,
        telemetry=request.telemetry,
    )
    try:
        reply = httpx.post(
            f"{server.rstrip('/')}/v1/decide",
            content=job.model_dump_json(),
            headers={"Content-Type": "application/json", **headers},
            timeout=900,
        )
    except httpx.HTTPError as error:
        raise PreconditionError(f"cannot reach {server}: {error}") from None
    if reply.status_code != 200:
        hint = ""
        if reply.status_code == 401 and not token:
            hint = (
                " (give --token; this home's own server reads $HPC_DS1_HOME/credentials/cli.token)"
            )
        raise UsageError(f"{server} answered {reply.status_code}: {reply.text}{hint}")
    body: dict[str, Any] = reply.json()
    return body


async def over_local_stack(
    settings: Settings, request: DecideRequest, key: str | None = None
) -> dict[str, Any]:
    actor = getpass.getuser()
    headers = {"Hpc-Actor": actor}
    if key is not None:  # the local user stands for the token
        headers[ID_HEADER] = derived_id(f"local:{actor}", "POST /v1/decide", key)
    async with open_stack(settings, ("projector", "agent", "decision"), "cli-decide") as stack:
        await stack.local_device()
        reply = await stack.bus.nc.request(
            decide_subject(settings),
            request.model_dump_json().encode(),
            timeout=900,
            headers=headers,
        )
    answer: dict[str, Any] = orjson.loads(reply.data)
    if not answer.get("ok"):
        raise UsageError(str(answer.get("error")))
    decision: dict[str, Any] = answer["decision"]
    return decision


def render(d: dict[str, Any]) -> str:
    config = config_words(d["config"])
    observed = d.get("telemetry") or {}
    how = "ran for real" if d.get("ran") else "telemetry given"
    runtime = f": {observed['runtime_s']:.4g} s" if observed.get("runtime_s") else ""
    lines = [
        f"{d['workload']} {d['size']} · {config} · {how}{runtime}",
        f"choice      {d['choice']}",
        f"confidence  {d['confidence']:.2f}",
        f"mode        {d['mode']}",
    ]
    reasons = d.get("reasons") or []
    lines += [f"reasons     {'; '.join(reasons) if reasons else '-'}"]
    top = sorted(d.get("alternatives", {}).items(), key=lambda kv: -kv[1])[:4]
    lines += [f"others      {', '.join(f'{m} {p:.2f}' for m, p in top)}"]
    lines += [f"model       {d.get('model_version')} · decision {d['decision_id']}"]
    return "\n".join(lines)
