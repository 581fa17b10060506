"""`submit`: send a task to the coordinator and (by default) wait for its result."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .client import FleetClient, ServerError, Unreachable, resolve_trust

FINAL_STATUSES = ("finished", "failed")
TRANSIENT_LIMIT_S = 60.0  # how long a wait rides out an unreachable coordinator


def submit(
    server: str,
    token: str | None,
    workload: str,
    size: int,
    *,
    wait: bool = True,
    timeout: float | None = None,
    poll_s: float = 0.5,
    ca_pin: str | None = None,
    home: str | Path | None = None,
) -> dict[str, Any]:
    """Submit (workload, size) as a task; the task's JSON (`t["placement"]["reason"]` says
    where it went and why). With `wait`, returns once the task is finished or failed
    (TimeoutError after `timeout` seconds, naming the task). FleetError (from
    hpc_ds1.fleet.client) when the coordinator refuses it or cannot be reached.

    An https `server` is verified (issue 45): against `ca_pin` (the join command's
    `sha256:…`; the CA is read from the server's chain and must hash to it), else the pin the
    device credential of `home` keeps for that server, else the system trust store (a site
    certificate); a server that fails it is an UntrustedServer, and nothing is sent to it."""
    if timeout is not None and timeout <= 0:
        raise ValueError(f"timeout must be positive seconds, not {timeout}")
    if poll_s <= 0:
        raise ValueError(f"poll_s must be positive seconds, not {poll_s}")
    trust = resolve_trust(server, ca_pin, Path(home) if home is not None else None)
    with FleetClient(server, token, trust=trust) as client:
        task = client.submit(workload, size)
        if not wait:
            return task
        return wait_for(client, task, timeout=timeout, poll_s=poll_s)


def wait_for(
    client: FleetClient, task: dict[str, Any], *, timeout: float | None, poll_s: float
) -> dict[str, Any]:
    """Poll the task until it is finished or failed."""
    task_id = str(task["task_id"])
    start = time.monotonic()
    trouble_since: float | None = None
    while task.get("status") not in FINAL_STATUSES:
        if timeout is not None and time.monotonic() - start >= timeout:
            raise TimeoutError(
                f"task {task_id} is still {task.get('status')} after {timeout:g} s"
                + (f" ({task['waiting_for']})" if task.get("waiting_for") else "")
            )
        time.sleep(poll_s)
        try:
            task = client.task(task_id)
            trouble_since = None
        except (Unreachable, ServerError):
            # The task is on record: a coordinator restarting is waited out, for a while.
            now = time.monotonic()
            trouble_since = trouble_since or now
            if now - trouble_since > TRANSIENT_LIMIT_S:
                raise
    return task
