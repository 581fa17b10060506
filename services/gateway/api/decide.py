"""POST /v1/decide: a NATS request to the decision service.

The caller sends a `DecideBody` (workload, size, config, telemetry); the gateway builds the
internal `DecideRequest` with source "api" and no session or device of the caller's choosing,
and the actor from the credential. With telemetry the answer is one forward pass (viewer role);
without it the job first runs for real on the device, which needs an engineer.

`Idempotency-Key` makes a retry safe: the decision service decides the key (scoped by the
caller's token) once and answers a retry with the original decision
(hpc_ds1.eventlog.idempotency)."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Header, HTTPException, Response
from nats.errors import NoRespondersError

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.eventlog.idempotency import (
    HEADER,
    ID_HEADER,
    KEY_RULE,
    InvalidKey,
    derived_id,
    parse_key,
)
from hpc_ds1.eventlog.subjects import decide_subject
from hpc_ds1.requests import DecideBody, DecideRequest
from hpc_ds1.security.tokens import Principal, role_allows
from hpc_ds1.settings import Settings

from ..deps import BusDep, SettingsDep
from ..edge.auth import authenticated
from ..schemas import E404, E409, E503, WRITE_ERRORS, Decision

# With telemetry the answer is one forward pass; without it the job runs first, for real.
FORWARD_PASS_TIMEOUT_S = 30.0  # the first decision of a service loads the model
REAL_RUN_TIMEOUT_S = 900.0


def service_status(answer: dict[str, Any]) -> int:
    """The HTTP status for a service's `{"ok": false, "status": N}` reply: its own 4xx or 5xx,
    502 when it gave none that is valid."""
    status = answer.get("status")
    if isinstance(status, int) and not isinstance(status, bool) and 400 <= status <= 599:
        return status
    return 502


def service_error(answer: dict[str, Any]) -> Any:
    error = answer.get("error")
    return error if isinstance(error, str | list) else "the service refused the request"


IDEMPOTENCY_KEY_DOC = (
    f"Optional. Send it again with the same request to retry safely: one decision is made and "
    f"every retry gets it back (header Idempotent-Replayed: true). Scoped by your token; "
    f"remembered as long as the log keeps the decision (the log discards nothing). Reused for "
    f"a different request: 422. Form: {KEY_RULE}."
)


def idempotency_id(header: str | None, who: Principal, route: str) -> str | None:
    """The id an Idempotency-Key names for this caller and route; None without one; 422 for a
    malformed key."""
    if header is None:
        return None
    try:
        key = parse_key(header)
    except InvalidKey as error:
        raise HTTPException(422, str(error)) from None
    return derived_id(who.token_id, route, key)


async def request_decision(
    bus: EventBus,
    settings: Settings,
    body: DecideRequest,
    actor: str,
    key_id: str | None = None,
    response: Response | None = None,
) -> dict[str, Any]:
    # A real run is capped by the wall-time setting (when there is one); the queue on the device
    # and the decision itself get as long again.
    cap = getattr(settings, "max_run_s", None)
    real_run = 2 * float(cap) + 30 if cap else REAL_RUN_TIMEOUT_S
    timeout = FORWARD_PASS_TIMEOUT_S if body.telemetry else real_run
    try:
        reply = await bus.nc.request(
            decide_subject(settings),
            body.model_dump_json().encode(),
            timeout=timeout,
            headers={"Hpc-Actor": actor, **({ID_HEADER: key_id} if key_id else {})},
        )
    except NoRespondersError:
        raise HTTPException(503, "the decision service is not running") from None
    except Exception:
        raise HTTPException(
            503, f"the decision service did not answer within {timeout:g} s"
        ) from None
    answer = orjson.loads(reply.data)
    if not answer.get("ok"):
        raise HTTPException(service_status(answer), service_error(answer))
    decision: dict[str, Any] = answer["decision"]
    if key_id is not None and response is not None:
        response.headers["Idempotent-Replayed"] = "true" if answer.get("replayed") else "false"
    return decision


router = APIRouter(tags=["decisions"])


@router.post(
    "/v1/decide",
    response_model=Decision,
    responses={**WRITE_ERRORS, **E404, **E409, **E503},
)
async def decide(
    settings: SettingsDep,
    bus: BusDep,
    body: DecideBody,
    who: Annotated[Principal, Depends(authenticated)],
    response: Response,
    idempotency_key: Annotated[
        str | None, Header(alias=HEADER, description=IDEMPOTENCY_KEY_DOC)
    ] = None,
) -> Response:
    """The model's next move for a job: choice, confidence, mode (auto / confirm /
    escalate) and the reasons it is not auto. With `telemetry` the answer is one forward
    pass and nothing runs (viewer role); without it the job is first run for real on the
    device (engineer role). With `Idempotency-Key` a retry gets the first decision back."""
    need = "viewer" if body.telemetry is not None else "engineer"
    if not role_allows(who.role, need):
        why = "" if need == "viewer" else " (without telemetry the job runs for real)"
        raise HTTPException(
            403, f"{who.name} holds a {who.role} token; this needs a {need} or higher{why}"
        )
    key_id = idempotency_id(idempotency_key, who, "POST /v1/decide")
    request = DecideRequest(
        workload=body.workload,
        size=body.size,
        config=body.config,
        telemetry=body.telemetry,
        source="api",
    )
    answer = await request_decision(bus, settings, request, who.name, key_id, response)
    # The decision service wrote this from its own typed event: it is sent as it is, not
    # validated into `Decision` and serialized again (docs/performance.md). FastAPI does not
    # merge the injected `response`'s headers into a returned Response, so they are copied.
    reply = Response(orjson.dumps(answer), media_type="application/json")
    reply.raw_headers.extend(response.raw_headers)
    return reply
