"""make_engine bounds a connect (a stopped database must not hang a stopping service), and a
URL's own connect_timeout wins."""

from __future__ import annotations

from sqlalchemy.engine import make_url

from hpc_ds1.db import make_engine
from hpc_ds1.db.engine import CONNECT_TIMEOUT_S


def _connect_timeout(url: str) -> str | None:
    engine = make_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            params: dict[str, str] = conn.connection.dbapi_connection.info.get_parameters()  # type: ignore[union-attr]
            return params.get("connect_timeout")
    finally:
        engine.dispose()


def test_connections_have_a_connect_timeout(database_url: str) -> None:
    assert _connect_timeout(database_url) == str(CONNECT_TIMEOUT_S)


def test_the_urls_own_connect_timeout_wins(database_url: str) -> None:
    own = make_url(database_url).update_query_dict({"connect_timeout": "3"})
    assert _connect_timeout(own.render_as_string(hide_password=False)) == "3"
