"""`hpc-ds1 token` and `hpc-ds1 audit verify` as a user runs them: the real console script in a
subprocess, against this test's NATS stream and Postgres database."""

from __future__ import annotations

import json
import re

from sqlalchemy import Engine, select

from hpc_ds1.db import tables
from hpc_ds1.eventlog.audit import AuditFile
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.security.tokens import token_hash
from hpc_ds1.settings import Settings
from tests.support.commands import hpc


def token_rows(engine: Engine) -> list[dict[str, object]]:
    with engine.connect() as conn:
        query = select(tables.tokens).order_by(tables.tokens.c.created_at)
        return [dict(r) for r in conn.execute(query).mappings()]


async def test_token_create_list_revoke_and_the_audit_chain(
    settings: Settings, bus: EventBus, engine: Engine
) -> None:
    created = await hpc(settings, "token", "create", "--name", "alice", "--role", "engineer")
    assert created.returncode == 0, created.stderr
    token = re.search(r"^(hds1_\S+)$", created.stdout, re.MULTILINE)
    assert token, created.stdout
    secret = token.group(1)
    assert "cannot be shown again" in created.stdout
    assert secret not in created.stderr

    rows = token_rows(engine)
    assert len(rows) == 1
    alice = rows[0]
    assert alice["sha256"] == token_hash(secret) and alice["holder"] == "alice"
    assert alice["role"] == "engineer" and alice["revoked"] is False
    assert alice["created_by"] and alice["created_by"] != "anonymous"
    assert str(alice["token_id"]) in created.stdout

    second = await hpc(settings, "token", "create", "--name", "bob.v", "--role", "viewer")
    assert second.returncode == 0, second.stderr
    listed = await hpc(settings, "token", "list")
    assert listed.returncode == 0, listed.stderr
    assert "alice" in listed.stdout and "bob.v" in listed.stdout and "engineer" in listed.stdout
    assert secret not in listed.stdout and token_hash(secret) not in listed.stdout
    as_json = json.loads((await hpc(settings, "token", "list", "--json")).stdout)
    assert [t["holder"] for t in as_json] == ["alice", "bob.v"]
    assert all("sha256" not in t for t in as_json)

    revoked = await hpc(settings, "token", "revoke", str(alice["token_id"]))
    assert revoked.returncode == 0, revoked.stderr
    assert "revoked" in revoked.stdout
    assert token_rows(engine)[0]["revoked"] is True
    again = await hpc(settings, "token", "revoke", str(alice["token_id"]))
    assert again.returncode == 0 and "already revoked" in again.stdout
    unknown = await hpc(settings, "token", "revoke", "tok_nope")
    assert unknown.returncode == 2 and "no token 'tok_nope'" in unknown.stderr
    listed = await hpc(settings, "token", "list")
    assert re.search(r"alice\s+engineer.*\byes\b", listed.stdout), listed.stdout

    # The audit file the embedded projector wrote: created, created, revoked.
    audit = settings.audit_path
    verified = await hpc(settings, "audit", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.startswith("intact: 3 lines")
    lines = audit.read_text().splitlines()
    assert len(lines) == 3 and secret not in audit.read_text()

    tampered = settings.home / "tampered.jsonl"
    edited = lines[1].replace('"bob.v"', '"mallory"')
    assert edited != lines[1]
    tampered.write_text("\n".join([lines[0], edited, lines[2]]) + "\n")
    broken = await hpc(settings, "audit", "verify", "--file", str(tampered))
    assert broken.returncode == 1
    assert broken.stdout.startswith("broken at line 2:"), broken.stdout

    removed = settings.home / "removed.jsonl"
    removed.write_text("\n".join([lines[0], lines[2]]) + "\n")
    gap = await hpc(settings, "audit", "verify", "--file", str(removed))
    assert gap.returncode == 1 and gap.stdout.startswith("broken at line 2:")

    missing = await hpc(settings, "audit", "verify", "--file", str(settings.home / "none"))
    assert missing.returncode == 1 and "does not exist" in missing.stdout

    # Cut short, emptied, or edited with the chain recomputed: the chain alone cannot tell,
    # the log can (the projection holds seq 3, and each line must be the log's event).
    cut = settings.home / "first2.jsonl"
    cut.write_text("".join(f"{x}\n" for x in lines[:2]))
    short = await hpc(settings, "audit", "verify", "--file", str(cut))
    assert short.returncode == 1, short.stdout
    assert short.stdout.startswith("not verified: truncated: the file ends at seq 2"), short.stdout
    assert "the projection holds the events up to seq 3" in short.stdout
    bodies = [{k: v for k, v in json.loads(x).items() if k not in ("prev", "hash")} for x in lines]
    bodies[1]["data"]["holder"] = "mallory"
    recomputed = settings.home / "recomputed.jsonl"
    AuditFile(recomputed).append(bodies)
    forged = await hpc(settings, "audit", "verify", "--file", str(recomputed))
    assert forged.returncode == 1
    assert forged.stdout.startswith("broken at line 2: seq 2 differs from the event in the log")


async def test_bad_role_or_name_is_exit_2_with_what_is_accepted(settings: Settings) -> None:
    role = await hpc(settings, "token", "create", "--name", "alice", "--role", "boss")
    assert role.returncode == 2
    assert "viewer, engineer, admin" in role.stderr
    name = await hpc(settings, "token", "create", "--name", "alice smith", "--role", "viewer")
    assert name.returncode == 2 and "letters, digits" in name.stderr
    assert not settings.home.exists() or not (settings.home / "audit.jsonl").exists()
