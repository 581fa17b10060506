"""`hpc-ds1 token create|list|revoke|login|join|nats`: bearer tokens, stored only as hashes
(`create --expires 30d`: one that stops working then; `list` shows each one's expiry and last
use, as the gateways saw it); `login`
prints a new one-time login URL for the browser, `join` the fleet's join token with its expiry
and uses left (`--rotate [--ttl 24h] [--uses 10]`: a new one, the old one revoked); see
hpc_ds1.security.credentials. `nats --name NAME` makes a read-only NATS subscriber credential of the
embedded server (`--revoke NAME` removes it), audited as a token of role `nats`; see
hpc_ds1.infra.subscribers and docs/watching.md."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import nats
from sqlalchemy import Engine, select
from sqlalchemy.exc import SQLAlchemyError

from ..db import make_engine, tables
from ..eventlog.bus import ConcurrencyConflict
from ..events import TokenCreated, TokenRevoked, envelope
from ..infra.home import Endpoints, running_owner, settings_of_owner
from ..infra.nats_auth import nats_users, subscriber_inbox
from ..infra.nats_server import reload_users
from ..infra.secrets import load_credentials
from ..infra.subscribers import (
    NAME_RULE,
    Subscriber,
    add_subscriber,
    check_name,
    load_subscribers,
    remove_subscriber,
)
from ..security.credentials import (
    JOIN_HOLDER,
    JOIN_TTL_DEFAULT_S,
    JOIN_USES_DEFAULT,
    CredentialError,
    TokenLimits,
    bearer_for,
    duration_text,
    join_command,
    join_token_id,
    new_login_token,
    owner_name,
    parse_ttl,
    parse_uses,
    reachable_host,
    read_join_token,
    rotate_join_token,
    token_limits,
    utc_text,
    wait_active,
)
from ..security.tokens import (
    HOLDER_PATTERN,
    HOLDER_RULE,
    ROLES,
    new_token,
    new_token_id,
    parse_expiry,
    token_hash,
)
from ..settings import Settings
from ..stack import Stack, open_stack
from . import PreconditionError, UsageError
from .common import add_home_argument, add_json_argument, emit, load_settings, print_json


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("token", help="create, list or revoke bearer tokens")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True

    create = actions.add_parser("create", help="a new token, shown once")
    create.add_argument("--name", required=True, help=f"who holds it: {HOLDER_RULE}")
    create.add_argument("--role", required=True, help=f"one of: {', '.join(ROLES)}")
    create.add_argument(
        "--expires",
        type=_argument(parse_expiry),
        default=None,
        metavar="WHEN",
        help="when it stops working: a duration such as 30d or 12h, or a UTC date such as "
        "2027-06-30 (default: never, until revoked)",
    )
    add_json_argument(create, "the token, its id, holder and role")
    add_home_argument(create)
    create.set_defaults(handler=handle_create)

    listing = actions.add_parser(
        "list", help="every token: id, holder, role, created, revoked, expiry, last use"
    )
    listing.add_argument("--json", action="store_true", help="print the tokens as JSON")
    add_home_argument(listing)
    listing.set_defaults(handler=handle_list)

    login = actions.add_parser(
        "login", help="a new one-time login URL for this home's console (the old one stops working)"
    )
    add_json_argument(login, "the login URL")
    add_home_argument(login)
    login.set_defaults(handler=handle_login)

    join = actions.add_parser(
        "join", help="the fleet's join token and the command that joins a device with it"
    )
    join.add_argument(
        "--rotate", action="store_true", help="revoke it and make a new one (joined devices stay)"
    )
    join.add_argument(
        "--ttl",
        type=_argument(parse_ttl),
        default=None,
        metavar="DURATION",
        help="with --rotate: how long the new one lasts, e.g. 30m, 24h, 7d "
        f"(default {duration_text(JOIN_TTL_DEFAULT_S)})",
    )
    join.add_argument(
        "--uses",
        type=_argument(parse_uses),
        default=None,
        metavar="N",
        help="with --rotate: how many devices may join with the new one "
        f"(default {JOIN_USES_DEFAULT})",
    )
    add_json_argument(join, "the join token and the join command")
    add_home_argument(join)
    join.set_defaults(handler=handle_join)

    subscriber = actions.add_parser(
        "nats",
        help="a read-only NATS credential to watch the event log (`--revoke NAME` removes it)",
    )
    which = subscriber.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--name", help=f"make a subscriber credential NAME ({NAME_RULE}), shown once"
    )
    which.add_argument("--revoke", metavar="NAME", help="revoke subscriber credential NAME")
    add_json_argument(subscriber, "the NATS context and the nats.py connect arguments")
    add_home_argument(subscriber)
    subscriber.set_defaults(handler=handle_nats)

    revoke = actions.add_parser("revoke", help="revoke a token by its id")
    revoke.add_argument(
        "token_id", metavar="TOKEN_ID", help="the token's id (`hpc-ds1 token list` shows them)"
    )
    revoke.add_argument(
        "--reason", default=None, help="why, for the audit trail (at most 200 characters)"
    )
    add_json_argument(revoke, "what was revoked")
    add_home_argument(revoke)
    revoke.set_defaults(handler=handle_revoke)


def _argument(parse: Any) -> Any:
    """An argparse `type` from a parser that raises ValueError with its own message."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = parse.__name__
    return convert


