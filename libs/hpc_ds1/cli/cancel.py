"""`hpc-ds1 cancel SESSION_ID`: cancel a tuning session (issue 44, item 4). The cancel is
recorded with who asked (cancel.requested); the coordinator driving the session has the device's
agent kill the run in flight, the whole process group of its launch, and the session finishes
`interrupted`. On this home's log (this user, as an engineer at the terminal, as `tune` decides
a move) or, with --server, through the coordinator's API as the token's holder."""

from __future__ import annotations

import argparse
import asyncio
import getpass
from typing import Any

import httpx
from pydantic import ValidationError

from ..requests import SAFE_ID, SAFE_ID_RULE, CancelSession
from ..security.cancels import CancelError, cancel_session
from ..security.credentials import CredentialError, bearer_for
from ..settings import Settings
from ..stack import open_stack
from . import CommandFailed, PreconditionError, UsageError
from .common import (
    add_home_argument,
    add_json_argument,
    load_settings,
    print_json,
    validation_message,
)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "cancel",
        help="cancel a tuning session: its run in flight is killed, the whole process group",
    )
    parser.add_argument("session_id", metavar="SESSION_ID", help="the session to cancel")
    parser.add_argument("--reason", default="", help="why, recorded with who cancelled")
    parser.add_argument("--server", help="coordinator URL (default: this home's log)")
    parser.add_argument(
        "--token",
        help="engineer token for --server (default: this home's own, "
        "$HPC_DS1_HOME/credentials/cli.token, when the server is this home's)",
    )
    add_json_argument(parser, "the cancel recorded")
    add_home_argument(parser)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    if not SAFE_ID.match(args.session_id):
        raise UsageError(f"SESSION_ID {args.session_id!r}: a session id is {SAFE_ID_RULE}")
    try:
        CancelSession(reason=args.reason)
    except ValidationError as error:
        raise UsageError(f"--reason: {validation_message(error)}") from None
    settings = load_settings(quiet=True, home=args.home)
    if args.server:
        try:
            token = bearer_for(settings.home, args.server, args.token)
        except CredentialError as error:
            raise UsageError(str(error)) from None
        said = remote(args.server, token, args.session_id, args.reason)
    else:
        said = asyncio.run(local(settings, args.session_id, args.reason))
    if args.json:
        print_json(said)
    else:
        why = f" ({said['reason']})" if said.get("reason") else ""
        print(
            f"session {said['session_id']} cancelled by {said['by']}{why}: its run in flight is "
            "killed and the session finishes interrupted"
        )
    return 0


async def local(settings: Settings, session_id: str, reason: str) -> dict[str, Any]:
    async with open_stack(settings, (), "cli-cancel") as stack:
        try:
            event = await cancel_session(
                stack.bus, session_id, getpass.getuser(), "engineer", reason
            )
        except CancelError as error:
            raise _refused(error.status, str(error)) from None
    return event.model_dump()


def remote(server: str, token: str | None, session_id: str, reason: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    base = server.rstrip("/")
    try:
        reply = httpx.post(
            f"{base}/v1/sessions/{session_id}/cancel",
            json={"reason": reason},
            headers=headers,
            timeout=30,
        )
    except httpx.HTTPError as error:
        raise PreconditionError(f"{base} could not be reached: {error}") from None
    if reply.status_code != 202:
        try:
            message = reply.json().get("error") or reply.text
        except ValueError:
            message = reply.text
        raise _refused(reply.status_code, f"{base} answered {reply.status_code}: {message}")
    said: dict[str, Any] = reply.json()
    return said


def _refused(status: int, message: str) -> Exception:
    """A 409 (finished already, cancelled before) is a failure; the rest is bad input."""
    return CommandFailed(message) if status == 409 else UsageError(message)
