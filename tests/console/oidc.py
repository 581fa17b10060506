"""A real OpenID provider for the sign-in tests (issue 45): the npm `oidc-provider` (certified),
run by node from tests/console/js/oidc_provider.mjs with one static client (its redirect URIs and
post-logout redirect URIs: RP-Initiated Logout is on) and three users:

- erin (password erin-pw): groups hpc-engineers and staff -> engineer
- ada (password ada-pw): group hpc-admins -> admin
- nobody (password nobody-pw): group staff only -> no role here (refused)

The package is installed once per checkout into build/npm/ (gitignored), as the fleet tests'
npm helpers are; without node, npm or the registry the tests skip and say why."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from hpc_ds1.infra.ports import free_port

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "oidc-provider@8.8.1"
MODULES = REPO / "build" / "npm" / PACKAGE.replace("@", "-")
SCRIPT = Path(__file__).parent / "js" / "oidc_provider.mjs"
CLIENT_ID = "hpc-ds1-console"
ROLES = {"hpc-engineers": "engineer", "hpc-admins": "admin"}
ACCOUNTS: dict[str, dict[str, Any]] = {
    "erin": {
        "password": "erin-pw",
        "claims": {
            "preferred_username": "erin",
            "name": "Erin Engineer",
            "email": "erin@site.example",
            "email_verified": True,
            "groups": ["hpc-engineers", "staff"],
        },
    },
    "ada": {
        "password": "ada-pw",
        "claims": {"preferred_username": "ada", "groups": ["hpc-admins"]},
    },
    "nobody": {
        "password": "nobody-pw",
        "claims": {"preferred_username": "nobody", "groups": ["staff"]},
    },
}


def node_modules() -> Path | str:
    """Where oidc-provider is installed (installing it the first time), or why it cannot be."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        return "node and npm are needed for the OpenID provider (oidc-provider from npm)"
    installed = MODULES / "node_modules" / "oidc-provider" / "package.json"
    if installed.exists():
        return MODULES / "node_modules"
    MODULES.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [npm, "install", "--prefix", str(MODULES), "--no-audit", "--no-fund", PACKAGE],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0 or not installed.exists():
        return f"npm could not install {PACKAGE}: {done.stderr[-300:]}"
    return MODULES / "node_modules"


def signing_key(kid: str) -> dict[str, Any]:
    """A fresh RSA private JWK named `kid`, for the provider to sign ID tokens with."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk: dict[str, Any] = json.loads(RSAAlgorithm.to_jwk(private))
    # No key_ops: PyJWT writes ["sign"], which the provider then publishes, and its own check of
    # an id_token_hint (RP-Initiated Logout) will not verify with a key only for signing.
    jwk.pop("key_ops", None)
    return {**jwk, "kid": kid, "alg": "RS256", "use": "sig"}


@dataclass
class OidcProvider:
    modules: Path
    scratch: Path
    redirect_uris: list[str]
    keys: list[dict[str, Any]]
    port: int = field(default_factory=free_port)
    client_secret: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    proc: subprocess.Popen[bytes] | None = None
    # Where the provider may send the browser back after its sign-out (the console's sign-in page).
    post_logout_redirect_uris: list[str] = field(default_factory=list)

    @property
    def issuer(self) -> str:
        # `localhost`, while the console is opened at 127.0.0.1: another site for the browser,
        # as a site's real provider is (its redirect back is a cross-site navigation).
        return f"http://localhost:{self.port}"

    def env(self) -> dict[str, str]:
        """The console's settings for this provider."""
        return {
            "HPC_DS1_OIDC_ISSUER": self.issuer,
            "HPC_DS1_OIDC_CLIENT_ID": CLIENT_ID,
            "HPC_DS1_OIDC_CLIENT_SECRET": self.client_secret,
            "HPC_DS1_OIDC_ROLES": json.dumps(ROLES),
        }

    def start(self) -> OidcProvider:
        config = self.scratch / "oidc-provider.json"
        config.write_text(
            json.dumps(
                {
                    "node_modules": str(self.modules),
                    "port": self.port,
                    "issuer": self.issuer,
                    "client_id": CLIENT_ID,
                    "client_secret": self.client_secret,
                    "redirect_uris": self.redirect_uris,
                    "post_logout_redirect_uris": self.post_logout_redirect_uris,
                    "keys": self.keys,
                    "cookie_key": secrets.token_urlsafe(24),
                    "accounts": ACCOUNTS,
                }
            )
        )
        config.chmod(0o600)
        with open(self.scratch / "oidc-provider.log", "ab") as log:  # the child keeps its copy
            self.proc = subprocess.Popen(
                ["node", str(SCRIPT), str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the OpenID provider exited:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                found = httpx.get(
                    f"http://127.0.0.1:{self.port}/.well-known/openid-configuration", timeout=2
                )
                if found.status_code == 200:
                    return self
            time.sleep(0.2)
        raise AssertionError(f"the OpenID provider did not start in 30 s:\n{self.log()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None

    def restart(self, keys: list[dict[str, Any]]) -> None:
        """The provider again, signing with `keys[0]` (a key rotation)."""
        self.stop()
        self.keys = keys
        self.start()

    def log(self) -> str:
        path = self.scratch / "oidc-provider.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""
