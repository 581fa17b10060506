"""`hpc-ds1 devices`: the fleet's devices (status, hardware, measured kernels, model, work), and
`devices drain ID [--undo]` / `devices revoke ID` (admin). Talks HTTP to this home's running
gateway with the home's CLI token, or to `--server URL --token T`."""

from __future__ import annotations

import argparse
import json
from typing import Any

import httpx

from ..infra.home import running_owner
from ..requests import SAFE_ID, SAFE_ID_RULE
from ..security.credentials import CredentialError, bearer_for
from . import PreconditionError, UsageError
from .common import add_json_argument, emit, load_settings

TIMEOUT_S = 30.0


def _connection_arguments(parser: argparse.ArgumentParser, *, top: bool) -> None:
    # Given before or after the action; a sub-command's default must not hide the top one's.
    default: Any = None if top else argparse.SUPPRESS
    parser.add_argument(
        "--server", default=default, help="gateway URL (default: this home's running server)"
    )
    parser.add_argument(
        "--token", default=default, help="bearer token (default: this home's CLI token)"
    )
    parser.add_argument(
        "--home", default=default, help="data folder (default $HPC_DS1_HOME or ~/.hpc_ds1)"
    )


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "devices", help="the fleet's devices; drain or revoke one (admin)"
    )
    parser.add_argument("--json", action="store_true", help="print the devices as JSON")
    _connection_arguments(parser, top=True)
    parser.set_defaults(handler=handle_list)
    actions = parser.add_subparsers(dest="action", metavar="ACTION")

    drain = actions.add_parser("drain", help="send no new tasks to a device (--undo: resume)")
    drain.add_argument("device_id", metavar="ID", help="the device's id (`hpc-ds1 devices`)")
    drain.add_argument("--undo", action="store_true", help="take new tasks again")
    add_json_argument(drain, "the device")
    _connection_arguments(drain, top=False)
    drain.set_defaults(handler=handle_drain)

    revoke = actions.add_parser(
        "revoke", help="revoke a device's credentials; it leaves the fleet, its tasks move"
    )
    revoke.add_argument("device_id", metavar="ID", help="the device's id (`hpc-ds1 devices`)")
    add_json_argument(revoke, "what was revoked")
    _connection_arguments(revoke, top=False)
    revoke.set_defaults(handler=handle_revoke)


def _target(args: argparse.Namespace) -> tuple[str, str | None]:
    settings = load_settings(quiet=True, home=args.home)
    server = args.server
    if not server:
        owner = running_owner(settings.home)
        if owner is None or not owner.gateway_url:
            raise PreconditionError(
                "no server runs for this home: start `hpc-ds1 serve`, or give --server URL "
                "--token TOKEN"
            )
        server = owner.gateway_url
    try:
        return server.rstrip("/"), bearer_for(settings.home, server, args.token)
    except CredentialError as error:
        raise UsageError(str(error)) from None


def _call(
    args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None
) -> Any:
    server, token = _target(args)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        reply = httpx.request(
            method, f"{server}{path}", json=body, headers=headers, timeout=TIMEOUT_S
        )
    except httpx.HTTPError as error:
        raise PreconditionError(f"cannot reach {server}: {error}") from None
    if reply.status_code >= 400:
        try:
            why = reply.json().get("error") or reply.text
        except ValueError:
            why = reply.text
        hint = " (give --token)" if reply.status_code == 401 and not token else ""
        raise UsageError(f"{server} answered {reply.status_code}: {why}{hint}")
    return reply.json()


def _device_id(value: str) -> str:
    if not SAFE_ID.match(value):
        raise UsageError(f"device id {value!r} is not valid: {SAFE_ID_RULE}")
    return value


def _hardware(h: dict[str, Any]) -> str:
    parts = []
    if h.get("cores"):
        parts.append(f"{h['cores']} cores")
    if h.get("memory_gib") is not None:
        parts.append(f"{h['memory_gib']:g} GiB")
    gpus = h.get("gpus") or []
    if gpus:
        parts.append(f"{len(gpus)} GPU" + ("s" if len(gpus) > 1 else ""))
    return ", ".join(parts) or "-"


def _measured(kernels: list[dict[str, Any]]) -> str:
    if not kernels:
        return "-"
    return " ".join(
        f"{k['workload']}:{len(k['sizes'])}sz/{k['correct_runs']}ok"
        + (f"/{k['runs']}" if k["runs"] != k["correct_runs"] else "")
        for k in kernels
    )


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.0f} h ago"


def render(devices: list[dict[str, Any]]) -> str:
    """The devices as a table: one line each."""
    if not devices:
        return (
            "no devices yet: `hpc-ds1 token join` prints the command that joins one "
            "(the coordinator's own device registers when its agent starts)"
        )
    header = ("DEVICE", "STATUS", "HOST", "HARDWARE", "MEASURED", "MODEL", "WORKING ON", "HEARD")
    rows = []
    for d in devices:
        model = d.get("model")
        work = d.get("working_on")
        status = d["status"] + (" (this machine)" if d.get("local") else "")
        rows.append(
            (
                d["device_id"],
                status,
                d["hostname"],
                _hardware(d.get("hardware") or {}),
                _measured(d.get("measured") or []),
                f"trained on {model['trained_on']}" if model else "-",
                (
                    f"{work['task_id']} {work.get('workload') or '?'} {work.get('size') or ''}"
                    if work
                    else "-"
                ).rstrip()
                + (f" +{d['queued']} queued" if d.get("queued") else ""),
                _ago(d.get("last_heartbeat_s")),
            )
        )
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows, strict=False)]
    lines = [
        "  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)).rstrip()
        for line in (header, *rows)
    ]
    return "\n".join(lines)


def handle_list(args: argparse.Namespace) -> int:
    found = _call(args, "GET", "/v1/devices")
    devices = found.get("devices", [])
    print(json.dumps(devices, indent=2) if args.json else render(devices))
    return 0


def handle_drain(args: argparse.Namespace) -> int:
    device_id = _device_id(args.device_id)
    device = _call(args, "POST", f"/v1/devices/{device_id}/drain", {"draining": not args.undo})
    if args.undo:
        said = f"{device_id} takes new tasks again (status {device['status']})"
    else:
        said = f"{device_id} is draining: no new tasks; what it runs finishes"
    emit(args, device, said)
    return 0


def handle_revoke(args: argparse.Namespace) -> int:
    device_id = _device_id(args.device_id)
    answer = _call(args, "POST", f"/v1/devices/{device_id}/revoke")
    tokens = ", ".join(answer["revoked_tokens"]) or "none left to revoke"
    emit(args, answer, f"{device_id} revoked (credentials: {tokens}); it has left the fleet")
    return 0
