"""`hpc-ds1 tune`: a tuning session, each step shown live as it runs for real; moves that need an
engineer are asked at the terminal (or left for the console/API with --no-wait)."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import orjson
from pydantic import ValidationError

from ..eventlog.subjects import start_session_subject
from ..events import new_id
from ..infra.home import running_owner
from ..requests import StartSessionRequest
from ..security.approvals import ApprovalError, decide_approval
from ..security.credentials import CredentialError, bearer_for
from ..settings import Settings
from ..stack import open_stack
from . import UsageError
from .common import (
    add_home_argument,
    add_json_argument,
    config_words,
    knob_value,
    load_settings,
    print_json,
    validation_message,
)

Ask = Callable[[dict[str, Any]], Awaitable[tuple[bool, str] | None]]
# How a session ended -> exit status: a failed or interrupted session is a failure (1).
FAILED_ENDINGS = frozenset({"failed", "interrupted"})


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("tune", help="tune a job one change at a time, for real")
    parser.add_argument("--workload", required=True, help="a workload name, e.g. gemm")
    parser.add_argument("--size", required=True, type=int, help="problem size (positive)")
    parser.add_argument(
        "--start",
        help="start configuration, e.g. ranks=1,threads=1,tile=16 (a workload's own knobs too: "
        "ranks=2,threads=1,nb=64,p=1,q=2)",
    )
    parser.add_argument(
        "--no-wait",
        action="store_true",
        help="leave moves that need an engineer for the console/API; print the "
        "session id and return",
    )
    parser.add_argument(
        "--warm",
        nargs="?",
        const="auto",
        choices=("auto", "always"),
        help="start from the fleet's other devices' measurements of the job (same workload, "
        "nearest measured size): the top of their consensus first, then the model. auto (the "
        "default with --warm): where this device has not measured the job at this size; "
        "always: even where it has",
    )
    parser.add_argument(
        "--warm-from",
        metavar="NAME[,NAME…]",
        help="start from these devices (their runs of this workload; the others are left out) "
        "and workloads (their runs on any device: recorded GPUs of the same kernel); implies "
        "--warm",
    )
    parser.add_argument("--server", help="coordinator URL (default: this home's, or embedded)")
    parser.add_argument(
        "--token",
        help="engineer token for --server (default: this home's own, "
        "$HPC_DS1_HOME/credentials/cli.token, when the server is this home's)",
    )
    add_json_argument(parser, "the session (its events and how it finished)")
    add_home_argument(parser)
    parser.set_defaults(handler=handle)


def parse_start(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    start: dict[str, Any] = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        key = key.strip()
        if not key or not value:
            raise UsageError(
                f"--start {text!r}: use key=value pairs of ranks, threads, tile, block, gpu and "
                "the workload's own knobs"
            )
        if key not in ("ranks", "threads", "tile", "block", "gpu"):
            start.setdefault("knobs", {})[key] = knob_value(value)
            continue
        if key == "gpu":
            start[key] = value.strip().lower() in ("1", "true", "yes")
            continue
        try:
            start[key] = int(value)
        except ValueError:
            raise UsageError(f"--start {key}={value!r}: must be a whole number") from None
    return start


def warm_names(text: str | None) -> list[str]:
    if text is None:
        return []
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError(
            f"--warm-from {text!r}: give device ids or workload names, comma-separated"
        )
    return names


def handle(args: argparse.Namespace) -> int:
    settings = load_settings(quiet=True, home=args.home)
    try:
        request = StartSessionRequest.model_validate(
            {
                "workload": args.workload,
                "size": args.size,
                "start": parse_start(args.start),
                "session_id": new_id(),
                "wait_for_engineer": not args.no_wait,
                "warm": args.warm or ("auto" if args.warm_from is not None else "off"),
                "warm_from": warm_names(args.warm_from),
            }
        )
    except ValidationError as error:
        raise UsageError(validation_message(error)) from None
    owner = running_owner(settings.home)
    if args.server:
        try:
            token = bearer_for(settings.home, args.server, args.token)
        except CredentialError as error:
            raise UsageError(str(error)) from None
        return asyncio.run(remote(args.server, token, request, args.no_wait, args.json))
    # The home's model decides every move: without one the session could only fail after its
    # first real run, so say how to get one now (exit 3).
    from ..api import load

    load(settings.home)
    if owner is None:
        print(
            "no coordinator is serving this home: starting the embedded one for this session",
            file=sys.stderr,
        )
    return asyncio.run(local(settings, request, args.no_wait, args.json))


class StepTable:
    """Prints a session's events as table rows (with `as_json`: keeps them for one JSON
    document at the end instead)."""

    def __init__(self, session_id: str | None = None, as_json: bool = False) -> None:
        self.best: float | None = None
        self.as_json = as_json
        self.found: dict[str, Any] = {
            "session_id": session_id,
            "events": [],
            "finished": None,
            "waiting_for_approval": None,
        }
        if not as_json:
            print(
                f"{'step':<5}{'move':<14}{'configuration':<36}{'runtime':>10}  result", flush=True
            )

    def say(self, text: str) -> None:
        """A line for the person (stderr with --json: stdout holds the JSON only)."""
        print(text, file=sys.stderr if self.as_json else sys.stdout, flush=True)

    def waiting(self, approval_id: str, text: str) -> int:
        self.found["waiting_for_approval"] = approval_id
        self.say(text)
        return self.end()

    def end(self) -> int:
        """The exit status (0: finished well or waiting for an engineer; 1: failed), after the
        JSON document when asked for."""
        if self.as_json:
            print_json(self.found)
        finished = self.found["finished"]
        return 1 if finished is not None and finished.get("reason") in FAILED_ENDINGS else 0

    def show(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "heartbeat":  # a step's run still in flight (run.heartbeat): a line, no event
            if not self.as_json:
                from ..runner.inflight import elapsed_words

                config = config_words(data["config"], cpu=False)
                took = elapsed_words(data["elapsed_s"])
                limit = (
                    f"timeout {elapsed_words(data['timeout_s'])}" if data.get("timeout_s") else ""
                )
                print(f"{'':<5}{'… running':<14}{config:<36}{took:>10}  {limit}", flush=True)
            return
        self.found["events"].append({"type": kind, "data": data})
        if kind == "finished":
            self.found["finished"] = data
        if self.as_json:
            return
        if kind == "started" and data.get("warm"):
            warm = data["warm"]
            siblings = ", ".join(
                f"{w['workload']} on {w['device_id']} ({w['runs']} runs, size {w['size']})"
                for w in warm["siblings"]
            )
            print(
                f"warm start ({warm['reason']}) from {siblings}: the top "
                f"{len(warm['plan'])} of their consensus first",
                flush=True,
            )
        elif kind == "step_run":
            config = config_words(data["config"], cpu=False)
            runtime = f"{data['runtime_s']:.4f} s" if data.get("runtime_s") else "-"
            if data["step"] == 0:
                self.best = data.get("runtime_s")
                print(
                    f"{0:<5}{'(start)':<14}{config:<36}{runtime:>10}  {data['status']}", flush=True
                )
            else:
                self._pending = (
                    data["step"],
                    data.get("move") or "",
                    config,
                    runtime,
                    data["status"],
                )
        elif kind == "move_resolved":
            step, move, config, runtime, status = getattr(
                self, "_pending", (data["step"], data["move"], "", "-", "?")
            )
            before = data.get("best_runtime_s")
            change = (
                f" {100 * (data['runtime_s'] / before - 1):+.1f}%"
                if before and data.get("runtime_s")
                else ""
            )
            verdict = (
                "kept" if data["kept"] else f"reverted ({status})" if status != "ok" else "reverted"
            )
            print(f"{step:<5}{move:<14}{config:<36}{runtime:>10}  {verdict}{change}", flush=True)
        elif kind == "move_decided":
            print(
                f"{'':<5}{'→ ' + data['move']:<14}{'':<36}{'':>10}  "
                f"{data['mode']} {data['confidence']:.2f}",
                flush=True,
            )
        elif kind == "finished":
            speedup = f"{data['speedup']:.2f}x" if data.get("speedup") else "-"
            best = config_words(data.get("best_config") or {})
            runtime = f"{data['best_runtime_s']:.4f} s" if data.get("best_runtime_s") else "-"
            print(
                f"finished ({data['reason']}): {data.get('detail', '')}\n"
                f"best {best} · {runtime} · speed-up {speedup} over the start · "
                f"{data['real_runs']} real runs",
                flush=True,
            )


async def ask_at_terminal(approval: dict[str, Any]) -> tuple[bool, str] | None:
    reasons = "; ".join(approval.get("reasons") or []) or "confidence below auto"
    prompt = (
        f"\n{approval['move']} from {approval['config']} needs an engineer "
        f"({approval['mode']}, confidence {approval['confidence']:.2f}: {reasons}).\n"
        f"approve? [y/n] "
    )

    def ask(text: str) -> str:
        # Questions on stderr: stdout holds only the results (the JSON with --json).
        print(text, end="", file=sys.stderr, flush=True)
        return input()

    try:
        answer = (await asyncio.to_thread(ask, prompt)).strip().lower()
        note = (await asyncio.to_thread(ask, "note (optional): ")).strip()
    except EOFError:  # no terminal to ask: the move stays waiting for the console/API
        print("\nno answer from the terminal", file=sys.stderr)
        return None
    return answer in ("y", "yes"), note


async def local(
    settings: Settings, request: StartSessionRequest, no_wait: bool, as_json: bool = False
) -> int:
    user = getpass.getuser()
    services = ("projector", "agent", "decision", "coordinator")
    async with open_stack(settings, services, "cli-tune") as stack:
        await stack.local_device()
        inbox: asyncio.Queue[tuple[str, str, dict[str, Any]]] = asyncio.Queue()
        prefix = settings.subject_prefix

        async def collect(msg: Any) -> None:
            env = orjson.loads(msg.data)
            inbox.put_nowait((env["type"], msg.subject, env["data"]))

        subs = [
            await stack.bus.nc.subscribe(f"{prefix}.session.{request.session_id}.*", cb=collect),
            await stack.bus.nc.subscribe(f"{prefix}.approval.*.requested", cb=collect),
            # its steps' runs in flight past HPC_DS1_RUN_HEARTBEAT_S (the agent's heartbeats)
            await stack.bus.nc.subscribe(
                f"{prefix}.run.{request.session_id}.heartbeat", cb=collect
            ),
        ]
        reply = orjson.loads(
            (
                await stack.bus.nc.request(
                    start_session_subject(settings),
                    request.model_dump_json().encode(),
                    timeout=30,
                    headers={"Hpc-Actor": user},
                )
            ).data
        )
        if not reply.get("ok"):
            raise UsageError(str(reply.get("error")))
        table = StepTable(request.session_id, as_json)
        table.say(
            f"session {request.session_id} · {request.workload} {request.size} on device "
            f"{reply['device_id']}"
        )
        while True:
            kind, _, data = await inbox.get()
            if kind == "approval.requested":
                if data["session_id"] != request.session_id:
                    continue
                if no_wait:
                    resumes = (
                        ""
                        if stack.attached
                        else "\nthe session resumes when `hpc-ds1 serve` runs for this home"
                    )
                    return table.waiting(
                        data["approval_id"],
                        f"waiting for an engineer: approval {data['approval_id']} "
                        f"({data['move']}, {data['confidence']:.2f}); decide it in the console "
                        f"or POST /v1/approvals/{data['approval_id']}{resumes}",
                    )
                verdict = await ask_at_terminal(data)
                if verdict is None:
                    return table.waiting(
                        data["approval_id"],
                        f"approval {data['approval_id']} waits for an engineer "
                        f"(POST /v1/approvals/{data['approval_id']})",
                    )
                if verdict is not None:
                    try:
                        await decide_approval(
                            stack.bus, data["approval_id"], verdict[0], user, "engineer", verdict[1]
                        )
                    except ApprovalError as error:
                        print(f"not recorded: {error}")
                continue
            table.show(kind.split(".", 1)[1], data)
            if kind == "session.finished":
                for sub in subs:
                    await sub.unsubscribe()
                return table.end()


async def remote(
    server: str,
    token: str | None,
    request: StartSessionRequest,
    no_wait: bool,
    as_json: bool = False,
) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    base = server.rstrip("/")
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as http:
        started = await http.post(
            "/v1/sessions",
            content=request.model_dump_json(),
            headers={"Content-Type": "application/json"},
        )
        if started.status_code != 201:
            raise UsageError(f"{base} answered {started.status_code}: {started.text}")
        table = StepTable(request.session_id, as_json)
        table.say(f"session {request.session_id} on {base}")
        seen = 0
        asked: set[str] = set()
        while True:
            body = (await http.get(f"/v1/sessions/{request.session_id}")).json()
            for event in body.get("events", []):
                if event["seq"] <= seen:
                    continue
                seen = event["seq"]
                table.show(event["type"].split(".", 1)[1], event["data"])
                if event["type"] == "session.finished":
                    return table.end()
            waiting = (await http.get("/v1/approvals")).json().get("approvals", [])
            for approval in waiting:
                if approval["session_id"] != request.session_id or approval["approval_id"] in asked:
                    continue
                asked.add(approval["approval_id"])
                if no_wait:
                    return table.waiting(
                        approval["approval_id"],
                        f"waiting for an engineer: approval {approval['approval_id']}",
                    )
                verdict = await ask_at_terminal(approval)
                if verdict is not None:
                    await http.post(
                        f"/v1/approvals/{approval['approval_id']}",
                        json={
                            "decision": "approve" if verdict[0] else "reject",
                            "note": verdict[1],
                        },
                    )
            await asyncio.sleep(1.0)
