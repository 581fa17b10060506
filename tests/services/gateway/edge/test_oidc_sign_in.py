"""The site's sign-in against a real OpenID provider (npm oidc-provider, tests/console/oidc.py),
without a browser: the code flow with PKCE through the gateway's routes, the role from the
`groups` claim, a person with no mapped group refused, a callback this browser did not start
refused, an ID token signed by a key the provider does not publish refused, and the provider's
key rotation followed (an unknown `kid` fetches the JWKS again). Signing out of a session opened
there goes on to the provider's sign-out (RP-Initiated Logout: the URL built, the ID token kept
sealed with the cookie's secret and forgotten at the end); a token's session, or a provider with
no end_session_endpoint, signs out of the console only."""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator, Iterator
from html import unescape
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import httpx
import jwt
import pytest
from fastapi import FastAPI
from pydantic import SecretStr
from sqlalchemy import Engine, select

from hpc_ds1.db import tables
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.services.gateway import create_app
from hpc_ds1.services.gateway.edge import oidc, signins
from hpc_ds1.services.gateway.edge.auth import SESSION_COOKIE
from hpc_ds1.settings import Settings
from tests.console.oidc import ACCOUNTS, CLIENT_ID, OidcProvider, node_modules, signing_key
from tests.support.gateway import ROLE_TOKENS, fold, role_token_events

GATEWAY = "http://gw"


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OidcProvider]:
    modules = node_modules()
    if isinstance(modules, str):
        pytest.skip(modules)
    scratch = tmp_path_factory.mktemp("oidc")
    running = OidcProvider(
        modules,
        scratch,
        [f"{GATEWAY}{oidc.CALLBACK_PATH}"],
        [signing_key("k1")],
        post_logout_redirect_uris=[f"{GATEWAY}/"],
    ).start()
    yield running
    running.stop()


@pytest.fixture
async def app(settings: Settings, bus: EventBus, engine: Engine, provider: OidcProvider) -> Any:
    env = provider.env()
    configured = settings.model_copy(
        update={
            "oidc_issuer": env["HPC_DS1_OIDC_ISSUER"],
            "oidc_client_id": CLIENT_ID,
            "oidc_client_secret": SecretStr(provider.client_secret),
            "oidc_roles": {"hpc-engineers": "engineer", "hpc-admins": "admin"},
        }
    )
    return create_app(configured, bus, engine)


@pytest.fixture
async def gateway(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=GATEWAY) as http:
        yield http


async def _at_provider(authorize: str, login: str, password: str) -> httpx.Response:
    """A browser at the provider: the authorization URL, its sign-in form, then the redirect
    back to the gateway (returned, not followed)."""
    async with httpx.AsyncClient(timeout=30) as browser:
        reply = await browser.get(authorize)
        while reply.status_code in (302, 303) and not reply.headers["location"].startswith(GATEWAY):
            reply = await browser.get(httpx.URL(str(reply.url)).join(reply.headers["location"]))
        assert reply.status_code == 200, reply.text
        action = re.search(r'action="([^"]+)"', reply.text)
        assert action, reply.text
        reply = await browser.post(
            httpx.URL(str(reply.url)).join(action.group(1)),
            data={"login": login, "password": password},
        )
        while reply.status_code in (302, 303) and not reply.headers["location"].startswith(GATEWAY):
            reply = await browser.get(httpx.URL(str(reply.url)).join(reply.headers["location"]))
        return reply


async def _sign_in(gateway: httpx.AsyncClient, login: str) -> httpx.Response:
    start = await gateway.get(oidc.LOGIN_PATH)
    assert start.status_code == 303, start.text
    authorize = start.headers["location"]
    query = dict(httpx.URL(authorize).params)
    assert query["code_challenge_method"] == "S256" and len(query["code_challenge"]) == 43
    assert query["client_id"] == CLIENT_ID and "openid" in query["scope"].split()
    assert "samesite=lax" in start.headers["set-cookie"].lower()
    back = await _at_provider(authorize, login, ACCOUNTS[login]["password"])
    assert back.status_code == 303, back.text
    where = urlsplit(back.headers["location"])
    return await gateway.get(f"{where.path}?{where.query}")


