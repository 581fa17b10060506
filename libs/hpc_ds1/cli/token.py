"""`hpc-ds1 token create|list|revoke|login`: bearer tokens, stored only as hashes; `login` prints
a new one-time login URL for the browser (see hpc_ds1.credentials)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
from typing import Any

from sqlalchemy import Engine, select

from ..credentials import new_login_token, owner_name
from ..db import tables
from ..events import TokenCreated, TokenRevoked, envelope
from ..infra.home import running_owner
from ..settings import Settings
from ..stack import Stack, open_stack
from ..tokens import HOLDER_PATTERN, HOLDER_RULE, ROLES, new_token, new_token_id, token_hash
from . import UsageError
from .common import add_home_argument, load_settings


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("token", help="create, list or revoke bearer tokens")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True

    create = actions.add_parser("create", help="a new token, shown once")
    create.add_argument("--name", required=True, help=f"who holds it: {HOLDER_RULE}")
    create.add_argument("--role", required=True, help=f"one of: {', '.join(ROLES)}")
    add_home_argument(create)
    create.set_defaults(handler=handle_create)

    listing = actions.add_parser("list", help="every token: id, holder, role, created, revoked")
    listing.add_argument("--json", action="store_true", help="print the tokens as JSON")
    add_home_argument(listing)
    listing.set_defaults(handler=handle_list)

    login = actions.add_parser(
        "login", help="a new one-time login URL for this home's console (the old one stops working)"
    )
    add_home_argument(login)
    login.set_defaults(handler=handle_login)

    revoke = actions.add_parser("revoke", help="revoke a token by its id")
    revoke.add_argument("token_id", metavar="TOKEN_ID")
    add_home_argument(revoke)
    revoke.set_defaults(handler=handle_revoke)


def _check(name: str, role: str) -> None:
    if role not in ROLES:
        raise UsageError(f"role {role!r} is not one of: {', '.join(ROLES)}")
    if not HOLDER_PATTERN.match(name):
        raise UsageError(f"name {name!r} is not valid: use {HOLDER_RULE}")


def _stack(settings: Settings) -> contextlib.AbstractAsyncContextManager[Stack]:
    return open_stack(settings, ("projector",), "token")


def handle_create(args: argparse.Namespace) -> int:
    _check(args.name, args.role)
    settings = load_settings(home=args.home)
    token = new_token()
    token_id = new_token_id()
    event = TokenCreated(
        token_id=token_id, holder=args.name, role=args.role, sha256=token_hash(token)
    )
    asyncio.run(_publish(settings, event))
    print(f"token {token_id} for {args.name} ({args.role}):")
    print(token)
    print("Keep it now: it cannot be shown again (only its SHA-256 is stored).")
    return 0


async def _publish(settings: Settings, event: TokenCreated | TokenRevoked) -> None:
    async with _stack(settings) as stack:
        await _send(stack, event)


async def _send(stack: Stack, event: TokenCreated | TokenRevoked) -> None:
    env = envelope(event, actor=getpass.getuser(), source="cli", prefix=stack.bus.prefix)
    await stack.bus.publish(env)
    await stack.caught_up()


def _rows(engine: Engine) -> list[dict[str, Any]]:
    t = tables.tokens
    # Never the hash: only what is safe to show.
    query = select(
        t.c.token_id, t.c.holder, t.c.role, t.c.created_by, t.c.created_at, t.c.revoked
    ).order_by(t.c.created_at, t.c.token_id)
    with engine.connect() as conn:
        return [dict(row) for row in conn.execute(query).mappings()]


async def _list(settings: Settings) -> list[dict[str, Any]]:
    async with _stack(settings) as stack:
        await stack.caught_up()
        return await asyncio.to_thread(_rows, stack.engine)


def handle_list(args: argparse.Namespace) -> int:
    settings = load_settings(home=args.home)
    rows = asyncio.run(_list(settings))
    if args.json:
        print(json.dumps([{**r, "created_at": r["created_at"].isoformat()} for r in rows]))
        return 0
    if not rows:
        print("no tokens; create one with: hpc-ds1 token create --name NAME --role engineer")
        return 0
    header = ("ID", "HOLDER", "ROLE", "CREATED", "BY", "REVOKED")
    lines = [
        (
            r["token_id"],
            r["holder"],
            r["role"],
            r["created_at"].strftime("%Y-%m-%d %H:%M:%S"),
            r["created_by"],
            "yes" if r["revoked"] else "no",
        )
        for r in rows
    ]
    widths = [max(len(str(x)) for x in column) for column in zip(header, *lines, strict=False)]
    for line in (header, *lines):
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)).rstrip())
    return 0


async def _revoke(settings: Settings, token_id: str) -> str:
    async with _stack(settings) as stack:
        await stack.caught_up()
        rows = await asyncio.to_thread(_rows, stack.engine)
        found = next((r for r in rows if r["token_id"] == token_id), None)
        if found is None:
            raise UsageError(f"no token {token_id!r}; `hpc-ds1 token list` shows the ids")
        if found["revoked"]:
            return f"token {token_id} ({found['holder']}) was already revoked"
        await _send(stack, TokenRevoked(token_id=token_id))
        return f"token {token_id} ({found['holder']}, {found['role']}) revoked"


def handle_revoke(args: argparse.Namespace) -> int:
    settings = load_settings(home=args.home)
    print(asyncio.run(_revoke(settings, args.token_id)))
    return 0


def login_url(base: str, token: str) -> str:
    """The URL that trades a one-time token for the console's session cookie."""
    return f"{base.rstrip('/')}/?token={token}"


def handle_login(args: argparse.Namespace) -> int:
    settings = load_settings(home=args.home)
    owner = running_owner(settings.home)
    token = new_login_token(settings.home)
    if owner is not None and owner.gateway_url:
        print(f"Open this once to log in (admin, as {owner_name()}):")
        print(login_url(owner.gateway_url, token))
        return 0
    shown = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    print("No server runs for this home yet; once `hpc-ds1 serve` runs, open this once:")
    print(login_url(f"http://{shown}:{settings.port}/", token))
    return 0
