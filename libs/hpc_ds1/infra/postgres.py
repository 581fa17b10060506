"""The embedded Postgres: the binaries of the pgserver package, listening on a loopback port.

With a superuser password the cluster uses scram-sha-256 for every connection (initdb
--auth=scram-sha-256; a cluster first initialised with trust is upgraded on start: the password
is set, pg_hba.conf rewritten and reloaded). `provision` then keeps a non-superuser role owning
the application database, which is what migrations and services connect as. Without a password
the cluster trusts every loopback connection (test fixtures only)."""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
import subprocess
from pathlib import Path
from typing import Any

from .ports import free_port, wait_for_port

SYSTEM_USER = "pgserver"  # Postgres refuses to run as root; pgserver uses this account too.
SUPERUSER = "postgres"
SCRAM_HBA = """\
# Written by hpc-ds1: every connection authenticates with a password (scram-sha-256).
# TYPE  DATABASE        USER            ADDRESS                 METHOD
local   all             all                                     scram-sha-256
host    all             all             127.0.0.1/32            scram-sha-256
host    all             all             ::1/128                 scram-sha-256
"""


def _bin(name: str) -> str:
    from pgserver._commands import POSTGRES_BIN_PATH

    return str(POSTGRES_BIN_PATH / name)


def hba_methods(pgdata: Path) -> set[str]:
    """The authentication methods pg_hba.conf names (last column of each rule)."""
    methods = set()
    path = pgdata / "pg_hba.conf"
    if path.exists():
        for line in path.read_text().splitlines():
            words = line.split("#", 1)[0].split()
            if len(words) >= 4:
                methods.add(words[-1] if "=" not in words[-1] else words[-2])
    return methods


