"""The site's sign-in: the console signs people in at the site's OpenID Connect provider
(issue 45; docs/sign-in.md).

With HPC_DS1_OIDC_ISSUER, HPC_DS1_OIDC_CLIENT_ID and HPC_DS1_OIDC_CLIENT_SECRET set:

- `GET /auth/oidc/login`: the authorization code flow with PKCE (S256), a `state` and a
  `nonce`. What the callback needs (the PKCE verifier, the nonce) waits in Postgres under the
  state's SHA-256, so the browser may come back to any gateway replica; the state also goes in
  a short-lived cookie of this browser (SameSite=Lax: it must come back on the provider's
  redirect), so a callback this browser did not start is refused (login CSRF).
- `GET /auth/oidc/callback`: the code is traded at the token endpoint (with the verifier and
  the client's secret); the ID token's signature is checked with the provider's key (JWKS,
  cached by `kid`, fetched again when a token names a key not seen yet: the provider rotated),
  its issuer, audience (and `azp`), expiry and nonce too. The person's claims come from the ID
  token and the userinfo endpoint (same `sub` required); HPC_DS1_OIDC_ROLE_CLAIM's value(s)
  map to a role through HPC_DS1_OIDC_ROLES (the highest wins), else HPC_DS1_OIDC_DEFAULT_ROLE,
  else the person is refused. The console session opened then records who the person is at
  the provider (`<issuer>#<sub>`): approvals made in it carry it, and it keeps the ID token,
  sealed with the cookie's secret (signins.py), for the sign-out.
- `POST /signout` (console/page.py) of a session opened here, when the provider's discovery
  document names an `end_session_endpoint` (OpenID Connect RP-Initiated Logout 1.0): the
  console's session ends, then the browser goes on to the provider's end_session_endpoint with
  `id_token_hint` (that sign-in's ID token: the only URL an ID token is ever put in),
  `client_id`, `post_logout_redirect_uri` (the console's sign-in page, registered at the
  provider: HPC_DS1_OIDC_POST_LOGOUT_REDIRECT_URL) and a `state`, which a short cookie of this
  browser holds too; the sign-in page it comes back to says "Signed out." when they match.

JWT verification is PyJWT's (with `cryptography`): a well-kept library that checks the
signature, `exp`, `iat`, `iss` and `aud` for us; the flow around it is a few HTTP calls, kept
here so each check is visible. Tokens, codes, secrets and verifiers are never logged."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field
from html import escape
from typing import Any, Final
from urllib.parse import urlencode, urlsplit

import httpx
import jwt
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from sqlalchemy import Engine, delete, func, insert, text

from hpc_ds1.db import tables
from hpc_ds1.log import get_logger
from hpc_ds1.security.tokens import PERSON_ROLES
from hpc_ds1.settings import Settings

from .auth import open_session
from .ratelimit import client_address

log = get_logger("gateway.oidc")

LOGIN_PATH: Final = "/auth/oidc/login"
CALLBACK_PATH: Final = "/auth/oidc/callback"
STATE_COOKIE: Final = "hpc_ds1_oidc"
SIGNOUT_COOKIE: Final = "hpc_ds1_signout"  # the provider's sign-out under way: its state
LOGIN_TTL_S: Final = 600  # a sign-in started must come back within this
METADATA_TTL_S: Final = 3600.0  # the discovery document is read again after this
JWKS_REFETCH_S: Final = 10.0  # an unknown `kid` fetches the keys again at most this often
HTTP_TIMEOUT_S: Final = 10.0
LEEWAY_S: Final = 60  # clock skew allowed on exp/iat/nbf
# Asymmetric algorithms only: never 'none', never HS* (the client secret would be the key).
ALGORITHMS: Final = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
_RANK: Final = {role: rank for rank, role in enumerate(PERSON_ROLES)}
NAME_MAX: Final = 128


class SignInError(Exception):
    """A sign-in that cannot go on; the message is shown on the sign-in page (no secret in it)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Provider:
    """The provider's discovery document and signing keys, cached."""

    issuer: str
    http: httpx.AsyncClient
    metadata: dict[str, Any] | None = None
    metadata_at: float = float("-inf")
    keys: dict[str, jwt.PyJWK] = field(default_factory=dict)
    keys_at: float = float("-inf")
    key_fetches: int = 0  # how many times the JWKS was fetched (tests, docs)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def _get_json(self, url: str, what: str) -> dict[str, Any]:
        try:
            reply = await self.http.get(url, headers={"Accept": "application/json"})
        except httpx.HTTPError as error:
            raise SignInError(
                f"the sign-in provider did not answer ({what}: {type(error).__name__})", 502
            ) from None
        if reply.status_code != 200:
            raise SignInError(f"the sign-in provider answered {reply.status_code} ({what})", 502)
        try:
            body = reply.json()
        except ValueError:
            raise SignInError(f"the sign-in provider's {what} is not JSON", 502) from None
        if not isinstance(body, dict):
            raise SignInError(f"the sign-in provider's {what} is not a JSON object", 502)
        return body

    async def discover(self) -> dict[str, Any]:
        """The discovery document, whose `issuer` must be the configured one exactly."""
        if self.metadata is not None and time.monotonic() - self.metadata_at < METADATA_TTL_S:
            return self.metadata
        async with self._lock:
            if self.metadata is None or time.monotonic() - self.metadata_at >= METADATA_TTL_S:
                url = self.issuer.rstrip("/") + "/.well-known/openid-configuration"
                body = await self._get_json(url, "discovery document")
                if body.get("issuer") != self.issuer:
                    raise SignInError(
                        f"the provider calls itself {body.get('issuer')!r}, not "
                        f"HPC_DS1_OIDC_ISSUER {self.issuer!r}: set the issuer exactly as its "
                        "discovery document says",
                        502,
                    )
                for need in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
                    if not isinstance(body.get(need), str):
                        raise SignInError(f"the provider's discovery document has no {need}", 502)
                self.metadata, self.metadata_at = body, time.monotonic()
        return self.metadata

    async def key(self, kid: str | None) -> jwt.PyJWK:
        """The signing key named `kid` (or the only one, without a kid). An unknown kid fetches
        the JWKS again (the provider rotated its keys), at most every JWKS_REFETCH_S."""
        found = self._pick(kid)
        if found is not None:
            return found
        async with self._lock:
            found = self._pick(kid)
            if found is None and time.monotonic() - self.keys_at >= JWKS_REFETCH_S:
                await self._fetch_keys()
                found = self._pick(kid)
        if found is None:
            raise SignInError(
                f"the ID token is signed with a key the provider does not publish (kid {kid!r})",
                401,
            )
        return found

    def _pick(self, kid: str | None) -> jwt.PyJWK | None:
        if kid is not None:
            return self.keys.get(kid)
        signing = list(self.keys.values())
        return signing[0] if len(signing) == 1 else None

    async def _fetch_keys(self) -> None:
        metadata = self.metadata or {}
        body = await self._get_json(str(metadata["jwks_uri"]), "JWKS")
        keys: dict[str, jwt.PyJWK] = {}
        for number, entry in enumerate(body.get("keys") or []):
            if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
                continue
            try:
                key = jwt.PyJWK(entry)
            except (jwt.PyJWKError, jwt.InvalidKeyError):
                continue  # a key type this library does not take: not ours to use
            keys[str(entry.get("kid") or f"#{number}")] = key
        self.keys, self.keys_at = keys, time.monotonic()
        self.key_fetches += 1
        log.info("oidc_keys_fetched", keys=len(keys), kids=sorted(keys))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _sha256(value: str) -> str:
    return hashlib.sha256(value.encode("ascii")).hexdigest()


