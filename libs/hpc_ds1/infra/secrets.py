"""Per-home generated credentials of the embedded servers.

`$HPC_DS1_HOME` is kept 0700 and `$HPC_DS1_HOME/credentials/` 0700 with files 0600: only the
account that owns the home can read them (the gateway keeps the CLI's bearer token there too).
`servers.json` holds the embedded Postgres superuser's
password (the owner bootstraps the server with it, nothing else uses it), the password of the
application role every service and migration connects as, and one NATS password per user: each
service and `cli` (the commands of the same home)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..process.runtime import SERVICES

CLI_USER = "cli"
NATS_USERS: tuple[str, ...] = (*SERVICES, CLI_USER)
APP_ROLE = "hpcds1"  # the non-superuser role owning the application database
APP_DATABASE = "hpcds1"


def secrets_dir(home: Path) -> Path:
    return home / "credentials"


def _new_password() -> str:
    return secrets.token_urlsafe(24)  # letters, digits, '-' and '_': safe in URLs and configs


def secure_dir(path: Path) -> None:
    """Create `path` (and parents) and make it 0700, also when it existed with other modes."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` as a 0600 file, atomically: never readable by others, not even
    for a moment, and never half written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


@dataclass(frozen=True)
class HomeCredentials:
    postgres_superuser: str
    postgres_app: str
    nats: dict[str, str]

    def nats_password(self, user: str) -> str:
        try:
            return self.nats[user]
        except KeyError:
            raise ValueError(
                f"no NATS user {user!r}; the users are: {', '.join(sorted(self.nats))}"
            ) from None


def _path(home: Path) -> Path:
    return secrets_dir(home) / "servers.json"


def _parse(path: Path) -> dict[str, Any]:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise RuntimeError(f"cannot read the credentials in {path}: {error}") from None
    if not isinstance(found, dict):
        raise RuntimeError(f"{path} is not a JSON object")
    return found


def ensure_credentials(home: Path) -> HomeCredentials:
    """The home's credentials, generating whatever is missing (first start, or a home from
    before credentials existed). Only the home's owner calls this."""
    secure_dir(home)
    secure_dir(secrets_dir(home))
    path = _path(home)
    found = _parse(path) if path.exists() else {}
    postgres = dict(found.get("postgres") or {})
    nats = dict(found.get("nats") or {})
    changed = not path.exists()
    for key in ("superuser", "app"):
        if not isinstance(postgres.get(key), str) or not postgres[key]:
            postgres[key] = _new_password()
            changed = True
    for user in NATS_USERS:
        if not isinstance(nats.get(user), str) or not nats[user]:
            nats[user] = _new_password()
            changed = True
    if changed:
        write_private(path, json.dumps({"postgres": postgres, "nats": nats}, indent=2) + "\n")
    else:
        os.chmod(path, 0o600)
    return HomeCredentials(postgres["superuser"], postgres["app"], nats)


def load_credentials(home: Path) -> HomeCredentials:
    """The credentials the home's owner generated (for a command attaching to the owner)."""
    path = _path(home)
    if not path.exists():
        raise RuntimeError(
            f"{path} is missing: the owner of {home} has not generated its credentials "
            "(is it an older version? restart `hpc-ds1 serve`)"
        )
    found = _parse(path)
    try:
        postgres, nats = found["postgres"], found["nats"]
        return HomeCredentials(str(postgres["superuser"]), str(postgres["app"]), dict(nats))
    except (KeyError, TypeError):
        raise RuntimeError(f"{path} lacks the postgres or nats credentials") from None