class EmbeddedPostgres:
    """initdb on first use, then `pg_ctl start`/`stop` on the data directory `pgdata`.

    `superuser_password`: scram-sha-256 authentication with that password for the `postgres`
    superuser (None: trust, any local process connects as anyone; for test fixtures)."""

    def __init__(
        self,
        pgdata: Path,
        port: int | None = None,
        durable: bool = True,
        superuser_password: str | None = None,
    ) -> None:
        self.pgdata = pgdata
        self.port = port
        self.durable = durable
        self.superuser_password = superuser_password
        self._run_as: dict[str, Any] = {}
        self._owner: tuple[int, int] | None = None

    @property
    def url(self) -> str:
        """The superuser's URL (with its password when the cluster has one)."""
        return self.url_for(SUPERUSER, self.superuser_password, "postgres")

    def url_for(self, user: str, password: str | None, database: str) -> str:
        secret = f":{password}" if password else ""
        return f"postgresql+psycopg://{user}{secret}@127.0.0.1:{self.port}/{database}"

    def _prepare_user(self) -> None:
        if os.geteuid() != 0:
            return
        from pgserver._commands import POSTGRES_BIN_PATH
        from pgserver.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

        entry = ensure_user_exists(SYSTEM_USER)
        assert entry is not None
        self.pgdata.mkdir(parents=True, exist_ok=True)
        _grant_traversal(self.pgdata, entry.pw_gid)
        ensure_prefix_permissions(POSTGRES_BIN_PATH)  # the package's binaries, not user data
        ensure_folder_permissions(POSTGRES_BIN_PATH, 0o555)
        ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", 0o444)
        for path in [self.pgdata, *self.pgdata.rglob("*")]:
            os.chown(path, entry.pw_uid, entry.pw_gid)
        self._run_as = {"user": SYSTEM_USER, "group": pwd.getpwnam(SYSTEM_USER).pw_gid}
        self._owner = (entry.pw_uid, entry.pw_gid)

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), capture_output=True, text=True, timeout=timeout, check=False, **self._run_as
        )

    def _write_for_server(self, path: Path, text: str) -> None:
        """A 0600 file the server's account owns (pg_hba.conf, initdb's password file)."""
        tmp = path.with_name(f".{path.name}.tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        if self._owner is not None:
            os.chown(tmp, *self._owner)
        os.replace(tmp, path)

    def _initdb(self) -> None:
        auth = ["--auth=trust"]
        pwfile = self.pgdata.parent / f".{self.pgdata.name}-initdb-pw"
        if self.superuser_password is not None:
            self._write_for_server(pwfile, self.superuser_password + "\n")
            auth = ["--auth=scram-sha-256", f"--pwfile={pwfile}"]
        try:
            done = self._run(
                _bin("initdb"),
                "-D",
                str(self.pgdata),
                "-U",
                SUPERUSER,
                *auth,
                "--encoding=UTF8",
                "--no-instructions",
            )
        finally:
            with contextlib.suppress(FileNotFoundError):
                pwfile.unlink()
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed: {done.stderr.strip() or done.stdout.strip()}")

    def start(self, timeout: float = 30.0) -> str:
        self.pgdata.mkdir(parents=True, exist_ok=True)
        self._prepare_user()
        if not (self.pgdata / "PG_VERSION").exists():
            self._initdb()
        # A server left running by a killed owner would hold the directory: stop it first.
        if self._run(_bin("pg_ctl"), "-D", str(self.pgdata), "status").returncode == 0:
            self._run(_bin("pg_ctl"), "-D", str(self.pgdata), "-m", "fast", "-w", "stop")
        self.port = self.port or free_port()
        options = f"-h 127.0.0.1 -p {self.port} -k ''"
        if not self.durable:
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        done = self._run(
            _bin("pg_ctl"),
            "-D",
            str(self.pgdata),
            "-o",
            options,
            "-l",
            str(self.pgdata / "server.log"),
            "-w",
            "-t",
            str(int(timeout)),
            "start",
            timeout=timeout + 5,
        )
        if done.returncode != 0:
            log_file = self.pgdata / "server.log"
            log = log_file.read_text(errors="replace")[-2000:] if log_file.exists() else ""
            raise RuntimeError(f"Postgres did not start: {done.stderr.strip()}\n{log}")
        wait_for_port("127.0.0.1", self.port, timeout)
        if self.superuser_password is not None and hba_methods(self.pgdata) != {"scram-sha-256"}:
            self._require_passwords()
        return self.url

    def _require_passwords(self) -> None:
        """Upgrade a cluster initialised with trust: give the superuser its password (while
        trust still lets us in), then allow only scram-sha-256 and reload."""
        import psycopg
        from psycopg import sql

        if "trust" in hba_methods(self.pgdata):
            with psycopg.connect(self._conninfo(None, "postgres"), autocommit=True) as conn:
                conn.execute("SET password_encryption = 'scram-sha-256'")
                conn.execute(
                    sql.SQL("ALTER ROLE {} WITH PASSWORD {}").format(
                        sql.Identifier(SUPERUSER), sql.Literal(self.superuser_password)
                    )
                )
        self._write_for_server(self.pgdata / "pg_hba.conf", SCRAM_HBA)
        with psycopg.connect(self._conninfo(SUPERUSER, "postgres"), autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")

    def _conninfo(self, user: str | None, database: str) -> str:
        """The superuser's connection; `user` None: without a password (trust)."""
        from psycopg.conninfo import make_conninfo

        params: dict[str, Any] = {"host": "127.0.0.1", "port": self.port, "user": SUPERUSER}
        if user is not None and self.superuser_password:
            params["password"] = self.superuser_password
        return make_conninfo("", dbname=database, **params)

    def provision(self, role: str, password: str, database: str) -> str:
        """Keep `role` a plain login role (not superuser, cannot create roles or databases)
        owning `database` and everything in its public schema; returns its URL.

        A home from before roles existed kept its tables in database `postgres`, owned by the
        superuser: that database is renamed to `database` (an empty `postgres` is created
        again) and its objects are handed to `role`, so the data stays where it was."""
        import psycopg
        from psycopg import sql

        if self.superuser_password is None:
            raise RuntimeError("provision needs a cluster with a superuser password")
        name, db = sql.Identifier(role), sql.Identifier(database)
        attributes = sql.SQL("LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS")
        with psycopg.connect(self._conninfo(SUPERUSER, "template1"), autocommit=True) as conn:
            conn.execute("SET password_encryption = 'scram-sha-256'")
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
            verb = sql.SQL("ALTER ROLE" if exists else "CREATE ROLE")
            conn.execute(
                sql.SQL("{} {} WITH {} PASSWORD {}").format(
                    verb, name, attributes, sql.Literal(password)
                )
            )
            found = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (database,)
            ).fetchone()
            if not found:
                if database != "postgres" and self._holds_legacy_data("postgres"):
                    conn.execute(sql.SQL("ALTER DATABASE postgres RENAME TO {}").format(db))
                    conn.execute("CREATE DATABASE postgres")
                else:
                    conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(db, name))
            conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(db, name))
            conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(db))
        with psycopg.connect(self._conninfo(SUPERUSER, database), autocommit=True) as conn:
            _hand_over(conn, role)
        return self.url_for(role, password, database)

    def _holds_legacy_data(self, database: str) -> bool:
        import psycopg

        with psycopg.connect(self._conninfo(SUPERUSER, database), autocommit=True) as conn:
            found = conn.execute("SELECT to_regclass('public.alembic_version')").fetchone()
        return bool(found and found[0])

    def stop(self) -> None:
        if (self.pgdata / "postmaster.pid").exists():
            self._run(_bin("pg_ctl"), "-D", str(self.pgdata), "-m", "fast", "-w", "stop")