def _remember(engine: Engine, state: str, verifier: str, nonce: str) -> None:
    """Keep what the callback needs; forget sign-ins never finished. Blocking (DB)."""
    t = tables.oidc_logins
    with engine.begin() as conn:
        conn.execute(
            delete(t).where(t.c.created_at < func.now() - text(f"interval '{LOGIN_TTL_S} seconds'"))
        )
        conn.execute(
            insert(t).values(
                state_sha256=_sha256(state), verifier=verifier, nonce=nonce, created_at=func.now()
            )
        )


def _take(engine: Engine, state: str) -> tuple[str, str] | None:
    """(verifier, nonce) of a sign-in under way, once; None when unknown, used or too old."""
    t = tables.oidc_logins
    with engine.begin() as conn:
        row = conn.execute(
            delete(t)
            .where(
                t.c.state_sha256 == _sha256(state),
                t.c.created_at >= func.now() - text(f"interval '{LOGIN_TTL_S} seconds'"),
            )
            .returning(t.c.verifier, t.c.nonce)
        ).first()
    return None if row is None else (row.verifier, row.nonce)


def logout_url(
    endpoint: str, *, id_token: str, client_id: str, post_logout_redirect_uri: str, state: str
) -> str:
    """The provider's sign-out request (OpenID Connect RP-Initiated Logout 1.0, section 2): its
    end_session_endpoint with id_token_hint, client_id, post_logout_redirect_uri and state, the
    endpoint's own query kept."""
    query = urlencode(
        {
            "id_token_hint": id_token,
            "client_id": client_id,
            "post_logout_redirect_uri": post_logout_redirect_uri,
            "state": state,
        }
    )
    return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"


