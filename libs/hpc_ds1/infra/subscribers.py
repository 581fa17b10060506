"""Read-only NATS subscriber credentials of a home (`hpc-ds1 token nats`): for a site engineer
watching the log with `nats sub` or another system reading it through its own consumer.

Kept in `$HPC_DS1_HOME/credentials/nats-subscribers.json` (0600, in the 0700 credentials
directory, like servers.json): name -> password and the token id of its audit events
(token.created with role `nats`, token.revoked). The embedded server's config lists them as
users (nats_auth.subscriber_user) from its start; a change while the server runs rewrites the
config and reloads it (nats_server.reload_users). Passwords are never logged."""

from __future__ import annotations

import contextlib
import fcntl
import json
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from .secrets import NATS_USERS, secrets_dir, secure_dir, write_private

SUBSCRIBERS_FILE: Final = "nats-subscribers.json"
# One subject token: the credential's user name, its consumer's name and its inbox prefix.
NAME_PATTERN: Final = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
NAME_RULE: Final = "1 to 32 of letters, digits, '_' or '-'"


@dataclass(frozen=True)
class Subscriber:
    name: str
    password: str
    token_id: str


def check_name(name: str) -> str | None:
    """Why `name` cannot name a subscriber credential; None when it can."""
    if not NAME_PATTERN.match(name):
        return f"name {name!r} is not valid: use {NAME_RULE}"
    if name in NATS_USERS:
        return f"name {name!r} is a service's NATS user: choose another"
    return None


def _path(home: Path) -> Path:
    return secrets_dir(home) / SUBSCRIBERS_FILE


@contextlib.contextmanager
def _locked(home: Path) -> Iterator[None]:
    """One writer of the file at a time (two `token nats` commands at once)."""
    secure_dir(secrets_dir(home))
    with (secrets_dir(home) / f".{SUBSCRIBERS_FILE}.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def load_subscribers(home: Path) -> list[Subscriber]:
    """The home's subscriber credentials (none when the file is absent)."""
    path = _path(Path(home))
    try:
        found = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as error:
        raise RuntimeError(f"cannot read the subscriber credentials in {path}: {error}") from None
    return [
        Subscriber(name, str(entry["password"]), str(entry["token_id"]))
        for name, entry in sorted(found.items())
        if isinstance(entry, dict) and NAME_PATTERN.match(name)
    ]


def _save(home: Path, subscribers: list[Subscriber]) -> None:
    body = {s.name: {"password": s.password, "token_id": s.token_id} for s in subscribers}
    write_private(_path(home), json.dumps(body, indent=2, sort_keys=True) + "\n")


def add_subscriber(home: Path, name: str, token_id: str) -> Subscriber:
    """A new credential `name` with a fresh password; ValueError when it exists already."""
    problem = check_name(name)
    if problem is not None:
        raise ValueError(problem)
    with _locked(home):
        found = load_subscribers(home)
        if any(s.name == name for s in found):
            raise ValueError(
                f"a subscriber credential {name!r} exists already: revoke it first "
                f"(`hpc-ds1 token nats --revoke {name}`)"
            )
        subscriber = Subscriber(name, secrets.token_urlsafe(24), token_id)
        _save(home, [*found, subscriber])
    return subscriber


def remove_subscriber(
    home: Path, name: str | None = None, token_id: str | None = None
) -> Subscriber | None:
    """Remove the credential called `name` (or with `token_id`); None when there is none."""
    with _locked(home):
        found = load_subscribers(home)
        gone = next(
            (s for s in found if (name is not None and s.name == name) or s.token_id == token_id),
            None,
        )
        if gone is not None:
            _save(home, [s for s in found if s is not gone])
    return gone
