"""A command attached to a home's running owner uses the owner's stream, subject prefix and
replicas (owner.json), whatever its own environment leaves unset; one it sets to another value
is refused naming both; and a command that only reads creates no stream."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import nats
import pytest

from hpc_ds1.cli import main
from hpc_ds1.eventlog.audit import AuditFile, audit_record
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.events import TokenRevoked, envelope
from hpc_ds1.infra.home import (
    OwnerMismatch,
    check_agrees,
    own_home,
    running_owner,
    settings_of_owner,
)
from hpc_ds1.settings import Settings


async def _streams(url: str) -> set[str]:
    nc = await nats.connect(url)
    try:
        return {info.config.name or "" for info in await nc.jetstream().streams_info()}
    finally:
        await nc.close()


async def _append(settings: Settings, url: str, count: int) -> list[tuple[int, str, bytes]]:
    bus = await EventBus.connect(settings, url, "test")
    try:
        stored = []
        for i in range(count):
            env = envelope(TokenRevoked(token_id=f"t{i}"), actor="t", source="t", prefix=bus.prefix)
            stored.append((await bus.publish(env), env.subject, env.to_json()))
        return stored
    finally:
        await bus.close()


async def _delete(url: str, names: set[str]) -> None:
    nc = await nats.connect(url)
    try:
        for name in names:
            await nc.jetstream().delete_stream(name)
    finally:
        await nc.close()


def _only_home(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """The environment of a user who exported none of the server's HPC_DS1_* settings."""
    for name in [k for k in os.environ if k.startswith("HPC_DS1_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HPC_DS1_HOME", str(home))
    monkeypatch.setenv("HPC_DS1_LOG_JSON", "true")


def test_a_read_command_finds_the_owners_stream_creates_nothing_and_refuses_another(
    settings: Settings,
    nats_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The owner: a non-default stream and prefix (the test's own), external servers.
    assert settings.stream != "EVENTS" and settings.subject_prefix != "hpcds1"
    before = asyncio.run(_streams(nats_url))
    try:
        with own_home(settings) as ends:
            owner = json.loads((settings.home / "owner.json").read_text())
            assert owner["stream"] == settings.stream
            assert owner["subject_prefix"] == settings.subject_prefix
            assert owner["stream_replicas"] == settings.stream_replicas
            _only_home(monkeypatch, settings.home)
            capsys.readouterr()

            # The owner's streams do not exist yet: a reading command creates none of them.
            assert main(["projection", "rebuild", "--json"]) == 3
            err = capsys.readouterr().err
            assert f"no event stream {settings.stream!r}" in err
            assert asyncio.run(_streams(nats_url)) == before

            stored = asyncio.run(_append(settings, ends.nats_url_for("cli"), 3))
            AuditFile(settings.audit_path).append(audit_record(*s) for s in stored)
            made = asyncio.run(_streams(nats_url)) - before  # the owner's (the test's) own
            assert made == {settings.stream, settings.dead_letter_stream}

            # Without HPC_DS1_STREAM / HPC_DS1_SUBJECT_PREFIX: the owner's log, read whole.
            assert main(["projection", "rebuild", "--json"]) == 0
            assert json.loads(capsys.readouterr().out)["events"] == 3
            assert main(["audit", "verify", "--json"]) == 0
            verdict = json.loads(capsys.readouterr().out)
            assert verdict["intact"] and verdict["lines"] == 3
            assert asyncio.run(_streams(nats_url)) - before == made  # no EVENTS, nothing else

            # The same value set explicitly is no conflict; another is refused, both named.
            monkeypatch.setenv("HPC_DS1_STREAM", settings.stream)
            assert main(["audit", "verify", "--json"]) == 0
            capsys.readouterr()
            monkeypatch.setenv("HPC_DS1_STREAM", "EVENTS")
            assert main(["audit", "verify"]) == 2
            err = capsys.readouterr().err
            assert "HPC_DS1_STREAM=EVENTS" in err and f"HPC_DS1_STREAM={settings.stream}" in err
            monkeypatch.delenv("HPC_DS1_STREAM")
            monkeypatch.setenv("HPC_DS1_SUBJECT_PREFIX", "other")
            assert main(["token", "list"]) == 2
            err = capsys.readouterr().err
            assert "HPC_DS1_SUBJECT_PREFIX=other" in err and settings.subject_prefix in err
            assert asyncio.run(_streams(nats_url)) - before == made
    finally:
        asyncio.run(_delete(nats_url, asyncio.run(_streams(nats_url)) - before))


def test_settings_of_owner_takes_unset_values_and_refuses_explicit_others(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    with own_home(settings):
        owner = running_owner(settings.home)
        assert owner is not None
        monkeypatch.delenv("HPC_DS1_STREAM", raising=False)
        mine = Settings(home=settings.home)  # stream and prefix left to their defaults
        adopted = settings_of_owner(mine, owner)
        assert (adopted.stream, adopted.subject_prefix) == (
            settings.stream,
            settings.subject_prefix,
        )
        assert adopted.work_stream == settings.work_stream  # and what derives from them
        check_agrees(adopted, owner)
        # Settings read before the owner started (the defaults): use_home refuses them.
        with pytest.raises(OwnerMismatch, match="run the command again"):
            check_agrees(mine, owner)
        with pytest.raises(OwnerMismatch, match="HPC_DS1_STREAM_REPLICAS=3"):
            settings_of_owner(Settings(home=settings.home, stream_replicas=3), owner)
