"""The site's sign-in against a real OpenID provider (npm oidc-provider, tests/console/oidc.py),
without a browser: the code flow with PKCE through the gateway's routes, the role from the
`groups` claim, a person with no mapped group refused, a callback this browser did not start
refused, an ID token signed by a key the provider does not publish refused, and the provider's
key rotation followed (an unknown `kid` fetches the JWKS again)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import jwt
import pytest
from fastapi import FastAPI
from pydantic import SecretStr
from sqlalchemy import Engine

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.services.gateway import create_app
from hpc_ds1.services.gateway.edge import oidc
from hpc_ds1.services.gateway.edge.auth import SESSION_COOKIE
from hpc_ds1.settings import Settings
from tests.console.oidc import ACCOUNTS, CLIENT_ID, OidcProvider, node_modules, signing_key

GATEWAY = "http://gw"


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OidcProvider]:
    modules = node_modules()
    if isinstance(modules, str):
        pytest.skip(modules)
    scratch = tmp_path_factory.mktemp("oidc")
    running = OidcProvider(
        modules, scratch, [f"{GATEWAY}{oidc.CALLBACK_PATH}"], [signing_key("k1")]
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
