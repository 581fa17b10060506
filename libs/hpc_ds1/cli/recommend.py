"""`hpc-ds1 recommend`: the configuration to submit a job with (System 1), for a person, a
program (--format json), a job script (--format env, for eval) or a Slurm header (--format
slurm). Answered from this home's model file on this machine, with nothing running and no
server needed; `--server` asks a coordinator's POST /v1/recommend instead."""

from __future__ import annotations

import argparse
from typing import Any

import httpx

from . import PreconditionError, UsageError
from .common import add_home_argument, load_settings, print_json

FORMATS = ("text", "json", "env", "slurm")
TIMEOUT_S = 60.0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "recommend",
        help="the configuration to submit a job with, before anything runs",
        description="The model's whole configuration for a job (ranks, threads, tile, GPU), "
        "its expected runtime, the confidence that it is the fastest, the mode (auto, confirm, "
        'escalate) and the reasons it is not auto. In a job script: eval "$(hpc-ds1 recommend '
        '--workload gemm --size 2048 --format env)"; then srun -n "$HPC_DS1_RANKS" ...',
    )
    parser.add_argument("--workload", required=True, help="a workload name, e.g. gemm")
    parser.add_argument("--size", required=True, type=int, help="problem size (positive)")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="text",
        help="text (default): one line; json: the whole answer; env: `export` lines for eval "
        "(HPC_DS1_RANKS, HPC_DS1_THREADS, OMP_NUM_THREADS, HPC_DS1_TILE, HPC_DS1_GPU, ...); "
        "slurm: #SBATCH lines",
    )
    parser.add_argument("--json", action="store_true", help="the same as --format json")
    parser.add_argument(
        "--server", help="ask this coordinator (POST /v1/recommend) instead of the home's model"
    )
    parser.add_argument(
        "--token",
        help="bearer token for --server (default: this home's own, "
        "$HPC_DS1_HOME/credentials/cli.token, when the server is this home's)",
    )
    add_home_argument(parser)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from ..recommendation import as_env, as_slurm, as_text

    settings = load_settings(quiet=True, home=args.home)
    if args.server:
        rec = over_http(settings.home, args.server, args.token, args.workload, args.size)
    else:
        rec = from_home(settings, args.workload, args.size)
    chosen = "json" if args.json else args.format
    if chosen == "json":
        print_json(rec)
    elif chosen == "env":
        print(as_env(rec))
    elif chosen == "slurm":
        print(as_slurm(rec))
    else:
        print(as_text(rec))
    return 0


def from_home(settings: Any, workload: str, size: int) -> dict[str, Any]:
    """From the home's model, with this machine's hardware for the guard."""
    from ..api import load
    from ..machine.hardware import fingerprint
    from ..model import Thresholds
    from ..recommendation import RecommendError, recommend

    model = load(settings.home)  # NoModelError: exit 3 with how to get one
    thresholds = Thresholds(auto=settings.auto_threshold, escalate=settings.escalate_threshold)
    try:
        return recommend(model, workload, size, fingerprint=fingerprint(), thresholds=thresholds)
    except RecommendError as error:
        raise UsageError(str(error)) from None


def over_http(
    home: Any, server: str, token: str | None, workload: str, size: int
) -> dict[str, Any]:
    from ..security.credentials import CredentialError, bearer_for

    try:
        bearer = bearer_for(home, server, token)
    except CredentialError as error:
        raise UsageError(str(error)) from None
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    try:
        reply = httpx.post(
            f"{server.rstrip('/')}/v1/recommend",
            json={"workload": workload, "size": size},
            headers=headers,
            timeout=TIMEOUT_S,
        )
    except httpx.HTTPError as error:
        raise PreconditionError(f"cannot reach {server}: {error}") from None
    try:
        body: Any = reply.json()
    except ValueError:
        body = {"error": reply.text}
    if reply.status_code == 200:
        found: dict[str, Any] = body
        return found
    why = body.get("error", reply.text) if isinstance(body, dict) else reply.text
    message = f"{server} answered {reply.status_code}: {why}"
    if reply.status_code in (409, 503):  # no model or no device yet; a service not running
        raise PreconditionError(message)
    raise UsageError(message)