def end_session_endpoint(metadata: dict[str, Any]) -> str | None:
    """The discovery document's end_session_endpoint when it names one the browser may be sent
    to with an ID token (https, or http on this machine, no fragment); else None."""
    endpoint = metadata.get("end_session_endpoint")
    if not isinstance(endpoint, str) or not endpoint:
        return None
    parts = urlsplit(endpoint)
    loopback = parts.hostname in ("127.0.0.1", "localhost", "::1")
    if parts.scheme != "https" and not (parts.scheme == "http" and loopback):
        return None
    if not parts.hostname or parts.fragment:
        return None
    return endpoint


def role_of(settings: Settings, claims: dict[str, Any]) -> str | None:
    """The highest role the person's HPC_DS1_OIDC_ROLE_CLAIM values map to, else the default
    role (None: refused). A claim may be one string or a list of them."""
    value = claims.get(settings.oidc_role_claim)
    values = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    mapping = settings.oidc_roles
    roles = [mapping[v] for v in values if isinstance(v, str) and v in mapping]
    if not roles:
        return settings.oidc_default_role
    return max(roles, key=_RANK.__getitem__)


def name_of(settings: Settings, claims: dict[str, Any]) -> str:
    """Who the person is in approvals and logs: the name claim, then email, then sub."""
    for key in (settings.oidc_name_claim, "email", "sub"):
        value = claims.get(key)
        if isinstance(value, str) and value.strip():
            # Printable only: it goes into logs and the page.
            cleaned = "".join(ch for ch in value.strip() if ch.isprintable())
            if cleaned:
                return cleaned[:NAME_MAX]
    raise SignInError("the provider named no one (no sub claim)", 401)


