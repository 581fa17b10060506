"""`hpc-ds1 token join` and the join token's limits: `--ttl` and `--uses` parsed and bounded,
set on the new token by `--rotate`, shown with the token (and by `token list`); a token that
expired or was used up is not shown as if it worked, but said to be so, with how to make a new
one."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine

from hpc_ds1.cli import main
from hpc_ds1.eventlog.audit import AuditFile
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import Event, TokenCreated, TokenUsed, envelope
from hpc_ds1.security.credentials import (
    JOIN_HOLDER,
    join_token_id,
    parse_ttl,
    parse_uses,
    read_join_token,
    rotate_join_token,
)
from hpc_ds1.security.tokens import token_hash
from hpc_ds1.services.projector import project
from hpc_ds1.settings import Settings
from tests.support.commands import hpc


def test_ttl_and_uses_are_parsed_within_bounds() -> None:
    cases = {"30m": 1800, "24h": 86400, "7d": 7 * 86400, "1h30m": 5400, " 2H ": 7200, "60s": 60}
    for text, seconds in cases.items():
        assert parse_ttl(text) == seconds, text
    for bad in ("", "24", "5x", "-1h", "1.5h", "h", "24 h", "99999999d"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_ttl(bad)
    for out in ("59s", "0m", "366d"):
        with pytest.raises(ValueError, match=r"out of bounds: a join token lasts from 1m to 365d"):
            parse_ttl(out)
    assert (parse_uses("1"), parse_uses(" 10 "), parse_uses("10000")) == (1, 10, 10000)
    for bad in ("x", "1.5", ""):
        with pytest.raises(ValueError, match="not a whole number"):
            parse_uses(bad)
    for out in ("0", "-1", "10001"):
        with pytest.raises(ValueError, match="out of bounds"):
            parse_uses(out)


def test_bad_limits_are_refused_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = ("--home", str(tmp_path / "home"))
    for flag, value, said in (
        ("--ttl", "5x", "is not a duration: use e.g. 30m, 24h or 7d"),
        ("--ttl", "10s", "out of bounds"),
        ("--uses", "0", "out of bounds"),
    ):
        with pytest.raises(SystemExit) as done:
            main(["token", "join", "--rotate", flag, value, *home])
        assert done.value.code == 2
        err = capsys.readouterr().err
        assert f"argument {flag}: " in err and said in err
    # A token's limits are set when it is made: not on the one there is.
    assert main(["token", "join", "--ttl", "24h", *home]) == 2
    assert "use them with --rotate" in capsys.readouterr().err


async def fold(settings: Settings, bus: EventBus, engine: Engine, *events: Event) -> None:
    for event in events:
        await bus.publish(envelope(event, actor="admin", source="test", prefix=bus.prefix))
    stored = [e async for chunk in bus.replay() for e in chunk]
    project(engine, stored, AuditFile(settings.audit_path))


async def test_rotate_sets_the_limits_and_a_dead_token_is_said_to_be_so(
    settings: Settings, bus: EventBus, engine: Engine
) -> None:
    made = await hpc(settings, "token", "join", "--rotate", "--ttl", "30m", "--uses", "3")
    assert made.returncode == 0, made.stderr
    token = made.stdout.splitlines()[0]
    created = (await bus.history("token", join_token_id(token)))[0][1].data
    assert created["max_uses"] == 3
    left = datetime.fromisoformat(created["expires_at"]) - datetime.now(UTC)
    assert timedelta(minutes=29) < left <= timedelta(minutes=30)

    shown = await hpc(settings, "token", "join")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == token
    assert "3 of 3 uses left" in shown.stderr and "expires " in shown.stderr
    as_json = json.loads((await hpc(settings, "token", "join", "--json")).stdout)
    assert (as_json["token"], as_json["max_uses"], as_json["uses_left"]) == (token, 3, 3)
    listed = await hpc(settings, "token", "list")
    assert listed.returncode == 0, listed.stderr
    line = next(x for x in listed.stdout.splitlines() if join_token_id(token) in x)
    assert line.rstrip().endswith("0/3")

    # Used up: said so (exit 3), the token not printed as if it worked.
    await fold(
        settings,
        bus,
        engine,
        *(TokenUsed(token_id=join_token_id(token), device_id=f"d{i}") for i in range(3)),
    )
    spent = await hpc(settings, "token", "join")
    assert spent.returncode == 3, spent.stderr
    assert f"the join token {join_token_id(token)} was used 3 of 3 times" in spent.stderr
    assert "hpc-ds1 token join --rotate" in spent.stderr
    assert token not in spent.stdout + spent.stderr

    # Expired: the same.
    old = rotate_join_token(settings.home)
    past = datetime.now(UTC) - timedelta(hours=1)
    expired = TokenCreated(
        token_id=join_token_id(old),
        holder=JOIN_HOLDER,
        role="join",
        sha256=token_hash(old),
        expires_at=past,
        max_uses=10,
    )
    await fold(settings, bus, engine, expired)
    assert read_join_token(settings.home) == old
    said = await hpc(settings, "token", "join")
    assert said.returncode == 3, said.stderr
    assert f"expired at {past:%Y-%m-%d %H:%M:%S} UTC" in said.stderr
