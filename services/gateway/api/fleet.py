"""Joining the fleet: POST /v1/fleet/join trades the join token for a device credential, and
GET /v1/fleet/join-token shows the join token to an admin on the coordinator itself.

The join token (role `join`, holder `fleet-join`, in $HPC_DS1_HOME/credentials/join.token; see
hpc_ds1.security.credentials) lets anyone who holds it add a device to this fleet, so it is shown
only to this machine. A device credential is an `agent` token whose holder is the device id:
everything the device sends later acts as that device and nothing else. A join names a device
that does not exist yet; a device that restarts keeps its stored credential instead of joining
again.

A join token expires and admits a number of devices (token.created's expires_at and max_uses).
A join reads the token's history from the log, refuses it (401, saying which) when it expired
or was used up, and appends token.used with the history's last sequence expected before the
device is registered: of joins racing on any number of gateways, the ones past the cap find
the history moved, read it again and are refused. (A join whose name another join takes in the
same instant gets 409 with its use spent.)

Neither token is ever logged or put in an event: the log holds only their SHA-256 (token.created,
which the events API does not serve) and their public ids."""

from __future__ import annotations

import asyncio
import random
import re
import secrets
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints
from sqlalchemy import Engine, select

from hpc_ds1.db import tables
from hpc_ds1.eventlog.bus import ConcurrencyConflict, EventBus
from hpc_ds1.events import DeviceRegistered, Envelope, TokenCreated, TokenUsed, envelope
from hpc_ds1.log import get_logger
from hpc_ds1.machine.hardware import GPU, Fingerprint
from hpc_ds1.requests import SAFE_ID_RULE, SafeId
from hpc_ds1.security.credentials import (
    NEW_JOIN_TOKEN,
    join_command,
    join_pin,
    limits_of_history,
    public_server,
    read_join_token,
    token_limits,
    wait_active,
)
from hpc_ds1.security.tokens import Principal, new_token, new_token_id, token_hash

from ..deps import BusDep, EngineDep, SettingsDep
from ..edge.auth import limit_joins, require
from ..edge.ratelimit import is_loopback
from ..schemas import E409, E503, ERRORS_401_403, WRITE_ERRORS

log = get_logger("gateway.fleet")

# How long a join waits for the projector to fold the new credential (so the agent's next call
# authenticates); past it the credential is still returned: it becomes valid once folded.
JOIN_WAIT_S = 10.0
# Appends of token.used tried before a join gives up (503): each round of racing joins lets at
# least one through, so this many joins at once on one token all get their answer.
USE_TRIES = 64
HOSTNAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9.\-_]{0,252}$"
_NOT_ID = re.compile(r"[^A-Za-z0-9_\-]+")
# Tabs are kept (MPICH's version line has them); other control characters are refused.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")

# Module level: with postponed annotations FastAPI resolves these names in module globals.
Joiner = Annotated[Principal, Depends(require("join"))]
Admin = Annotated[Principal, Depends(require("admin"))]


def _no_control(value: str) -> str:
    if _CONTROL.search(value):
        raise ValueError("must not contain NUL or other control characters (tabs are fine)")
    return value


Short = Annotated[str, StringConstraints(max_length=64), AfterValidator(_no_control)]
Text = Annotated[str, StringConstraints(max_length=256), AfterValidator(_no_control)]
Count = Annotated[int, Field(ge=0, le=1 << 20)]


class GPUIn(GPU):
    """A GPU as a joining device reports it (sizes bounded)."""

    name: Text
    memory_bytes: int = Field(ge=0, le=1 << 50)
    compute_capability: Short = ""
    simulated: bool = False


class FingerprintIn(Fingerprint):
    """A joining device's hardware fingerprint (hpc_ds1.machine.hardware.Fingerprint, sizes
    bounded)."""

    device_id: Short
    hostname: Text
    cpu_model: Text
    architecture: Short
    sockets: Count
    physical_cores: Count
    logical_cpus: Count
    simd: tuple[Short, ...] = Field(max_length=64)
    memory_bytes: int = Field(ge=0, le=1 << 60)
    caches: dict[Short, Short] = Field(max_length=16)
    gpus: tuple[GPUIn, ...] = Field(max_length=64)
    mpi_library: Text
    numba_version: Short
    python_version: Short