@dataclass
class OidcClient:
    settings: Settings
    engine: Engine
    http: httpx.AsyncClient
    provider: Provider

    @property
    def client_id(self) -> str:
        return str(self.settings.oidc_client_id)

    def redirect_uri(self, request: Request) -> str:
        return self.settings.oidc_redirect_url or str(request.base_url).rstrip("/") + CALLBACK_PATH

    def post_logout_redirect_uri(self, request: Request) -> str:
        """The console's sign-in page, where the provider sends the browser after its sign-out."""
        return (
            self.settings.oidc_post_logout_redirect_url or str(request.base_url).rstrip("/") + "/"
        )

    async def sign_out(self, request: Request, id_token: str) -> Response | None:
        """The browser's way on to the provider's sign-out (the console's session has ended):
        a page of this origin that moves it to the end_session_endpoint (a redirect of the
        sign-out form's POST would be refused by the console page's CSP form-action 'self'),
        with the state's cookie set. None when the provider offers no sign-out (or did not
        answer): the console's sign-out alone, as for a token's session."""
        try:
            metadata = await self.provider.discover()
        except SignInError as error:
            log.warning("oidc_sign_out_not_at_provider", problem=str(error))
            return None
        endpoint = end_session_endpoint(metadata)
        if endpoint is None:
            return None
        state = secrets.token_urlsafe(32)
        url = logout_url(
            endpoint,
            id_token=id_token,
            client_id=self.client_id,
            post_logout_redirect_uri=self.post_logout_redirect_uri(request),
            state=state,
        )
        shown = escape(url, quote=True)
        response = HTMLResponse(
            _SIGN_OUT_ONWARD.format(url=shown, provider=escape(urlsplit(endpoint).netloc)),
            headers={"Cache-Control": "no-store"},  # it holds the ID token
        )
        response.set_cookie(
            SIGNOUT_COOKIE,
            state,
            max_age=LOGIN_TTL_S,
            httponly=True,
            samesite="lax",  # sent on the provider's redirect back (a top-level GET)
            secure=request.url.scheme == "https",
            path="/",
        )
        return response

    def back_from_sign_out(self, request: Request, state: str) -> bool:
        """Whether the provider sent back the state of a sign-out this browser started."""
        cookie = request.cookies.get(SIGNOUT_COOKIE) or ""
        return bool(cookie) and hmac.compare_digest(cookie.encode(), state.encode())

    @staticmethod
    def forget_sign_out(request: Request, response: Response) -> None:
        response.delete_cookie(
            SIGNOUT_COOKIE,
            path="/",
            httponly=True,
            samesite="lax",
            secure=request.url.scheme == "https",
        )

    async def start(self, request: Request) -> Response:
        metadata = await self.provider.discover()
        state, nonce = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        verifier = secrets.token_urlsafe(64)  # RFC 7636: 43 to 128 characters
        challenge = _b64(hashlib.sha256(verifier.encode("ascii")).digest())
        await asyncio.to_thread(_remember, self.engine, state, verifier, nonce)
        scopes = self.settings.oidc_scopes.split()
        if "openid" not in scopes:
            scopes.insert(0, "openid")
        query = urlencode(
            {
                "response_type": "code",
                "client_id": self.client_id,
                "redirect_uri": self.redirect_uri(request),
                "scope": " ".join(scopes),
                "state": state,
                "nonce": nonce,
                "code_challenge": challenge,
                "code_challenge_method": "S256",
            }
        )
        endpoint = str(metadata["authorization_endpoint"])
        response = RedirectResponse(
            f"{endpoint}{'&' if '?' in endpoint else '?'}{query}", status_code=303
        )
        response.set_cookie(
            STATE_COOKIE,
            state,
            max_age=LOGIN_TTL_S,
            httponly=True,
            samesite="lax",  # sent on the provider's redirect back (a top-level GET)
            secure=request.url.scheme == "https",
            path="/auth/oidc",
        )
        return response

    async def finish(self, request: Request, code: str, state: str) -> tuple[dict[str, Any], str]:
        """The verified claims of the person the provider signed in, and the ID token (kept,
        sealed, for the provider's sign-out; never logged)."""
        cookie = request.cookies.get(STATE_COOKIE) or ""
        if not cookie or not hmac.compare_digest(cookie.encode(), state.encode()):
            raise SignInError(
                "this sign-in was not started in this browser (or took over 10 minutes): "
                "sign in again"
            )
        pending = await asyncio.to_thread(_take, self.engine, state)
        if pending is None:
            raise SignInError("this sign-in was already used or is too old: sign in again")
        verifier, nonce = pending
        metadata = await self.provider.discover()
        answer = await self._token(request, metadata, code, verifier)
        id_token = answer.get("id_token")
        if not isinstance(id_token, str):
            raise SignInError("the provider's token answer holds no ID token", 502)
        claims = await self._verify(id_token, nonce)
        access = answer.get("access_token")
        userinfo = metadata.get("userinfo_endpoint")
        if isinstance(access, str) and isinstance(userinfo, str):
            more = await self._userinfo(userinfo, access)
            if more.get("sub") != claims["sub"]:
                raise SignInError("the provider's userinfo names someone else (sub)", 401)
            claims = {**more, **claims}  # the signed ID token's claims win
        return claims, id_token

    async def _token(
        self, request: Request, metadata: dict[str, Any], code: str, verifier: str
    ) -> dict[str, Any]:
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": self.redirect_uri(request),
            "code_verifier": verifier,
        }
        secret = self.settings.oidc_client_secret
        secret_text = secret.get_secret_value() if secret is not None else ""
        methods = metadata.get("token_endpoint_auth_methods_supported") or ["client_secret_basic"]
        headers: dict[str, str] = {}
        if "client_secret_basic" in methods:
            # RFC 6749 2.3.1: the id and secret are form-encoded before the Basic header.
            pair = f"{_form(self.client_id)}:{_form(secret_text)}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
        else:
            form |= {"client_id": self.client_id, "client_secret": secret_text}
        try:
            reply = await self.http.post(
                str(metadata["token_endpoint"]), data=form, headers=headers
            )
        except httpx.HTTPError as error:
            raise SignInError(
                f"the sign-in provider did not answer (token: {type(error).__name__})", 502
            ) from None
        try:
            body = reply.json()
        except ValueError:
            body = {}
        if reply.status_code != 200 or not isinstance(body, dict):
            # The provider's error code only (never the request: it holds the code and secret).
            said = body.get("error") if isinstance(body, dict) else None
            raise SignInError(
                f"the provider refused the code ({reply.status_code} {said or ''}): sign in again",
                401,
            )
        return body

    async def _verify(self, id_token: str, nonce: str) -> dict[str, Any]:
        try:
            header = jwt.get_unverified_header(id_token)
        except jwt.PyJWTError:
            raise SignInError("the ID token is not a JWT", 401) from None
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            raise SignInError(
                f"the ID token's algorithm {alg!r} is not accepted (accepted: "
                f"{', '.join(sorted(ALGORITHMS))})",
                401,
            )
        key = await self.provider.key(header.get("kid"))
        try:
            claims: dict[str, Any] = jwt.decode(
                id_token,
                key,
                algorithms=[str(alg)],
                audience=self.client_id,
                issuer=self.provider.issuer,
                leeway=LEEWAY_S,
                options={"require": ["exp", "iat", "iss", "aud", "sub"]},
            )
        except jwt.PyJWTError as error:
            raise SignInError(f"the ID token is not valid: {error}", 401) from None
        audience = claims.get("aud")
        if isinstance(audience, list) and len(audience) > 1 and claims.get("azp") != self.client_id:
            raise SignInError("the ID token was issued to another client (azp)", 401)
        if not hmac.compare_digest(str(claims.get("nonce", "")).encode(), nonce.encode()):
            raise SignInError("the ID token's nonce is not this sign-in's", 401)
        return claims

    async def _userinfo(self, url: str, access: str) -> dict[str, Any]:
        try:
            reply = await self.http.get(url, headers={"Authorization": f"Bearer {access}"})
        except httpx.HTTPError as error:
            raise SignInError(
                f"the sign-in provider did not answer (userinfo: {type(error).__name__})", 502
            ) from None
        if reply.status_code != 200:
            raise SignInError(f"the provider's userinfo answered {reply.status_code}", 502)
        try:
            body = reply.json()
        except ValueError:
            raise SignInError("the provider's userinfo is not JSON", 502) from None
        if not isinstance(body, dict):
            raise SignInError("the provider's userinfo is not a JSON object", 502)
        return body