async def test_a_person_signs_in_at_the_provider_with_the_role_of_their_group(
    gateway: httpx.AsyncClient, app: FastAPI, provider: OidcProvider, monkeypatch: Any
) -> None:
    done = await _sign_in(gateway, "erin")
    assert done.status_code == 200 and 'http-equiv="refresh"' in done.text, done.text
    session = done.cookies[SESSION_COOKIE]
    gateway.cookies.clear()
    me = (await gateway.get("/v1/whoami", headers={"Cookie": f"{SESSION_COOKIE}={session}"})).json()
    assert me["name"] == "erin" and me["role"] == "engineer" and me["via"] == "cookie"
    assert me["identity"] == f"{provider.issuer}#erin"

    admin = await _sign_in(gateway, "ada")
    session = admin.cookies[SESSION_COOKIE]
    gateway.cookies.clear()
    me = (await gateway.get("/v1/whoami", headers={"Cookie": f"{SESSION_COOKIE}={session}"})).json()
    assert me["role"] == "admin"

    # A person none of whose groups maps to a role is refused, and told why.
    refused = await _sign_in(gateway, "nobody")
    assert refused.status_code == 403 and "HPC_DS1_OIDC_ROLES" in refused.text
    assert SESSION_COOKIE not in refused.cookies

    # The provider rotates its key: the ID token names a kid not seen yet, the keys are
    # fetched again, the sign-in works.
    client: oidc.OidcClient = app.state.oidc
    fetched = client.provider.key_fetches
    monkeypatch.setattr(oidc, "JWKS_REFETCH_S", 0.0)
    provider.restart([signing_key("k2"), *provider.keys])
    rotated = await _sign_in(gateway, "erin")
    assert rotated.status_code == 200, rotated.text
    assert client.provider.key_fetches == fetched + 1 and "k2" in client.provider.keys


async def test_a_callback_not_started_here_or_a_forged_token_is_refused(
    gateway: httpx.AsyncClient, app: FastAPI, tmp_path: Path
) -> None:
    start = await gateway.get(oidc.LOGIN_PATH)
    state = dict(httpx.URL(start.headers["location"]).params)["state"]
    gateway.cookies.clear()  # another browser comes back with this state
    stranger = await gateway.get(oidc.CALLBACK_PATH, params={"code": "x", "state": state})
    assert stranger.status_code == 400 and "not started in this browser" in stranger.text
    denied = await gateway.get(oidc.CALLBACK_PATH, params={"error": "access_denied"})
    assert denied.status_code == 401 and "access_denied" in denied.text

    # An ID token signed with a key the provider does not publish.
    client: oidc.OidcClient = app.state.oidc
    await client.provider.discover()
    forged_key = signing_key("k-forged")
    forged = jwt.encode(
        {"iss": client.provider.issuer, "aud": CLIENT_ID, "sub": "erin", "nonce": "n"},
        jwt.PyJWK(forged_key).key,
        algorithm="RS256",
        headers={"kid": "k-forged"},
    )
    with pytest.raises(oidc.SignInError, match="does not publish"):
        await client._verify(forged, "n")
    unsigned = jwt.encode({"sub": "erin"}, key="", algorithm="none")
    with pytest.raises(oidc.SignInError, match="not accepted"):
        await client._verify(unsigned, "n")


ORIGIN = {"Origin": GATEWAY}


def _as(session: str) -> dict[str, str]:
    return {"Cookie": f"{SESSION_COOKIE}={session}", **ORIGIN}


