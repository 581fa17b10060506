"""Who is calling: a credential, never an address.

Every API call carries a credential, except GET /healthz, GET /readyz and the sign-ins (the
login exchange GET /?token=<one-time token>, the sign-in form, the OpenID provider's callback).
A credential is `Authorization: Bearer <token>` or the console's session cookie:

- a token is looked up by its SHA-256 in the tokens table: unknown, revoked or expired is 401,
  too low a role is 403 (the gateway remembers an active token for a moment and forgets it the
  moment its token.revoked event arrives, or at its expiry: token_cache.py);
- the cookie holds a session id of its own, never a token (signins.py): it ends when
  idle, at its longest life, at sign-out, or with the token it was opened with.

Roles for people: viewer < engineer < admin; `agent` is separate and satisfies only a need for
`agent`. Where the gateway listens (loopback, behind a reverse proxy or an SSH tunnel) changes
nothing.

A cookie is sent by the browser on its own, so a cookie-authenticated POST (or any method that
changes something) must also prove it comes from a page of this origin: an `Origin` header
whose host is the request's `Host`, or an `X-Requested-With` header (which a cross-site form
cannot set). The cookie itself is HttpOnly, SameSite=Strict, and Secure when the request came
over TLS (the scheme uvicorn reports: https, or X-Forwarded-Proto from a proxy named in
HPC_DS1_FORWARDED_ALLOW_IPS).

Tokens are never logged or echoed; only their public ids are.

Failed authentication is limited per client address (ratelimit.py): past
HPC_DS1_AUTH_FAILURES_PER_MINUTE unknown or revoked credentials from one address (the one-time
login token's exchange included), every request from there that carries a credential gets 429
with Retry-After, before any lookup, until the address has an allowance again (one comes back
every 60/N s; a valid credential spends none). A flood is logged as its first line per address
and minute, then a count. POST /v1/fleet/join is limited per address too (`limit_joins`).

Wiring (in create_app): `install_auth(app, settings, engine, bus)` once, then the dependencies
`Depends(require("engineer"))`, `Depends(authenticated)`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Literal
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from pydantic import BaseModel
from sqlalchemy import Engine

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.log import get_logger
from hpc_ds1.security.credentials import consume_login_token, owner_name
from hpc_ds1.security.tokens import ROLES, Principal, lookup, role_allows
from hpc_ds1.settings import Settings

from ..schemas import ERRORS_401_403, ErrorBody
from .ratelimit import QuietLog, RateLimiter, client_address, retry_after, this_machine
from .signins import WHY_TEXT, Session, SessionStore, UseLog, Via
from .token_cache import TokenCache

log = get_logger("gateway.auth")

SESSION_COOKIE = "hpc_ds1_session"
CSRF_HEADER = "x-requested-with"
_CHALLENGE = {"WWW-Authenticate": "Bearer"}
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_HOW = (
    "send 'Authorization: Bearer <token>' (the CLI on this home uses "
    "$HPC_DS1_HOME/credentials/cli.token), or open the login URL `hpc-ds1 serve` printed "
    "(`hpc-ds1 token login` prints a new one)"
)


@dataclass(frozen=True)
class AuthContext:
    settings: Settings
    engine: Engine
    bus: EventBus | None = None
    # With a bus, tokens are remembered between requests and revoked by their events.
    tokens: TokenCache | None = None
    # Per client address: failed authentications, joins, and the log lines of failures.
    failures: RateLimiter = field(default_factory=lambda: RateLimiter(0))
    joins: RateLimiter = field(default_factory=lambda: RateLimiter(0))
    quiet: QuietLog = field(default_factory=QuietLog)
    # The console's sessions (Postgres: shared by every replica) and tokens' last use.
    sessions: SessionStore | None = None
    uses: UseLog | None = None


def install_auth(
    app: FastAPI, settings: Settings, engine: Engine, bus: EventBus | None = None
) -> None:
    """Give the auth dependencies the tokens table (and the bus the login exchange needs)."""
    keep = settings.token_cache_s
    tokens = TokenCache(engine, bus, keep) if bus is not None and keep > 0 else None
    app.state.auth = AuthContext(
        settings,
        engine,
        bus,
        tokens,
        failures=RateLimiter(settings.auth_failures_per_minute),
        joins=RateLimiter(settings.joins_per_minute),
        sessions=SessionStore(engine, settings.console_idle_s, settings.console_max_s),
        uses=UseLog(engine),
    )


def sessions_of(request: Request) -> SessionStore:
    store = _context(request).sessions
    if store is None:
        raise RuntimeError("install_auth(app, settings, engine) made no session store")
    return store


def set_session_cookie(request: Request, response: Response, secret: str) -> None:
    """The console's session cookie: HttpOnly (no script reads it), SameSite=Strict (no other
    site's page sends it), Secure under TLS, and no longer than the session's longest life."""
    settings = _context(request).settings
    response.set_cookie(
        SESSION_COOKIE,
        secret,
        max_age=int(settings.console_max_s),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )


def forget_session_cookie(request: Request, response: Response) -> None:
    response.delete_cookie(
        SESSION_COOKIE,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


async def open_session(
    request: Request,
    response: Response,
    *,
    name: str,
    role: str,
    via: Via,
    token_id: str | None = None,
    identity: str | None = None,
    id_token: str | None = None,
) -> Session:
    """A new console session for this browser (its cookie set on `response`). A session the
    browser held before ends now: one browser, one session, and no id lives on unseen.
    `id_token`: a sign-in at the OpenID provider's ID token, kept sealed for its sign-out
    (never logged)."""
    store = sessions_of(request)
    previous = request.cookies.get(SESSION_COOKIE)
    if previous:
        await asyncio.to_thread(store.end, previous, "replaced")
    secret, session = await asyncio.to_thread(
        store.open,
        name=name,
        role=role,
        via=via,
        token_id=token_id,
        identity=identity,
        id_token=id_token,
    )
    set_session_cookie(request, response, secret)
    log.info(
        "console_session_opened",
        who=name,
        role=role,
        via=via,
        session_id=session.session_id,
        token_id=token_id,
        identity=identity,
        client=client_address(request),
    )
    return session


def _context(request: Request) -> AuthContext:
    context = getattr(request.app.state, "auth", None)
    if not isinstance(context, AuthContext):
        raise RuntimeError("install_auth(app, settings, engine) was not called on this app")
    return context


def _credential(request: Request) -> tuple[str, Literal["bearer", "cookie"]] | None:
    """The token and how it came: an `Authorization: Bearer` header wins over the cookie."""
    header = request.headers.get("authorization")
    if header is not None:
        scheme, _, value = header.strip().partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            # Never echo the header: it may hold a secret in another scheme.
            raise HTTPException(
                401, "the Authorization header must be 'Bearer <token>'", _CHALLENGE
            )
        return value.strip(), "bearer"
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie:
        return cookie, "cookie"
    return None


def same_origin(request: Request) -> bool:
    """Whether an unsafe cookie-authenticated request shows it comes from this origin."""
    if request.headers.get(CSRF_HEADER):
        return True
    origin = request.headers.get("origin")
    host = request.headers.get("host")
    if not origin or not host or origin == "null":
        return False
    return urlsplit(origin).netloc.lower() == host.lower()


def _rejected(context: AuthContext, request: Request, address: str, reason: str, **kw: str) -> None:
    """Log a failed authentication: the first per address per minute; the others are counted,
    and the count is logged once that minute is over (the request log leaves them out too)."""
    first, over = context.quiet.note(address)
    for other, unlogged in over:
        log.info(
            "auth_rejected_more", client=other, count=unlogged, window_s=context.quiet.window_s
        )
    if first:
        log.info("auth_rejected", reason=reason, client=address, path=request.url.path, **kw)
    else:
        request.state.unlogged = True


def _too_many_failures(context: AuthContext, request: Request) -> str:
    """The client's address; 429 when it has no failed authentication left."""
    address = client_address(request)
    wait = context.failures.wait(address)
    if wait > 0:
        _rejected(context, request, address, "too many failed authentications")
        per_minute = context.failures.per_minute
        raise HTTPException(
            429,
            f"too many failed authentications from this address ({per_minute} a minute, "
            f"HPC_DS1_AUTH_FAILURES_PER_MINUTE): retry in {retry_after(wait)['Retry-After']} s "
            "with a valid token",
            retry_after(wait),
        )
    return address