class JoinBody(BaseModel):
    """POST /v1/fleet/join: who the device is. Its id is `name` when given (409 if any device or
    token holder has it), else made from its hostname."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hostname: str = Field(
        pattern=HOSTNAME_PATTERN,
        max_length=253,
        description="The device's host name: 1 to 253 of letters, digits, '.', '-' or '_'.",
    )
    fingerprint: FingerprintIn
    name: SafeId | None = Field(default=None, description=f"The device id wanted: {SAFE_ID_RULE}.")


class JoinAnswer(BaseModel):
    """The device's own credential: keep it (0600); it is shown once."""

    device_id: str
    token: str
    token_id: str
    heartbeat_interval_s: float
    long_poll_s: float
    active: bool = Field(description="The credential is already accepted (false: within seconds).")


class JoinToken(BaseModel):
    token: str
    server: str = Field(description="The URL devices reach this gateway at.")
    command: str = Field(description="What to run on a device to join it.")
    token_id: str | None = Field(default=None, description="Its public id (None: not registered).")
    expires_at: datetime | None = Field(default=None, description="None: it never expires.")
    max_uses: int | None = Field(default=None, description="None: no cap.")
    uses_left: int | None = Field(default=None, description="None: no cap.")
    state: str | None = Field(
        default=None, description="active, expired, spent or revoked (None: not registered yet)."
    )
    problem: str | None = Field(default=None, description="Why it cannot join a device now.")


def device_id_for(hostname: str) -> str:
    """`<hostname as a safe id, at most 40 characters>-<6 random hex digits>`."""
    stem = _NOT_ID.sub("-", hostname).strip("-_")[:40].strip("-_") or "device"
    return f"{stem}-{secrets.token_hex(3)}"


def _taken(engine: Engine, name: str) -> str | None:
    """Why `name` cannot be a new device's id, or None when it is free. Blocking (DB)."""
    with engine.connect() as conn:
        device = conn.execute(
            select(tables.devices.c.status).where(tables.devices.c.device_id == name)
        ).first()
        if device is not None:
            return f"device {name!r} exists already"
        holder = conn.execute(
            select(tables.tokens.c.token_id).where(tables.tokens.c.holder == name).limit(1)
        ).first()
    if holder is not None:
        return f"{name!r} already holds a token"
    return None


def refuse_spent(token_id: str, history: list[tuple[int, Envelope]]) -> None:
    """401 saying why, when the join token's history shows it expired, used up or revoked."""
    limits = limits_of_history(history)
    problem = (
        f"the join token {token_id} is not in the log: {NEW_JOIN_TOKEN}"
        if limits is None
        else limits.problem(datetime.now(UTC))
    )
    if problem is not None:
        log.info("join_refused", join_token_id=token_id, reason=problem)
        raise HTTPException(401, problem, {"WWW-Authenticate": "Bearer"})


router = APIRouter(tags=["fleet"])


async def use(
    bus: EventBus, token_id: str, device_id: str, history: list[tuple[int, Envelope]]
) -> str:
    """Spend one use of the join token on `device_id`: token.used, appended only while the
    token's history is still `history` (read again after anyone else appended); 401 when
    it expired, was used up or revoked. Returns the token.used event's id."""
    for attempt in range(USE_TRIES):
        if attempt:
            await asyncio.sleep(random.uniform(0, 0.005 * min(attempt, 10)))
            history = await bus.history("token", token_id)
        refuse_spent(token_id, history)
        used = envelope(
            TokenUsed(token_id=token_id, device_id=device_id),
            actor=device_id,
            source="gateway",
            prefix=bus.prefix,
        )
        try:
            await bus.publish(used, expected_version=history[-1][0])
            return used.id
        except ConcurrencyConflict:
            continue  # another join (or a revocation) came first: read it again
    raise HTTPException(503, "too many joins at once with this join token; try again")