def test_the_provider_sign_out_url_carries_the_hint_client_return_and_state() -> None:
    url = oidc.logout_url(
        "https://op.example/logout?tenant=hpc",
        id_token="eyJ.a.b",
        client_id="console",
        post_logout_redirect_uri="https://console.example/",
        state="s-1",
    )
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc, parts.path) == ("https", "op.example", "/logout")
    assert dict(parse_qsl(parts.query)) == {
        "tenant": "hpc",  # the endpoint's own query is kept
        "id_token_hint": "eyJ.a.b",
        "client_id": "console",
        "post_logout_redirect_uri": "https://console.example/",
        "state": "s-1",
    }
    assert oidc.logout_url(
        "https://op.example/end",
        id_token="t",
        client_id="c",
        post_logout_redirect_uri="u",
        state="s",
    ).startswith("https://op.example/end?id_token_hint=t&")
    # Only an endpoint the browser may be sent to with an ID token.
    endpoint = oidc.end_session_endpoint
    assert endpoint({"end_session_endpoint": "https://op.example/end"}) == "https://op.example/end"
    assert endpoint({"end_session_endpoint": "http://localhost:9/end"}) == "http://localhost:9/end"
    assert endpoint({}) is None
    assert endpoint({"end_session_endpoint": "http://op.example/end"}) is None
    assert endpoint({"end_session_endpoint": "https://op.example/end#x"}) is None
    assert endpoint({"end_session_endpoint": ["https://op.example/end"]}) is None


def test_the_id_token_is_sealed_for_its_session_and_cookie_only() -> None:
    secret, other = "s" * 43, "t" * 43
    sealed = signins.seal_id_token(secret, "ses_1", "eyJhbGciOi.payload.signature")
    assert "payload" not in sealed and sealed != signins.seal_id_token(secret, "ses_1", "x")
    assert signins.unseal_id_token(secret, "ses_1", sealed) == "eyJhbGciOi.payload.signature"
    assert signins.unseal_id_token(other, "ses_1", sealed) is None  # another cookie
    assert signins.unseal_id_token(secret, "ses_2", sealed) is None  # another session's row
    assert signins.unseal_id_token(secret, "ses_1", sealed[:-4] + "AAAA") is None
    assert signins.unseal_id_token(secret, "ses_1", None) is None


