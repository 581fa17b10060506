"""Who is calling: bearer tokens looked up by their SHA-256, and the loopback policy.

Policy: `require("viewer")` lets an anonymous request read when the gateway listens on loopback
only; beyond loopback reading needs a viewer (or higher) token. `require("engineer")` always
needs an engineer or admin token. A token that is given is always checked: unknown or revoked is
401, too low a role is 403. Tokens are never logged or echoed; only their public ids are.

Wiring (in create_app): `install_auth(app, settings, engine)` once, then use the dependencies:
`Depends(require("engineer"))`, `Depends(optional_principal)`."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from sqlalchemy import Engine

from hpc_ds1.log import get_logger
from hpc_ds1.settings import Settings
from hpc_ds1.tokens import ANONYMOUS_LOCAL, ROLES, Principal, lookup, role_allows

log = get_logger("gateway.auth")

_CHALLENGE = {"WWW-Authenticate": "Bearer"}


@dataclass(frozen=True)
class AuthContext:
    settings: Settings
    engine: Engine

    @property
    def loopback(self) -> bool:
        return listens_on_loopback(self.settings.host)


def listens_on_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost; False for 0.0.0.0, :: and real addresses."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def install_auth(app: FastAPI, settings: Settings, engine: Engine) -> None:
    """Give the auth dependencies the settings (listening host) and the tokens table."""
    app.state.auth = AuthContext(settings, engine)


def _context(request: Request) -> AuthContext:
    context = getattr(request.app.state, "auth", None)
    if not isinstance(context, AuthContext):
        raise RuntimeError("install_auth(app, settings, engine) was not called on this app")
    return context


def _bearer(request: Request) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None without the header."""
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        # Never echo the header: it may hold a secret in another scheme.
        raise HTTPException(401, "the Authorization header must be 'Bearer <token>'", _CHALLENGE)
    return value.strip()


async def _identify(request: Request) -> Principal | None:
    """The token's holder; None when no token is given; 401 for an unknown or revoked one."""
    token = _bearer(request)
    if token is None:
        return None
    context = _context(request)
    principal = await asyncio.to_thread(lookup, context.engine, token)
    if principal is None:
        log.info("auth_rejected", reason="unknown or revoked token", path=request.url.path)
        raise HTTPException(
            401,
            "unknown or revoked token: ask an admin for a new one (hpc-ds1 token create)",
            _CHALLENGE,
        )
    return principal


def _admit(request: Request, principal: Principal) -> Principal:
    request.state.principal = principal
    request.state.actor = principal.name
    # The anonymous local reader would be one line per page view: debug only.
    (log.debug if principal.anonymous else log.info)(
        "authorized",
        who=principal.name,
        role=principal.role,
        token_id=principal.token_id,
        path=request.url.path,
    )
    return principal


def require(role: str) -> Callable[[Request], Awaitable[Principal]]:
    """A dependency that returns the caller's Principal when it may act as `role`."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; the roles are: {', '.join(ROLES)}")

    async def dependency(request: Request) -> Principal:
        principal = await _identify(request)
        if principal is None:
            if role == "viewer" and _context(request).loopback:
                return _admit(request, ANONYMOUS_LOCAL)
            where = "" if role != "viewer" else " (the gateway listens beyond loopback)"
            raise HTTPException(
                401,
                f"this needs a {role} token{where}: send 'Authorization: Bearer <token>'; "
                f"create one with: hpc-ds1 token create --name NAME --role {role}",
                _CHALLENGE,
            )
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


async def optional_principal(request: Request) -> Principal:
    """The token's holder when a token is given (any role); otherwise the anonymous local user
    when the gateway listens on loopback; otherwise 401. Sets `request.state.actor`."""
    principal = await _identify(request)
    if principal is None:
        if not _context(request).loopback:
            raise HTTPException(
                401,
                "this gateway listens beyond loopback: send 'Authorization: Bearer <token>'",
                _CHALLENGE,
            )
        principal = ANONYMOUS_LOCAL
    return _admit(request, principal)


def auth_router(settings: Settings, engine: Engine) -> APIRouter:
    """GET /v1/whoami. The app must also get `install_auth(app, settings, engine)`."""
    router = APIRouter(tags=["auth"])

    @router.get("/v1/whoami")
    async def whoami(
        principal: Annotated[Principal, Depends(optional_principal)],
    ) -> dict[str, Any]:
        """Who this request acts as: a token's holder and role, or the anonymous local reader."""
        return {
            "name": principal.name,
            "role": principal.role,
            "token_id": principal.token_id,
            "anonymous": principal.anonymous,
            "loopback": listens_on_loopback(settings.host),
        }

    return router