async def claim(bus: EventBus, engine: Engine, body: JoinBody, joiner: Principal) -> str:
    """Register the device under a free id: the device.registered event goes in only when
    the device has no history (two joins with one name: the second gets 409), and only
    after one use of the join token was spent on it (`use`; refused first when none is
    left)."""
    fingerprint = body.fingerprint.model_dump(mode="json")
    history = await bus.history("token", joiner.token_id)
    refuse_spent(joiner.token_id, history)
    for _ in range(5):
        device_id = body.name or device_id_for(body.hostname)
        why = await asyncio.to_thread(_taken, engine, device_id)
        if why is None:
            used = await use(bus, joiner.token_id, device_id, history)
            event = DeviceRegistered(
                device_id=device_id,
                hostname=body.hostname,
                fingerprint={**fingerprint, "device_id": device_id},
                local=False,
            )
            env = envelope(
                event, actor=device_id, source="gateway", prefix=bus.prefix, causation_id=used
            )
            try:
                await bus.publish(env, expected_version=0)
                return device_id
            except ConcurrencyConflict:
                why = f"device {device_id!r} exists already"
        if body.name:
            raise HTTPException(
                409,
                f"{why}: a device acts only as itself; a device that joined before keeps "
                "its stored credential (credentials/device.json) instead of joining again, "
                "or choose another name",
            )
    raise HTTPException(503, "no free device id was found; try again")


@router.post(
    "/v1/fleet/join",
    status_code=201,
    responses={**WRITE_ERRORS, **E409, **E503},
    dependencies=[Depends(limit_joins)],  # 429 past HPC_DS1_JOINS_PER_MINUTE, before auth
)
async def join(
    settings: SettingsDep, bus: BusDep, engine: EngineDep, body: JoinBody, joiner: Joiner
) -> JoinAnswer:
    """Trade the join token (`Authorization: Bearer <join token>`) for this device's own
    credential: an agent token whose holder is the device id. Spends one of the join
    token's uses (token.used; 401 when it expired or was used up), publishes
    device.registered (local false) and token.created, and waits until the credential is
    accepted."""
    device_id = await claim(bus, engine, body, joiner)
    token, token_id = new_token(), new_token_id()
    created = TokenCreated(
        token_id=token_id, holder=device_id, role="agent", sha256=token_hash(token)
    )
    env = envelope(created, actor=device_id, source="gateway", prefix=bus.prefix)
    await bus.publish(env, expected_version=0)
    active = await wait_active(engine, token, JOIN_WAIT_S)
    log.info(
        "device_joined",
        device_id=device_id,
        hostname=body.hostname,
        token_id=token_id,
        join_token_id=joiner.token_id,
        active=active,
    )
    return JoinAnswer(
        device_id=device_id,
        token=token,
        token_id=token_id,
        heartbeat_interval_s=settings.heartbeat_interval_s,
        long_poll_s=settings.long_poll_s,
        active=active,
    )


@router.get("/v1/fleet/join-token", responses={**ERRORS_401_403, **E503})
async def join_token(
    settings: SettingsDep, engine: EngineDep, request: Request, response: Response, admin: Admin
) -> JoinToken:
    """The join token and the command that joins a device with it: for an admin calling
    from the coordinator itself (loopback) only.

    Why loopback too: whoever holds the join token can add machines to the fleet, and work
    is then sent to them. The seed's rule is that it is "shown only to this machine", as
    `serve` prints it on its own terminal: an admin credential that leaked (a browser
    session, a token copied elsewhere) must not be enough to hand it out to another host.
    The peer address is the socket's, never a forwarded header (unless its proxy is named
    in HPC_DS1_FORWARDED_ALLOW_IPS); behind a reverse proxy on this machine not named there
    every caller looks local, which is why the admin role is needed as well."""
    client = request.client.host if request.client else None
    if not is_loopback(client):
        log.info("join_token_refused", who=admin.name, reason="not loopback", client=client)
        raise HTTPException(
            403,
            "the join token is shown only to this machine: ask from the coordinator itself "
            "(loopback), or run `hpc-ds1 token join` there",
        )
    token = await asyncio.to_thread(read_join_token, settings.home)
    if token is None:
        raise HTTPException(503, "no join token yet: the gateway makes it when it starts")
    # Issue 45: https and the CA pin when this gateway serves TLS off loopback.
    server = public_server(settings, settings.port or request.url.port)
    response.headers["Cache-Control"] = "no-store"
    log.info("join_token_shown", who=admin.name, token_id=admin.token_id)
    limits = await asyncio.to_thread(token_limits, engine, token)
    shown = JoinToken(
        token=token, server=server, command=join_command(server, token, join_pin(settings))
    )
    if limits is None:
        return shown
    return shown.model_copy(
        update={
            "token_id": limits.token_id,
            "expires_at": limits.expires_at,
            "max_uses": limits.max_uses,
            "uses_left": limits.uses_left,
            "state": limits.state(),
            "problem": limits.problem(),
        }
    )
