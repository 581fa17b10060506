"""The site's sign-in, end to end in the real browser (issue 45): a second gateway replica of the
console's server (`hpc-ds1 service gateway` on the same NATS, Postgres and stream) signs people
in at a real OpenID provider (npm oidc-provider, tests/console/oidc.py) on another site
(`localhost`, the console at 127.0.0.1). Erin signs in there, gets the engineer role from her
`groups` claim, approves a waiting move (recorded under her name and her identity at the
provider), signs out (the old cookie is refused) and is sent on to the provider's sign-out
(RP-Initiated Logout: her ID token as id_token_hint), which sends her back to the console's
sign-in page; her next sign-in asks for the provider's login again. Left idle past the
replica's short HPC_DS1_CONSOLE_IDLE_S, her new session is refused."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import httpx
import jwt
import pytest

from hpc_ds1.infra.ports import free_port
from hpc_ds1.workloads import get_workload
from tests.support.commands import HPC_DS1, cli_env
from tests.support.waiting import wait_for

from .oidc import ACCOUNTS, CLIENT_ID, OidcProvider, node_modules, signing_key
from .served import WORKLOAD, Console

IDLE_S = 4  # the replica's HPC_DS1_CONSOLE_IDLE_S: short, so the test waits seconds
READY_MS = 30_000
VIEWPORT = {"width": 1440, "height": 1000}
SESSION_SIZE = 50_000  # below the measured sizes: its first move waits for an engineer


@pytest.fixture(scope="module")
def replica(console: Console, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """(the provider, the replica's base URL): the provider, then a gateway replica that signs
    in there, both stopped after the module."""
    modules = node_modules()
    if isinstance(modules, str):
        pytest.skip(modules)
    scratch = tmp_path_factory.mktemp("oidc-browser")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    provider = OidcProvider(
        modules,
        scratch,
        [f"{base}/auth/oidc/callback"],
        [signing_key("k1")],
        post_logout_redirect_uris=[f"{base}/"],
    ).start()
    env = {
        **cli_env(console.settings),
        **provider.env(),
        "HPC_DS1_HOST": "127.0.0.1",
        "HPC_DS1_PORT": str(port),
        "HPC_DS1_CONSOLE_IDLE_S": str(IDLE_S),
    }
    log = open(scratch / "replica.err", "w")
    proc = subprocess.Popen(
        [HPC_DS1, "service", "gateway"], env=env, stdout=log, stderr=log, start_new_session=True
    )
    try:

        def up() -> bool:
            assert proc.poll() is None, (scratch / "replica.err").read_text()[-3000:]
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
            return False

        wait_for("the replica answers", up, 60, every_s=0.3)
        yield provider, base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()
        provider.stop()


def _waiting_approval(console: Console) -> dict[str, Any]:
    """A tuning session of its own whose first move waits for an engineer."""
    wl = get_workload(WORKLOAD)
    start = {"ranks": 1, "threads": 1, "tile": wl.default_tile}
    reply = console.api(
        "POST", "/v1/sessions", json={"workload": WORKLOAD, "size": SESSION_SIZE, "start": start}
    )
    assert reply.status_code in (200, 201, 202), reply.text
    session_id = reply.json()["session_id"]

    def waiting() -> list[dict[str, Any]]:
        rows = console.get("/v1/approvals")["approvals"]
        return [a for a in rows if a["session_id"] == session_id]

    found: dict[str, Any] = wait_for(
        "the new session's move waits", waiting, 180, every_s=0.3, context=console.log_tail
    )[0]
    return found


def test_sign_in_at_the_provider_approve_sign_out_there_too_and_idle_expiry(
    browser: Any, console: Console, replica: Any
) -> None:
    provider, base = replica
    approval = _waiting_approval(console)
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    try:
        # The sign-in page offers the site's provider; the provider's own form signs erin in.
        page.goto(base + "/")
        page.get_by_role("link", name=re.compile("Sign in with localhost")).click()
        page.wait_for_selector("#login", timeout=READY_MS)
        assert page.url.startswith(provider.issuer), page.url
        page.fill("#login", "erin")
        page.fill("#password", ACCOUNTS["erin"]["password"])
        page.click("#submit")
        page.wait_for_selector("body[data-ready='true']", timeout=READY_MS)
        assert page.url.rstrip("/") == base, page.url
        # Her role from her group, her name from the provider.
        assert " ".join(page.inner_text("#whoami").split()) == "erin · engineer"
        cookies = {c["name"]: c for c in context.cookies(base)}
        session = cookies["hpc_ds1_session"]
        assert session["httpOnly"] and session["sameSite"] == "Strict"
        me = httpx.get(
            f"{base}/v1/whoami", cookies={"hpc_ds1_session": session["value"]}, timeout=30
        ).json()
        assert me["identity"] == f"{provider.issuer}#erin"

        # She approves the waiting move from the page: recorded under her name and identity.
        row = page.locator(
            f"#approvals [data-part='waiting'] [data-approval-id='{approval['approval_id']}']"
        )
        row.wait_for(timeout=READY_MS)
        row.get_by_role("button", name=re.compile("approve", re.I)).click()

        def decided() -> dict[str, Any] | None:
            rows = console.get("/v1/approvals?status=decided")["approvals"]
            return next((a for a in rows if a["approval_id"] == approval["approval_id"]), None)

        done = wait_for("the approval recorded", decided, 30, every_s=0.3, context=console.log_tail)
        assert done["status"] == "approved" and done["decided_by"] == "erin", done
        events = console.get("/v1/events?type=approval.decided&limit=1000")["events"]
        event = next(e for e in events if e["data"]["approval_id"] == approval["approval_id"])
        assert event["actor"] == "erin" and event["data"]["role"] == "engineer"
        assert event["data"]["identity"] == f"{provider.issuer}#erin"

        # Sign-out ends the session on the server, then goes on to the provider's sign-out
        # (RP-Initiated Logout) with her ID token, the client, where to come back and a state.
        page.click("#signout")
        page.wait_for_selector("#logout-yes", timeout=READY_MS)
        asked = urlsplit(page.url)
        assert f"{asked.scheme}://{asked.netloc}" == provider.issuer, page.url
        query = dict(parse_qsl(asked.query))
        assert query["client_id"] == CLIENT_ID and query["post_logout_redirect_uri"] == base + "/"
        assert len(query["state"]) >= 32
        hint = jwt.decode(query["id_token_hint"], options={"verify_signature": False})
        assert hint["sub"] == "erin" and hint["aud"] == CLIENT_ID, hint
        replayed = httpx.get(
            f"{base}/v1/whoami", cookies={"hpc_ds1_session": session["value"]}, timeout=30
        )
        assert replayed.status_code == 401 and "signed out" in replayed.json()["error"]
        assert "hpc_ds1_session" not in {c["name"] for c in context.cookies(base)}

        # She confirms at the provider and lands back on the console's sign-in page.
        page.click("#logout-yes")
        page.wait_for_selector("text=Signed out.", timeout=READY_MS)
        assert page.url.startswith(base + "/?state="), page.url
        assert page.locator("#facility").count() == 0
        assert "hpc_ds1_signout" not in {c["name"] for c in context.cookies(base)}

        # The provider's session ended too: the next sign-in asks for her login again. Then,
        # idle past IDLE_S, that session is refused.
        page.get_by_role("link", name=re.compile("Sign in with localhost")).click()
        page.wait_for_selector("#login", timeout=READY_MS)
        assert page.url.startswith(provider.issuer), page.url
        page.fill("#login", "erin")
        page.fill("#password", ACCOUNTS["erin"]["password"])
        page.click("#submit")
        page.wait_for_selector("body[data-ready='true']", timeout=READY_MS)
        assert "erin" in page.inner_text("#whoami")
        page.close()  # an open console refreshes itself; a closed one is idle
        time.sleep(IDLE_S + 1.5)
        page = context.new_page()
        reply = page.goto(base + "/")
        assert reply is not None and reply.status == 401
        assert "unused too long" in page.inner_text("body")
        assert page.locator("#facility").count() == 0
    finally:
        context.close()