async def limit_joins(request: Request) -> None:
    """A dependency of POST /v1/fleet/join: 429 past HPC_DS1_JOINS_PER_MINUTE joins from one
    address. Callers on this machine (loopback, no forwarded header) are not limited: a fleet
    brought up here (a simulation, the tests) joins as fast as it likes."""
    context = _context(request)
    if this_machine(request):
        return
    address = client_address(request)
    wait = context.joins.spend(address)
    if wait > 0:
        log.info("join_rate_limited", client=address, retry_after_s=round(wait, 1))
        raise HTTPException(
            429,
            f"too many joins from this address ({context.joins.per_minute} a minute, "
            f"HPC_DS1_JOINS_PER_MINUTE): retry in {retry_after(wait)['Retry-After']} s",
            retry_after(wait),
        )


async def verify(request: Request, token: str, via: str, *, spend: bool = True) -> Principal | None:
    """The holder of `token` (active, not revoked), or None (a failed authentication of the
    caller's address, logged; `spend=False`: not counted, the caller tries it otherwise too);
    429 while the address has no failed authentication left, before any lookup. For every
    route that looks a credential up, the console's pages too."""
    context = _context(request)
    address = _too_many_failures(context, request)
    if via == "cookie":
        # The cookie names a console session, never a token.
        found = await asyncio.to_thread(sessions_of(request).check, token)
        if isinstance(found, str):
            request.state.session_over = found
            if spend:
                context.failures.spend(address)
                _rejected(context, request, address, f"console session {found}", via=via)
            return None
        return found.principal()
    principal = (
        await context.tokens.principal(token)
        if context.tokens is not None
        else await asyncio.to_thread(lookup, context.engine, token)
    )
    if principal is None and spend:
        context.failures.spend(address)
        _rejected(context, request, address, "unknown, revoked or expired token", via=via)
    if principal is not None and context.uses is not None:
        context.uses.note(principal.token_id)
    return principal