def _check(name: str, role: str) -> None:
    if role not in ROLES:
        raise UsageError(f"role {role!r} is not one of: {', '.join(ROLES)}")
    if not HOLDER_PATTERN.match(name):
        raise UsageError(f"name {name!r} is not valid: use {HOLDER_RULE}")


def _stack(settings: Settings) -> contextlib.AbstractAsyncContextManager[Stack]:
    return open_stack(settings, ("projector",), "token")


def handle_create(args: argparse.Namespace) -> int:
    _check(args.name, args.role)
    expires: datetime | None = args.expires
    if expires is not None and args.role == "join":
        raise UsageError(
            "a join token's expiry is set with `hpc-ds1 token join --rotate --ttl DURATION`"
        )
    settings = load_settings(home=args.home)
    token = new_token()
    token_id = new_token_id()
    event = TokenCreated(
        token_id=token_id,
        holder=args.name,
        role=args.role,
        sha256=token_hash(token),
        expires_at=expires,
    )
    asyncio.run(_publish(settings, event))
    if args.json:
        print_json(
            {
                "token_id": token_id,
                "holder": args.name,
                "role": args.role,
                "token": token,
                "expires_at": expires and expires.isoformat(),
            }
        )
        return 0
    until = f", expires {utc_text(expires)}" if expires is not None else ""
    print(f"token {token_id} for {args.name} ({args.role}{until}):")
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
    t, ta = tables.tokens, tables.token_activity
    # Never the hash: only what is safe to show. The last use as the gateways wrote it (at
    # most a minute behind).
    query = (
        select(
            t.c.token_id,
            t.c.holder,
            t.c.role,
            t.c.created_by,
            t.c.created_at,
            t.c.revoked,
            t.c.expires_at,
            t.c.max_uses,
            t.c.uses,
            ta.c.last_used_at,
        )
        .select_from(t.outerjoin(ta, ta.c.token_id == t.c.token_id))
        .order_by(t.c.created_at, t.c.token_id)
    )
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
        print(
            json.dumps(
                [
                    {
                        **r,
                        "created_at": r["created_at"].isoformat(),
                        "expires_at": r["expires_at"] and r["expires_at"].isoformat(),
                        "last_used_at": r["last_used_at"] and r["last_used_at"].isoformat(),
                    }
                    for r in rows
                ]
            )
        )
        return 0
    if not rows:
        print("no tokens; create one with: hpc-ds1 token create --name NAME --role engineer")
        return 0
    header = ("ID", "HOLDER", "ROLE", "CREATED", "BY", "REVOKED", "EXPIRES", "LAST USED", "USES")
    lines = [
        (
            r["token_id"],
            r["holder"],
            r["role"],
            r["created_at"].strftime("%Y-%m-%d %H:%M:%S"),
            r["created_by"],
            "yes" if r["revoked"] else "no",
            _expires(r["expires_at"]),
            r["last_used_at"].strftime("%Y-%m-%d %H:%M") if r["last_used_at"] else "never",
            f"{r['uses']}/{r['max_uses']}" if r["max_uses"] is not None else "-",
        )
        for r in rows
    ]
    widths = [max(len(str(x)) for x in column) for column in zip(header, *lines, strict=False)]
    for line in (header, *lines):
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)).rstrip())
    return 0


def _expires(when: Any) -> str:
    if when is None:
        return "-"
    text = str(when.strftime("%Y-%m-%d %H:%M:%S"))
    return f"{text} (expired)" if when <= datetime.now(UTC) else text


async def _revoke(settings: Settings, token_id: str, reason: str | None = None) -> str:
    async with _stack(settings) as stack:
        await stack.caught_up()
        rows = await asyncio.to_thread(_rows, stack.engine)
        found = next((r for r in rows if r["token_id"] == token_id), None)
        if found is None:
            raise UsageError(f"no token {token_id!r}; `hpc-ds1 token list` shows the ids")
        if found["revoked"]:
            return f"token {token_id} ({found['holder']}) was already revoked"
        if found["role"] == "nats":  # its NATS user goes first, then the record
            await _drop_subscriber(settings, token_id=token_id)
        await _send(stack, TokenRevoked(token_id=token_id, reason=reason))
        return f"token {token_id} ({found['holder']}, {found['role']}) revoked"


