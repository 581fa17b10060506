"""One owner of a home's embedded NATS store and Postgres directory at a time.

The owner holds an flock on `$HPC_DS1_HOME/owner.lock` and writes where its servers listen to
`$HPC_DS1_HOME/owner.json` (0600, no passwords); any other command of the same home uses those
servers with the credentials of `$HPC_DS1_HOME/credentials/` (see secrets.py)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from ..db import make_engine, normalize_url, upgrade
from ..eventlog.bus import server_list
from ..log import get_logger
from ..settings import Settings
from .nats_auth import nats_users
from .nats_server import EmbeddedNats
from .postgres import EmbeddedPostgres
from .secrets import (
    APP_DATABASE,
    APP_ROLE,
    NATS_USERS,
    ensure_credentials,
    load_credentials,
    secrets_dir,
    secure_dir,
    write_private,
)

log = get_logger("infra")


def without_credentials(url: str) -> str:
    """`url` with any user/password removed (NATS: of every server of a comma-separated list)
    or the password removed (Postgres)."""
    if url.startswith("nats://") or url.startswith("tls://") or "://" not in url:
        servers = []
        for server in url.split(","):
            parts = urlsplit(server.strip())
            servers.append(urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1])))
        return ",".join(servers)
    # (URL.set ignores a None password: replace the field itself.)
    return make_url(url)._replace(password=None).render_as_string(hide_password=False)


def with_user(nats_url: str, user: str, password: str) -> str:
    parts = urlsplit(nats_url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))


@dataclass(frozen=True)
class Endpoints:
    """Where a home's servers listen. `nats_url` and `database_url` carry no credentials (they
    are what owner.json holds); `nats_url_for(user)` and `app_database_url()` add them."""

    nats_url: str
    database_url: str
    gateway_url: str | None = None
    pid: int | None = None
    embedded: bool = False
    home: str | None = None
    embedded_nats: bool = False
    embedded_postgres: bool = False
    # The log's stream and subject prefix, so a process of the same home with other settings
    # (a Python program calling hpc_ds1.load()) appends where the server reads. None: written
    # by an earlier version (the defaults).
    stream: str | None = None
    subject_prefix: str | None = None
    stream_replicas: int | None = None
    # External servers' URLs as configured (credentials included); never written to owner.json.
    external_nats_url: str | None = field(default=None, repr=False)
    external_database_url: str | None = field(default=None, repr=False)

    def public(self) -> dict[str, Any]:
        found = asdict(self)
        found.pop("external_nats_url")
        found.pop("external_database_url")
        return found

    def nats_url_for(self, user: str) -> str:
        """The NATS URL with the credentials of `user`: a service name (runtime.SERVICES) or
        `cli` (the commands of this home). External servers: the URL as configured."""
        if user not in NATS_USERS:
            raise ValueError(f"no NATS user {user!r}; the users are: {', '.join(NATS_USERS)}")
        if not self.embedded_nats:
            return self.external_nats_url or self.nats_url
        password = load_credentials(self._home()).nats_password(user)
        return with_user(self.nats_url, user, password)

    def app_database_url(self) -> str:
        """The database URL of the application role (not a superuser), with its password."""
        if not self.embedded_postgres:
            return self.external_database_url or self.database_url
        password = load_credentials(self._home()).postgres_app
        return (
            make_url(self.database_url).set(password=password).render_as_string(hide_password=False)
        )

    def _home(self) -> Path:
        if self.home is None:
            raise RuntimeError("these endpoints name no home to read credentials from")
        return Path(self.home)

    @classmethod
    def external(cls, settings: Settings) -> Endpoints:
        """Endpoints of the servers configured by HPC_DS1_NATS_URL and HPC_DS1_DATABASE_URL."""
        if not settings.nats_url or not settings.database_url:
            raise ValueError("both HPC_DS1_NATS_URL and HPC_DS1_DATABASE_URL must be set")
        return cls(
            without_credentials(settings.nats_url),
            without_credentials(settings.database_url),
            home=str(settings.home),
            external_nats_url=settings.nats_url,
            external_database_url=settings.database_url,
        )


# The settings every process attached to a home's running owner must share with it: they name
# the log's stream (and, derived, its dead-letter and work streams, the liveness and model
# buckets) and its subjects, and how many copies a stream created for it keeps. owner.json
# records them; a command attached to the owner takes them from there.
OWNER_SETTINGS = ("stream", "subject_prefix", "stream_replicas")


class OwnerMismatch(ValueError):
    """This process was told (an HPC_DS1_* variable or a flag) to use another value of one of
    OWNER_SETTINGS than the home's running owner uses."""