def _hand_over(conn: Any, role: str) -> None:
    """ALTER ... OWNER TO role for every object of the public schema someone else owns."""
    from psycopg import sql

    owned_by_others = """
        SELECT c.relname, c.relkind FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relkind = ANY(%s)
          AND pg_get_userbyid(c.relowner) <> %s
        ORDER BY c.relname
    """
    kinds = {"r": "TABLE", "p": "TABLE", "v": "VIEW", "m": "MATERIALIZED VIEW", "f": "TABLE"}
    # Tables first: a sequence a column owns moves with its table (and cannot move alone).
    for relkinds in (list(kinds), ["S"]):
        for relname, relkind in conn.execute(owned_by_others, (relkinds, role)).fetchall():
            what = "SEQUENCE" if relkind == "S" else kinds[relkind]
            conn.execute(
                sql.SQL("ALTER {} public.{} OWNER TO {}").format(
                    sql.SQL(what), sql.Identifier(relname), sql.Identifier(role)
                )
            )
    types = conn.execute(
        """
        SELECT t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
        WHERE n.nspname = 'public' AND t.typtype IN ('e', 'd')
          AND pg_get_userbyid(t.typowner) <> %s
        """,
        (role,),
    ).fetchall()
    for (typname,) in types:
        conn.execute(
            sql.SQL("ALTER TYPE public.{} OWNER TO {}").format(
                sql.Identifier(typname), sql.Identifier(role)
            )
        )
    routines = conn.execute(
        """
        SELECT p.oid::regprocedure::text FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'public' AND pg_get_userbyid(p.proowner) <> %s
        """,
        (role,),
    ).fetchall()
    for (signature,) in routines:
        conn.execute(
            sql.SQL("ALTER ROUTINE {} OWNER TO {}").format(sql.SQL(signature), sql.Identifier(role))
        )


def _grant_traversal(path: Path, group: int) -> None:
    """Let the server's account reach `path` (it runs as SYSTEM_USER when we are root) while
    granting as little as possible: the directory right above `path` (the home) is given to
    `group` with g+x, 0710 at most, so other accounts still cannot enter it; directories
    further up get o+x (traverse, not list) when they lack it."""
    parent = path.parent
    os.chown(parent, -1, group)
    parent.chmod(stat.S_IMODE(parent.stat().st_mode) | stat.S_IXGRP)
    parent = parent.parent
    while True:
        mode = stat.S_IMODE(parent.stat().st_mode)
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)
        if parent == parent.parent:
            break
        parent = parent.parent