def handle_revoke(args: argparse.Namespace) -> int:
    reason = args.reason.strip() if args.reason else None
    if reason is not None and not 1 <= len(reason) <= 200:
        raise UsageError(f"--reason is {len(reason)} characters: give 1 to 200")
    settings = load_settings(home=args.home)
    said = asyncio.run(_revoke(settings, args.token_id, reason))
    emit(args, {"token_id": args.token_id, "revoked": True, "message": said}, said)
    return 0


def login_url(base: str, token: str) -> str:
    """The URL that trades a one-time token for the console's session cookie."""
    return f"{base.rstrip('/')}/?token={token}"


def handle_login(args: argparse.Namespace) -> int:
    settings = load_settings(home=args.home)
    owner = running_owner(settings.home)
    token = new_login_token(settings.home)
    if owner is not None and owner.gateway_url:
        url = login_url(owner.gateway_url, token)
        said = f"Open this once to log in (admin, as {owner_name()}):\n{url}"
        emit(args, {"url": url, "server_running": True}, said)
        return 0
    shown = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    url = login_url(f"http://{shown}:{settings.port}/", token)
    said = f"No server runs for this home yet; once `hpc-ds1 serve` runs, open this once:\n{url}"
    emit(args, {"url": url, "server_running": False}, said)
    return 0


def _join_info(settings: Settings, token: str) -> tuple[str, TokenLimits | None, str | None]:
    """Where devices reach this home's gateway, the join token's limits, and the join command
    the gateway gives (with its CA pin when it serves TLS, issue 45): the running gateway says
    (it knows the address it listens on and the certificate it serves); without one, the
    configured host and port, and the limits from an external database when the home has one
    (None: unknown)."""
    owner = running_owner(settings.home)
    if owner is not None and owner.gateway_url:
        try:
            bearer = bearer_for(settings.home, owner.gateway_url, None)
            reply = httpx.get(
                f"{owner.gateway_url.rstrip('/')}/v1/fleet/join-token",
                headers={"Authorization": f"Bearer {bearer}"} if bearer else {},
                timeout=10,
            )
            body = reply.json() if reply.status_code == 200 else {}
            if body.get("token") == token and isinstance(body.get("server"), str):
                command = body.get("command")
                return (
                    str(body["server"]),
                    _limits_of_answer(body),
                    command if isinstance(command, str) else None,
                )
        except (httpx.HTTPError, ValueError, TypeError, CredentialError):
            pass
    server = f"http://{reachable_host(settings.host)}:{settings.port}"
    if not settings.database_url:
        return server, None, None
    engine = make_engine(settings.database_url, pool_size=1)
    try:
        return server, token_limits(engine, token), None
    except SQLAlchemyError:
        return server, None, None
    finally:
        engine.dispose()


def _limits_of_answer(body: dict[str, Any]) -> TokenLimits | None:
    """The limits GET /v1/fleet/join-token told (None: the token is not registered yet)."""
    if not body.get("token_id") or not body.get("state"):
        return None
    expires = body.get("expires_at")
    max_uses, left = body.get("max_uses"), body.get("uses_left")
    return TokenLimits(
        token_id=str(body["token_id"]),
        expires_at=datetime.fromisoformat(expires) if expires else None,
        max_uses=int(max_uses) if max_uses is not None else None,
        uses=int(max_uses) - int(left) if max_uses is not None and left is not None else 0,
        revoked=body["state"] == "revoked",
    )


async def _rotate_join(settings: Settings, ttl_s: float, uses: int) -> tuple[str, list[str]]:
    async with _stack(settings) as stack:
        await stack.caught_up()
        rows = await asyncio.to_thread(_rows, stack.engine)
        old = [r["token_id"] for r in rows if r["role"] == "join" and not r["revoked"]]
        token = await asyncio.to_thread(rotate_join_token, settings.home)
        new_id = join_token_id(token)
        # An admin action, audited with its actor (the person at this terminal) and why.
        created = TokenCreated(
            token_id=new_id,
            holder=JOIN_HOLDER,
            role="join",
            sha256=token_hash(token),
            expires_at=datetime.now(UTC) + timedelta(seconds=ttl_s),
            max_uses=uses,
            reason="join token rotated",
        )
        env = envelope(created, actor=getpass.getuser(), source="cli", prefix=stack.bus.prefix)
        with contextlib.suppress(ConcurrencyConflict):  # registered already: wait for it
            await stack.bus.publish(env, expected_version=0)
        if not await wait_active(stack.engine, token, 30):
            raise UsageError("the new join token was not registered: is the projector running?")
        for token_id in old:
            why = f"join token rotated: replaced by {new_id}"
            await _send(stack, TokenRevoked(token_id=token_id, reason=why))
        return token, old