async def test_signing_out_of_a_provider_session_goes_on_to_the_provider_sign_out(
    gateway: httpx.AsyncClient, app: FastAPI, engine: Engine, provider: OidcProvider
) -> None:
    done = await _sign_in(gateway, "erin")
    session = done.cookies[SESSION_COOKIE]
    gateway.cookies.clear()
    cs = tables.console_sessions
    row = cs.c.sha256 == hashlib.sha256(session.encode()).hexdigest()
    with engine.connect() as conn:
        sealed = conn.execute(select(cs.c.id_token_sealed).where(row)).scalar_one()
    assert sealed and sealed.startswith("v1.") and "eyJ" not in sealed  # no readable JWT

    # A cross-site form cannot sign her out (nor send her to the provider).
    cross = await gateway.post("/signout", headers={**_as(session), "Origin": "http://evil"})
    assert cross.status_code == 403

    out = await gateway.post("/signout", headers=_as(session))
    assert out.status_code == 200 and out.headers["cache-control"] == "no-store", out.text
    assert "form-action 'self'" in out.headers["content-security-policy"]
    found = re.search(r'content="0; url=([^"]+)"', out.text)
    assert found, out.text
    url = unescape(found.group(1))
    metadata = await app.state.oidc.provider.discover()
    assert url.startswith(metadata["end_session_endpoint"] + "?"), url
    query = dict(parse_qsl(urlsplit(url).query))
    assert set(query) == {"id_token_hint", "client_id", "post_logout_redirect_uri", "state"}
    assert query["client_id"] == CLIENT_ID and query["post_logout_redirect_uri"] == GATEWAY + "/"
    hint = jwt.decode(query["id_token_hint"], options={"verify_signature": False})
    assert hint["sub"] == "erin" and hint["aud"] == CLIENT_ID and hint["iss"] == provider.issuer
    cookies = out.headers.get_list("set-cookie")
    state_cookie = next(c for c in cookies if c.startswith(oidc.SIGNOUT_COOKIE + "="))
    assert f"{oidc.SIGNOUT_COOKIE}={query['state']}" in state_cookie
    assert "samesite=lax" in state_cookie.lower() and "httponly" in state_cookie.lower()
    assert any(c.startswith(f"{SESSION_COOKIE}=") and "max-age=0" in c.lower() for c in cookies)
    assert query["id_token_hint"] not in " ".join(cookies)
    gateway.cookies.clear()

    # The session is over, and its row forgot the ID token.
    replayed = await gateway.get("/v1/whoami", headers={"Cookie": f"{SESSION_COOKIE}={session}"})
    assert replayed.status_code == 401 and "signed out" in replayed.json()["error"]
    with engine.connect() as conn:
        assert conn.execute(select(cs.c.id_token_sealed).where(row)).scalar_one() is None

    # The provider's sign-out accepts the request: no error, on to its confirmation (this
    # client holds no session there: the form posts itself).
    async with httpx.AsyncClient(timeout=30) as browser:
        asked = await browser.get(url)
    assert asked.status_code == 200 and "/session/end/confirm" in asked.text, asked.text

    # Back on the sign-in page with this browser's state: "Signed out.", the cookie forgotten;
    # with another state, the sign-in page says nothing of it.
    back = await gateway.get(
        "/", params={"state": query["state"]}, headers={"Cookie": state_cookie.split(";")[0]}
    )
    assert back.status_code == 200 and "Signed out." in back.text
    assert any(
        c.startswith(oidc.SIGNOUT_COOKIE + "=") and "max-age=0" in c.lower()
        for c in back.headers.get_list("set-cookie")
    )
    gateway.cookies.clear()
    stranger = await gateway.get(
        "/", params={"state": "other"}, headers={"Cookie": state_cookie.split(";")[0]}
    )
    assert stranger.status_code == 200 and "Signed out." not in stranger.text
    assert 'id="signin-oidc"' in stranger.text


async def test_a_token_session_or_a_provider_without_sign_out_signs_out_here_only(
    gateway: httpx.AsyncClient,
    app: FastAPI,
    settings: Settings,
    bus: EventBus,
    engine: Engine,
    monkeypatch: Any,
) -> None:
    await fold(settings, bus, engine, *role_token_events())
    signed = await gateway.post("/", data={"token": ROLE_TOKENS["engineer"]}, headers=ORIGIN)
    assert signed.status_code == 303, signed.text
    session = signed.cookies[SESSION_COOKIE]
    gateway.cookies.clear()
    out = await gateway.post("/signout", headers=_as(session))
    assert out.status_code == 303 and out.headers["location"] == "/?signed_out=1"
    assert oidc.SIGNOUT_COOKIE not in out.headers.get("set-cookie", "")
    gateway.cookies.clear()

    # A provider whose discovery document names no end_session_endpoint.
    client: oidc.OidcClient = app.state.oidc
    metadata = dict(await client.provider.discover())
    metadata.pop("end_session_endpoint")
    monkeypatch.setattr(client.provider, "metadata", metadata)
    done = await _sign_in(gateway, "erin")
    session = done.cookies[SESSION_COOKIE]
    gateway.cookies.clear()
    out = await gateway.post("/signout", headers=_as(session))
    assert out.status_code == 303 and out.headers["location"] == "/?signed_out=1"
    assert oidc.SIGNOUT_COOKIE not in out.headers.get("set-cookie", "")
    gateway.cookies.clear()
    replayed = await gateway.get("/v1/whoami", headers={"Cookie": f"{SESSION_COOKIE}={session}"})
    assert replayed.status_code == 401
