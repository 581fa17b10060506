"""One owner of a home's embedded NATS store and Postgres directory at a time.

The owner holds an flock on `$HPC_DS1_HOME/owner.lock` and writes where its servers listen to
`$HPC_DS1_HOME/owner.json`; any other command of the same home uses those servers."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from ..db import make_engine, upgrade
from ..log import get_logger
from ..settings import Settings
from .nats_server import EmbeddedNats
from .postgres import EmbeddedPostgres

log = get_logger("infra")


@dataclass(frozen=True)
class Endpoints:
    nats_url: str
    database_url: str
    gateway_url: str | None = None
    pid: int | None = None
    embedded: bool = False


def running_owner(home: Path) -> Endpoints | None:
    """The endpoints of the process that owns this home now, if one does."""
    lock_path, state_path = home / "owner.lock", home / "owner.json"
    if not lock_path.exists() or not state_path.exists():
        return None
    with lock_path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return Endpoints(**json.loads(state_path.read_text()))
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


@contextlib.contextmanager
def own_home(settings: Settings, gateway_url: str | None = None) -> Iterator[Endpoints]:
    """Become this home's owner: start what is not configured externally, migrate the database,
    and publish where everything listens. Everything stops on exit, data kept."""
    home = settings.home
    home.mkdir(parents=True, exist_ok=True)
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
        nats_url = settings.nats_url
        if not nats_url:
            nats = EmbeddedNats(home / "nats", sync=settings.nats_sync)
            nats_url = nats.start()
        database_url = settings.database_url
        if not database_url:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # pgserver warns about XDG_RUNTIME_DIR on import
                pg = EmbeddedPostgres(home / "postgres")
                database_url = pg.start()
        engine = make_engine(database_url, pool_size=1)
        try:
            upgrade(engine)
        finally:
            engine.dispose()
        endpoints = Endpoints(
            nats_url,
            database_url,
            gateway_url,
            os.getpid(),
            embedded=nats is not None or pg is not None,
        )
        (home / "owner.json").write_text(json.dumps(asdict(endpoints)))
        log.info(
            "infrastructure_ready",
            nats=nats_url,
            embedded_nats=nats is not None,
            embedded_postgres=pg is not None,
        )
        yield endpoints
    finally:
        with contextlib.suppress(FileNotFoundError):
            (home / "owner.json").unlink()
        if pg is not None:
            pg.stop()
        if nats is not None:
            nats.stop()
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


@contextlib.contextmanager
def use_home(settings: Settings) -> Iterator[Endpoints]:
    """The running owner's endpoints, or own the home for the duration of the block."""
    owner = running_owner(settings.home)
    if owner is not None:
        yield owner
        return
    with own_home(settings) as endpoints:
        yield endpoints