def handle_join(args: argparse.Namespace) -> int:
    settings = load_settings(quiet=True, home=args.home)
    if not args.rotate and (args.ttl is not None or args.uses is not None):
        raise UsageError(
            "--ttl and --uses set a new join token's limits: use them with --rotate "
            "(a token's limits are fixed when it is made)"
        )
    try:
        if args.rotate:
            ttl_s = settings.join_token_ttl_s if args.ttl is None else args.ttl
            uses = settings.join_token_uses if args.uses is None else args.uses
            token, old = asyncio.run(_rotate_join(settings, ttl_s, uses))
            gone = ", ".join(old) if old else "none was active"
            print(
                f"join token rotated (revoked: {gone}); devices that joined keep their own "
                "credentials",
                file=sys.stderr,
            )
        else:
            found = read_join_token(settings.home)
            if found is None:
                raise UsageError(
                    "this home has no join token yet: `hpc-ds1 serve` makes one on its first "
                    "start (or run `hpc-ds1 token join --rotate`)"
                )
            token = found
    except CredentialError as error:
        raise UsageError(str(error)) from None
    server, limits, answered = _join_info(settings, token)
    if limits is not None and (problem := limits.problem()) is not None:
        # A dead token is not shown as if it worked (`serve` replaces it on its next start).
        raise PreconditionError(problem)
    command = answered or join_command(server, token)
    about = (
        "its expiry and uses are known once `hpc-ds1 serve` runs (which replaces it then if "
        "it expired or was used up)"
        if limits is None
        else limits.describe()
    )
    print(f"join token {join_token_id(token)}: {about}", file=sys.stderr)
    answer: dict[str, Any] = {"token": token, "command": command}
    if limits is not None:
        answer |= {
            "token_id": limits.token_id,
            "expires_at": limits.expires_at and limits.expires_at.isoformat(),
            "expires": limits.expires_at and utc_text(limits.expires_at),
            "max_uses": limits.max_uses,
            "uses_left": limits.uses_left,
        }
    emit(args, answer, f"{token}\nJoin      {command}")
    return 0


# `hpc-ds1 token nats`: read-only subscriber credentials of the embedded NATS server.
SITE_DOC = "docs/site-infrastructure.md"


def _nats_owner(settings: Settings) -> Endpoints | None:
    """The running owner whose embedded server learns the user (None: no server runs now; the
    next start reads the credentials file). An external NATS: PreconditionError."""
    owner = running_owner(settings.home)
    external = (owner is not None and not owner.embedded_nats) or (
        owner is None and bool(settings.nats_url)
    )
    if external:
        raise PreconditionError(
            "this home uses an external NATS server (HPC_DS1_NATS_URL): its operator creates "
            f"the subscriber user with the permissions in {SITE_DOC} (section 'A read-only "
            "subscriber')"
        )
    return owner


async def _quiet(_: Exception) -> None:
    return None


async def _connects(url: str, user: str, password: str) -> bool:
    """Whether the server accepts this user now (False: refused, or no server)."""
    try:
        nc = await nats.connect(
            url,
            user=user,
            password=password,
            allow_reconnect=False,
            connect_timeout=2,
            error_cb=_quiet,
            inbox_prefix=subscriber_inbox(user),
        )
    except (nats.errors.Error, OSError):
        # 'Authorization Violation', or the server closing the socket before the client read
        # it (a reset): either way this user does not get in now.
        return False
    await nc.close()
    return True


async def _apply(
    settings: Settings, owner: Endpoints, user: str, password: str, *, on: bool
) -> None:
    """Give the owner's running embedded server the users of the credentials file now (config
    rewritten, SIGHUP) and wait until `user` connects (`on`) or is refused (not `on`)."""
    settings = settings_of_owner(settings, owner)
    users = nats_users(settings, load_credentials(settings.home))
    try:
        reload_users(settings.home / "nats", users)
    except (OSError, RuntimeError) as error:
        raise PreconditionError(
            f"the embedded NATS server did not take the change ({error}); it applies on the "
            "next start of `hpc-ds1 serve`"
        ) from None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    while await _connects(owner.nats_url, user, password) != on:
        if loop.time() > deadline:
            raise PreconditionError(
                f"the embedded NATS server has not reloaded its users (see "
                f"{settings.home / 'nats' / 'nats.log'}); it applies on the next start of "
                "`hpc-ds1 serve`"
            )
        await asyncio.sleep(0.1)


