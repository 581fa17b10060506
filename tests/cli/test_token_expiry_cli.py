"""`hpc-ds1 token create --expires`, `token list`'s expiry and last use, `token revoke --reason`
(issue 45), as a user runs them: the real console script against this test's NATS and Postgres."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, insert, select

from hpc_ds1.db import tables
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.settings import Settings
from tests.support.commands import hpc


async def test_a_token_with_an_expiry_its_last_use_and_a_revocation_with_a_reason(
    settings: Settings, bus: EventBus, engine: Engine
) -> None:
    bad = await hpc(
        settings, "token", "create", "--name", "al", "--role", "viewer", "--expires", "soon"
    )
    assert bad.returncode == 2 and "'soon' is not an expiry" in bad.stderr and "30d" in bad.stderr

    made = await hpc(
        settings,
        "token",
        "create",
        "--name",
        "al",
        "--role",
        "viewer",
        "--expires",
        "30d",
        "--json",
    )
    assert made.returncode == 0, made.stderr
    answer = json.loads(made.stdout)
    expires = datetime.fromisoformat(answer["expires_at"])
    assert abs(expires - (datetime.now(UTC) + timedelta(days=30))) < timedelta(minutes=5)
    with engine.connect() as conn:
        row = conn.execute(
            select(tables.tokens).where(tables.tokens.c.token_id == answer["token_id"])
        ).one()
    assert row.expires_at == expires

    # What the gateway writes on use (services/gateway/edge/signins.py: record_use).
    used = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
    with engine.begin() as conn:
        conn.execute(
            insert(tables.token_activity).values(token_id=answer["token_id"], last_used_at=used)
        )
    listed = await hpc(settings, "token", "list")
    assert "EXPIRES" in listed.stdout and "LAST USED" in listed.stdout
    line = next(x for x in listed.stdout.splitlines() if x.startswith(answer["token_id"]))
    assert f"{expires:%Y-%m-%d}" in line and "2026-12-01 09:30" in line, listed.stdout

    revoked = await hpc(settings, "token", "revoke", answer["token_id"], "--reason", "left")
    assert revoked.returncode == 0, revoked.stderr
    events = [e async for chunk in bus.replay() for e in chunk]
    last = json.loads(events[-1].data)
    assert last["type"] == "token.revoked" and last["data"]["reason"] == "left"
    assert last["actor"]  # the user at the terminal
