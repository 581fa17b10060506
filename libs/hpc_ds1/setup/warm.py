"""The warm start of `setup --budget --warm` (issue 42, item 5: transfer through the fleet):
what the coordinator knows of the same kernel on other devices becomes the budgeted setup's
prior. The home's projection holds every device's measurements (an agent's are posted to its
coordinator), so a new device's setup starts from its siblings': the top of their consensus,
spread apart, then active learning with their consensus as the surrogate's features
(`tuning.search.budgeted_setup`).

Siblings are the same workload measured on other devices, and the workloads named with
`--warm-from` on any device: a recorded GPU is a workload file of its own on whatever host
replays it, so "the A6000 and the W7800" are named, not found by device. The siblings come from
this home's projection, or from a coordinator's GET /v1/measurements (`--server`): a new
device of a fleet sets up on its own home, from what its coordinator knows."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import httpx
from sqlalchemy import Engine

from hpc_ds1.db.reads import sibling_runs
from hpc_ds1.knobs import KnobConfig, KnobError
from hpc_ds1.space import Config, KnobView
from hpc_ds1.tuning.search import Prior

TIMEOUT_S = 60.0


class WarmError(RuntimeError):
    """The fleet's measurements could not be read; the message says from where and why."""


Runs = list[tuple[dict[str, Any], str, float | None]]  # (config, status, seconds) per run
PriorOf = Callable[[str, int, KnobView], Prior]  # (workload, size, its view) -> the prior


def prior_from_runs(view: KnobView, siblings: Iterable[Runs]) -> Prior:
    """One mapping per sibling: each configuration of `view` it measured, its median seconds
    over the ok runs, None where every run of it failed. Configurations outside this space
    (another knob value, another device's ranks) are left out; a sibling with no ok run of
    this space, too."""
    prior: list[dict[KnobConfig, float | None]] = []
    for runs in siblings:
        seconds: dict[KnobConfig, list[float]] = {}
        failed: set[KnobConfig] = set()
        for config, status, runtime_s in runs:
            try:
                values = view.values(Config.model_validate(config))
            except (KnobError, KeyError, ValueError):
                continue
            if status == "ok" and runtime_s is not None and runtime_s > 0:
                seconds.setdefault(values, []).append(runtime_s)
            else:
                failed.add(values)
        sibling: dict[KnobConfig, float | None] = {c: None for c in failed - set(seconds)}
        sibling.update({c: statistics.median(s) for c, s in seconds.items()})
        if seconds:
            prior.append(sibling)
    return prior


def from_projection(engine: Engine, device_id: str, also: Sequence[str]) -> PriorOf:
    """The prior from this home's projection (the coordinator's, or a single machine's)."""

    def prior_of(workload: str, size: int, view: KnobView) -> Prior:
        names = [workload, *[w for w in also if w != workload]]
        return prior_from_runs(view, sibling_runs(engine, names, size, device_id).values())

    return prior_of


def from_server(server: str, bearer: str | None, device_id: str, also: Sequence[str]) -> PriorOf:
    """The prior from a coordinator's GET /v1/measurements (a new device of its fleet)."""

    def prior_of(workload: str, size: int, view: KnobView) -> Prior:
        names = [workload, *[w for w in also if w != workload]]
        headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
        try:
            reply = httpx.get(
                f"{server.rstrip('/')}/v1/measurements",
                params={"workload": names, "size": size, "device_id": device_id},
                headers=headers,
                timeout=TIMEOUT_S,
            )
        except httpx.HTTPError as error:
            raise WarmError(
                f"cannot reach {server} for the fleet's measurements: {error}"
            ) from None
        if reply.status_code != 200:
            raise WarmError(
                f"{server} answered {reply.status_code} to GET /v1/measurements: {reply.text[:300]}"
            )
        try:
            found = reply.json()["siblings"]
            runs = [[(r["config"], r["status"], r["runtime_s"]) for r in s["runs"]] for s in found]
        except (ValueError, KeyError, TypeError):
            raise WarmError(
                f"{server} answered GET /v1/measurements with something other than the "
                "fleet's runs: is it an hpc-ds1 coordinator?"
            ) from None
        return prior_from_runs(view, runs)

    return prior_of