async def _drop_subscriber(
    settings: Settings, name: str | None = None, token_id: str | None = None
) -> Subscriber | None:
    """Remove a subscriber credential from the file and from the running server (its
    connections closed). None when there was none of that name or token id."""
    owner = running_owner(settings.home)
    gone = await asyncio.to_thread(remove_subscriber, settings.home, name, token_id)
    if gone is not None and owner is not None and owner.embedded_nats:
        await _apply(settings, owner, gone.name, gone.password, on=False)
    return gone


async def _nats_create(settings: Settings, name: str) -> tuple[Subscriber, Endpoints | None]:
    owner = _nats_owner(settings)
    async with _stack(settings) as stack:
        token_id = new_token_id()
        try:
            subscriber = await asyncio.to_thread(add_subscriber, settings.home, name, token_id)
        except ValueError as error:
            raise UsageError(str(error)) from None
        try:
            # The record first: no credential works without its token.created in the log.
            created = TokenCreated(
                token_id=token_id,
                holder=name,
                role="nats",
                sha256=token_hash(subscriber.password),
            )
            await _send(stack, created)
        except BaseException:
            await asyncio.to_thread(remove_subscriber, settings.home, name)
            raise
        if owner is not None:
            await _apply(settings, owner, name, subscriber.password, on=True)
        return subscriber, owner


async def _nats_revoke(settings: Settings, name: str) -> str:
    _nats_owner(settings)
    async with _stack(settings) as stack:
        gone = await _drop_subscriber(settings, name=name)
        if gone is None:
            known = ", ".join(s.name for s in load_subscribers(settings.home)) or "none"
            raise UsageError(f"no subscriber credential {name!r} (this home has: {known})")
        await stack.caught_up()
        rows = await asyncio.to_thread(_rows, stack.engine)
        if any(r["token_id"] == gone.token_id and not r["revoked"] for r in rows):
            await _send(stack, TokenRevoked(token_id=gone.token_id))
        return f"subscriber credential {name} ({gone.token_id}) revoked; its connections closed"


def nats_context(
    settings: Settings, subscriber: Subscriber, url: str | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The `nats` CLI's context file and nats.py's connect arguments for `subscriber`."""
    inbox = subscriber_inbox(subscriber.name)
    context = {
        "description": f"hpc-ds1 event log of {settings.home}, read-only ({subscriber.name})",
        "url": url,
        "user": subscriber.name,
        "password": subscriber.password,
        "inbox_prefix": inbox,
    }
    connect = {
        "servers": [url] if url else [],
        "user": subscriber.name,
        "password": subscriber.password,
        "inbox_prefix": inbox,
    }
    return context, connect


def handle_nats(args: argparse.Namespace) -> int:
    settings = load_settings(quiet=True, home=args.home)
    if args.revoke is not None:
        said = asyncio.run(_nats_revoke(settings, args.revoke))
        emit(args, {"name": args.revoke, "revoked": True, "message": said}, said)
        return 0
    if (problem := check_name(args.name)) is not None:
        raise UsageError(problem)
    subscriber, owner = asyncio.run(_nats_create(settings, args.name))
    url = owner.nats_url if owner is not None else None
    context, connect = nats_context(settings, subscriber, url)
    answer = {
        "name": subscriber.name,
        "token_id": subscriber.token_id,
        "stream": settings.stream,
        "subjects": f"{settings.subject_prefix}.>",
        "consumer": subscriber.name,
        "context": context,
        "nats_py": connect,
    }
    if args.json:
        print_json(answer)
        return 0
    where = (
        f"the server runs at {url}"
        if url
        else "no server runs for this home now: the URL (owner.json's nats_url) is known once "
        "`hpc-ds1 serve` runs"
    )
    print(f"NATS subscriber credential {subscriber.name} ({subscriber.token_id}); {where}.")
    print(
        f"nats CLI context: save as ~/.config/nats/context/{subscriber.name}.json, then "
        f"`nats --context {subscriber.name} sub '{settings.subject_prefix}.>'`:"
    )
    print(json.dumps(context, indent=2))
    print("nats.py: `await nats.connect(**ARGS)` with ARGS =")
    print(json.dumps(connect, indent=2))
    print(
        f"It reads stream {settings.stream} through its own consumer named {subscriber.name} "
        "(durable or ordered); docs/watching.md. Keep the password now: no command shows it again."
    )
    return 0