def _form(value: str) -> str:
    from urllib.parse import quote_plus

    return quote_plus(value)


# After the callback (a navigation that came from the provider's site), a SameSite=Strict
# cookie set on a redirect is not sent with the redirect's next request: a page of this origin
# moves the browser on instead, and its own navigation carries the new cookie.
_ONWARD = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="0; url=/">
<title>Signed in · HPC-DS1</title></head>
<body><p>Signed in. <a href="/">Open the console</a>.</p></body></html>
"""

# After the console's sign-out, on to the provider's: a page, not a redirect of the form's POST
# (the console page's CSP has form-action 'self', which browsers apply to a form's redirects).
_SIGN_OUT_ONWARD = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="0; url={url}">
<title>Signing out · HPC-DS1</title></head>
<body><p>Signed out of the console. <a id="signout-provider" href="{url}">Sign out at
{provider} too</a>.</p></body></html>
"""


def install_oidc(app: FastAPI, settings: Settings, engine: Engine) -> OidcClient | None:
    """GET /auth/oidc/login and /auth/oidc/callback, when HPC_DS1_OIDC_ISSUER is set."""
    if settings.oidc_issuer is None:
        return None
    http = httpx.AsyncClient(timeout=HTTP_TIMEOUT_S, follow_redirects=False)
    client = OidcClient(settings, engine, http, Provider(settings.oidc_issuer, http))
    app.state.oidc = client

    def refused(request: Request, message: str, status: int) -> Response:
        page: Any = app.state.signin_page
        response: HTMLResponse = page(request, f"Sign-in refused: {message}", status=status)
        response.delete_cookie(STATE_COOKIE, path="/auth/oidc")
        return response

    @app.get(LOGIN_PATH, include_in_schema=False, response_model=None)
    async def oidc_login(request: Request) -> Response:
        try:
            return await client.start(request)
        except SignInError as error:
            log.warning("oidc_login_failed", problem=str(error))
            return refused(request, str(error), error.status)

    @app.get(CALLBACK_PATH, include_in_schema=False, response_model=None)
    async def oidc_callback(
        request: Request,
        code: str | None = None,
        state: str | None = None,
        error: str | None = None,
    ) -> Response:
        address = client_address(request)
        if error is not None:
            # The provider's own error code (e.g. access_denied), shown escaped, cut short.
            log.info("oidc_sign_in_refused_by_provider", error=error[:64], client=address)
            return refused(request, f"the provider answered {error[:64]!r}", 401)
        if not code or not state:
            return refused(request, "the provider's answer has no code or state", 400)
        try:
            claims, id_token = await client.finish(request, code, state)
            name = name_of(settings, claims)
            role = role_of(settings, claims)
            if role is None:
                raise SignInError(
                    f"{name} signed in at the provider, but no value of their "
                    f"{settings.oidc_role_claim!r} claim maps to a role here "
                    "(HPC_DS1_OIDC_ROLES): ask an admin",
                    403,
                )
        except SignInError as problem:
            log.warning("oidc_sign_in_failed", problem=str(problem), client=address)
            return refused(request, str(problem), problem.status)
        response = HTMLResponse(_ONWARD)
        await open_session(
            request,
            response,
            name=name,
            role=role,
            via="oidc",
            identity=f"{settings.oidc_issuer}#{claims['sub']}",
            id_token=id_token,
        )
        response.delete_cookie(STATE_COOKIE, path="/auth/oidc")
        return response

    return client