def session_problem(request: Request) -> str:
    """Why the request's session cookie was refused, in a sentence."""
    why = getattr(request.state, "session_over", "unknown")
    return WHY_TEXT.get(why, WHY_TEXT["unknown"])


async def _identify(request: Request, need: str) -> Principal:
    """The caller's Principal; 401 without a credential or with an unknown or revoked one;
    429 while the caller's address has no failed authentication left."""
    found = _credential(request)
    if found is None:
        raise HTTPException(401, f"this needs a {need} token: {_HOW}", _CHALLENGE)
    token, via = found
    principal = await verify(request, token, via)
    if principal is None:
        raise HTTPException(
            401,
            "unknown, revoked or expired token: ask an admin for a new one (hpc-ds1 token create)"
            if via == "bearer"
            else f"the console session is over: {session_problem(request)} Sign in again.",
            _CHALLENGE,
        )
    if via == "cookie" and request.method not in _SAFE_METHODS and not same_origin(request):
        log.info("auth_rejected", reason="cross-origin cookie request", path=request.url.path)
        raise HTTPException(
            403,
            "a request authenticated by the session cookie that changes something must come "
            "from this origin (an Origin header matching Host) or carry an X-Requested-With "
            "header; scripts should send 'Authorization: Bearer <token>'",
        )
    request.state.principal = principal
    request.state.via = via
    return principal


def _admit(request: Request, principal: Principal) -> Principal:
    log.info(
        "authorized",
        who=principal.name,
        role=principal.role,
        token_id=principal.token_id,
        via=getattr(request.state, "via", None),
        path=request.url.path,
    )
    return principal


def require(role: str) -> Callable[[Request], Awaitable[Principal]]:
    """A dependency that returns the caller's Principal when it may act as `role`."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; the roles are: {', '.join(ROLES)}")

    async def dependency(request: Request) -> Principal:
        principal = await _identify(request, role)
        if not role_allows(principal.role, role):
            needed = "an agent token" if role == "agent" else _needed(role)
            raise HTTPException(
                403,
                f"{principal.name} holds a {principal.role} token; this needs {needed}",
            )
        return _admit(request, principal)

    dependency.__name__ = f"require_{role}"
    return dependency


def _needed(role: str) -> str:
    higher = [r for r in ROLES if r != "agent" and role_allows(r, role)]
    return "a token of role " + " or ".join(higher)


async def authenticated(request: Request) -> Principal:
    """The caller's Principal, of any role (agents included); 401 without a valid token."""
    return _admit(request, await _identify(request, "valid"))


class WhoAmI(BaseModel):
    name: str
    role: str
    token_id: str
    via: Literal["bearer", "cookie"]
    # A console session's public id, and the person at the site's OpenID provider.
    session_id: str | None = None
    identity: str | None = None
    expires_at: str | None = None  # the token's expiry (None: none, or a session)


router = APIRouter(tags=["auth"])


@router.get("/v1/whoami", responses=ERRORS_401_403, response_model_exclude_none=True)
async def whoami(
    request: Request, principal: Annotated[Principal, Depends(authenticated)]
) -> WhoAmI:
    """Who this request acts as: the token's holder, role and public id, and whether the
    token came as a bearer header or as the login cookie."""
    return WhoAmI(
        name=principal.name,
        role=principal.role,
        token_id=principal.token_id,
        via=getattr(request.state, "via", "bearer"),
        session_id=principal.session_id,
        identity=principal.identity,
        expires_at=principal.expires_at.isoformat() if principal.expires_at else None,
    )


async def login_exchange(request: Request, token: str) -> RedirectResponse | JSONResponse:
    """GET /?token=<one-time token>: trade it, once, for a console session of the home's owner
    (admin), then back to /."""
    context = _context(request)
    address = client_address(request)
    wait = context.failures.wait(address)
    if wait > 0:
        _rejected(context, request, address, "too many failed authentications")
        body = ErrorBody(
            error="too many failed authentications from this address: retry in "
            f"{retry_after(wait)['Retry-After']} s"
        )
        return JSONResponse(body.model_dump(), status_code=429, headers=retry_after(wait))
    used = await asyncio.to_thread(consume_login_token, context.settings.home, token)
    if not used:
        context.failures.spend(address)
        _rejected(context, request, address, "unknown or used one-time login token")
        body = ErrorBody(
            error="this login link was already used or is not valid: run `hpc-ds1 token login` "
            "on the home for a new one"
        )
        return JSONResponse(body.model_dump(), status_code=401)
    response = RedirectResponse("/", status_code=303)
    await open_session(request, response, name=owner_name(), role="admin", via="login-link")
    return response