def _variable(name: str) -> str:
    return f"HPC_DS1_{name.upper()}"


def settings_of_owner(settings: Settings, owner: Endpoints) -> Settings:
    """`settings` with the owner's values of OWNER_SETTINGS (an owner.json of an earlier
    version, without one: this process's own). A value this process was given explicitly (an
    environment variable or a flag) that differs from the owner's: OwnerMismatch naming both,
    rather than reading or appending where the owner does not."""
    update: dict[str, Any] = {}
    for name in OWNER_SETTINGS:
        theirs, ours = getattr(owner, name), getattr(settings, name)
        if theirs is None or theirs == ours:
            continue
        if name in settings.model_fields_set:
            raise OwnerMismatch(
                f"{_variable(name)}={ours} here, but the server of {settings.home} (process "
                f"{owner.pid}) uses {_variable(name)}={theirs}: unset {_variable(name)} to use "
                f"the server's {theirs!r}, or set it to {theirs!r}"
            )
        update[name] = theirs
    return settings.model_copy(update=update) if update else settings


def attach_settings(settings: Settings) -> Settings:
    """`settings_of_owner` when a process owns this home now; else `settings` as they are."""
    owner = running_owner(settings.home)
    return settings if owner is None else settings_of_owner(settings, owner)


def check_agrees(settings: Settings, owner: Endpoints) -> None:
    """OwnerMismatch unless `settings` use the owner's values of OWNER_SETTINGS (settings read
    before the owner started: the command is to be run again)."""
    settings_of_owner(settings, owner)  # an explicit other value: named as such
    for name in OWNER_SETTINGS:
        theirs, ours = getattr(owner, name), getattr(settings, name)
        if theirs is not None and theirs != ours:
            raise OwnerMismatch(
                f"the server of {settings.home} (process {owner.pid}) started meanwhile with "
                f"{_variable(name)}={theirs} (this command read {ours}): run the command again"
            )


def _external_path(home: Path) -> Path:
    return secrets_dir(home) / "external.json"


def running_owner(home: Path) -> Endpoints | None:
    """The endpoints of the process that owns this home now, if one does."""
    lock_path, state_path = home / "owner.lock", home / "owner.json"
    if not lock_path.exists() or not state_path.exists():
        return None
    with lock_path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            found = json.loads(state_path.read_text())
            known = {k: v for k, v in found.items() if k in Endpoints.__dataclass_fields__}
            endpoints = Endpoints(**known)
            external = _external_path(home)
            if external.exists():
                urls = json.loads(external.read_text())
                endpoints = replace(
                    endpoints,
                    external_nats_url=urls.get("nats_url"),
                    external_database_url=urls.get("database_url"),
                )
            return endpoints
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


def migrate(endpoints: Endpoints) -> None:
    """Bring the database to the newest schema as the application role. A server that refuses
    the connection (a wrong password, a role or database that does not exist, no pg_hba.conf
    line for this host) is a RuntimeError naming the URL without its password."""
    url = endpoints.app_database_url()
    engine = make_engine(url, pool_size=1)
    try:
        upgrade(engine)
    except OperationalError as error:
        reason = " ".join(str(error.orig or error).split())
        password = make_url(normalize_url(url)).password
        if password:
            reason = reason.replace(str(password), "***")
        shown = without_credentials(url)
        where = "HPC_DS1_DATABASE_URL" if not endpoints.embedded_postgres else "the embedded server"
        raise RuntimeError(
            f"cannot use the database {shown} ({where}): {reason}. Check the role, its "
            "password, the database name, and that the server's pg_hba.conf admits this host "
            "(docs/site-infrastructure.md)"
        ) from None
    finally:
        engine.dispose()


