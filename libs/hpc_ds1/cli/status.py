"""`hpc-ds1 status`: where this home stands (its folder, its model, its server and the devices
the server knows) and the next step to take. Reads files and asks the home's own server only;
starts nothing."""

from __future__ import annotations

import argparse
from typing import Any

import httpx

from .common import add_home_argument, add_json_argument, emit, load_settings

SERVER_TIMEOUT_S = 3.0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "status", help="this home: its model, its server, the devices and the next step"
    )
    add_json_argument(parser, "the status")
    add_home_argument(parser)
    parser.set_defaults(handler=handle)


def _model(settings: Any, here: Any) -> dict[str, Any] | None:
    from ..model import Model
    from ..model.guard import hardware_reason
    from ..models_store import latest_path

    path = latest_path(settings.models_dir)
    if path is None:
        return None
    try:
        model = Model.from_file(path)
    except Exception as error:  # a file this version cannot read: say so, do not fail
        return {"path": str(path), "problem": f"{type(error).__name__}: {error}"}
    difference = hardware_reason(model.fingerprint, here)
    return {
        "path": str(path),
        "version": model.version,
        "trained_at": model.trained_at,
        "device_id": model.device_id,
        "workloads": {w: model.sizes[w] for w in sorted(model.workloads)},
        "this_machine": difference is None,
        "hardware_difference": difference,
    }


def _server(settings: Any) -> dict[str, Any] | None:
    """The home's running server (owner.json, held by its owner), and what it answers."""
    from ..infra.home import running_owner
    from ..security.credentials import bearer_for

    owner = running_owner(settings.home)
    if owner is None:
        return None
    found: dict[str, Any] = {
        "url": owner.gateway_url,
        "pid": owner.pid,
        "embedded": owner.embedded,
        "answers": False,
        "devices": None,
    }
    if not owner.gateway_url:
        return found  # a command's own embedded stack: no gateway to ask
    base = owner.gateway_url.rstrip("/")
    try:
        found["answers"] = httpx.get(f"{base}/healthz", timeout=SERVER_TIMEOUT_S).is_success
        token = bearer_for(settings.home, base, None)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        reply = httpx.get(f"{base}/v1/devices", headers=headers, timeout=SERVER_TIMEOUT_S)
        if reply.is_success:
            found["devices"] = len(reply.json().get("devices", []))
    except (httpx.HTTPError, ValueError, OSError):
        pass  # reported as not answering, or the devices as unknown
    return found


def next_step(model: dict[str, Any] | None, server: dict[str, Any] | None) -> str:
    if model is None:
        return "run `hpc-ds1 setup --quick` (measures this machine for real, then trains its model)"
    if "problem" in model:
        return f"the model file cannot be read ({model['problem']}): run `hpc-ds1 setup --quick`"
    if not model["this_machine"]:
        return (
            "the model was trained on another machine: run `hpc-ds1 setup --quick` here for one "
            "of this machine's own"
        )
    first = sorted(model["workloads"])[0] if model["workloads"] else "gemm"
    sizes = model["workloads"].get(first) or [1]
    recommend = f"`hpc-ds1 recommend --workload {first} --size {sizes[len(sizes) // 2]}`"
    if server is None:
        return f"{recommend}, `hpc-ds1 tune ...`, or `hpc-ds1 serve` for the console and the API"
    if not server["answers"]:
        return f"the server of this home ({server['url']}) does not answer: check `hpc-ds1 serve`"
    return f"{recommend}, or open the console at {server['url']}"


def render(s: dict[str, Any]) -> str:
    m, srv = s["model"], s["server"]
    lines = [f"home     {s['home']}" + ("" if s["home_exists"] else " (not created yet)")]
    if m is None:
        lines.append("model    none yet")
    elif "problem" in m:
        lines.append(f"model    unreadable: {m['problem']}")
    else:
        trained = ", ".join(f"{w} {v}" for w, v in m["workloads"].items())
        where = "this machine" if m["this_machine"] else "ANOTHER machine"
        lines.append(f"model    {m['version']} · trained {m['trained_at']} on {where} · {trained}")
    if srv is None:
        lines.append("server   not running")
    else:
        state = "answering" if srv["answers"] else "NOT answering"
        lines.append(f"server   {srv['url'] or '(no gateway)'} · pid {srv['pid']} · {state}")
        devices = srv["devices"]
        lines.append(f"devices  {devices if devices is not None else 'unknown'}")
    lines.append(f"next     {s['next_step']}")
    return "\n".join(lines)


def handle(args: argparse.Namespace) -> int:
    from ..machine.hardware import fingerprint

    settings = load_settings(quiet=True, home=args.home)
    here = fingerprint()
    model = _model(settings, here)
    server = _server(settings)
    found = {
        "home": str(settings.home),
        "home_exists": settings.home.exists(),
        "device_id": here.device_id,
        "model": model,
        "server": server,
        "next_step": next_step(model, server),
    }
    emit(args, found, render(found))
    return 0