def check_nats_credentials(url: str) -> None:
    """External NATS servers that refuse the credentials of `url`: a RuntimeError naming the
    servers without them, before anything starts. An unreachable server is no error here (the
    services wait for it)."""
    import nats
    import nats.errors

    async def probe() -> str | None:
        async def quiet(_: Exception) -> None:
            return None

        try:
            nc = await nats.connect(
                server_list(url), allow_reconnect=False, connect_timeout=2, error_cb=quiet
            )
        except nats.errors.Error as error:
            words = str(error).lower()
            return str(error) if "authorization" in words or "authentication" in words else None
        except Exception:
            return None
        await nc.close()
        return None

    with ThreadPoolExecutor(1) as pool:  # own_home runs both in and out of an event loop
        refused = pool.submit(asyncio.run, probe()).result()
    if refused is not None:
        raise RuntimeError(
            f"the NATS servers {without_credentials(url)} (HPC_DS1_NATS_URL) refused its "
            f"credentials ({refused}). Check the user and password in the URL of every server "
            "(nats://USER:PASSWORD@HOST:PORT,...; docs/site-infrastructure.md)"
        )


@contextlib.contextmanager
def own_home(settings: Settings, gateway_url: str | None = None) -> Iterator[Endpoints]:
    """Become this home's owner: start what is not configured externally, migrate the database,
    and publish where everything listens. Everything stops on exit, data kept."""
    home = settings.home
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    handle = (home / "owner.lock").open("a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        owner = running_owner(home)
        pid = owner.pid if owner else "?"
        raise RuntimeError(
            f"{home} is already served by process {pid}; stop it or use another HPC_DS1_HOME"
        ) from None
    nats = pg = None
    try:
        secure_dir(home)  # also a home created before it was kept private
        credentials = ensure_credentials(home)
        nats_url = settings.nats_url
        if nats_url:
            check_nats_credentials(nats_url)
        else:
            users = nats_users(settings, credentials)
            nats = EmbeddedNats(home / "nats", sync=settings.nats_sync, users=users)
            nats_url = nats.start()
        database_url = settings.database_url
        if not database_url:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # pgserver warns about XDG_RUNTIME_DIR on import
                pg = EmbeddedPostgres(
                    home / "postgres", superuser_password=credentials.postgres_superuser
                )
                pg.start()
            database_url = pg.provision(APP_ROLE, credentials.postgres_app, APP_DATABASE)
        endpoints = Endpoints(
            without_credentials(nats_url),
            without_credentials(database_url),
            gateway_url,
            os.getpid(),
            embedded=nats is not None or pg is not None,
            home=str(home),
            embedded_nats=nats is not None,
            embedded_postgres=pg is not None,
            external_nats_url=None if nats is not None else nats_url,
            external_database_url=None if pg is not None else database_url,
            **{name: getattr(settings, name) for name in OWNER_SETTINGS},
        )
        # Migrations run as the application role, so it owns every table they create.
        migrate(endpoints)
        if nats is None or pg is None:
            external = {"nats_url": endpoints.external_nats_url}
            external["database_url"] = endpoints.external_database_url
            write_private(_external_path(home), json.dumps(external))
        write_private(home / "owner.json", json.dumps(endpoints.public()))
        log.info(
            "infrastructure_ready",
            nats=endpoints.nats_url,
            embedded_nats=nats is not None,
            embedded_postgres=pg is not None,
        )
        yield endpoints
    finally:
        for path in (home / "owner.json", _external_path(home)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        if pg is not None:
            pg.stop()
        if nats is not None:
            nats.stop()
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


@contextlib.contextmanager
def use_home(settings: Settings) -> Iterator[Endpoints]:
    """The running owner's endpoints, or own the home for the duration of the block. With an
    owner, `settings` must use its stream, subject prefix and replicas (`attach_settings`, as
    load_settings does): OwnerMismatch otherwise."""
    owner = running_owner(settings.home)
    if owner is not None:
        check_agrees(settings, owner)
        yield owner
        return
    with own_home(settings) as endpoints:
        yield endpoints
