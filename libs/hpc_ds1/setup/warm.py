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
device of a fleet sets up on its own home, from what its coordinator knows.

A tuning session starts warm the same way (`session_warm`, `tune --warm`): the coordinator
reads its projection, the session starts at the top of the siblings' consensus and runs the
next of its top configurations, spread apart, as its first moves (WARM, tuning.session)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import httpx
from sqlalchemy import Engine

from hpc_ds1.db.reads import fleet_names, measured_cells, sibling_runs
from hpc_ds1.events import WarmSibling, WarmStart
from hpc_ds1.knobs import KnobConfig, KnobError
from hpc_ds1.space import Config, ConfigSpace, KnobView, knob_view
from hpc_ds1.tuning.search import Prior, consensus, features_of, prior_start
from hpc_ds1.tuning.search import Settings as SearchSettings

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


# --- a warm session (`tune --warm`, POST /v1/sessions with `warm`) --------------------------

WarmMode = Literal["off", "auto", "always"]


def warm_plan(
    space: ConfigSpace,
    prior: Prior,
    runs: int = SearchSettings.prior_runs,
    pool: int = SearchSettings.pool,
) -> list[Config]:
    """The top of the siblings' consensus, spread apart (`search.prior_start`, as the warm
    setup's and the warm search's first runs): its best first. Empty without a prior."""
    view = knob_view(space)
    features = features_of(view.knobs)
    columns = consensus(features, prior)
    rows = prior_start(columns, features.positions, runs, pool)
    return [view.config(features.configs[r]) for r in rows]


def nearest_size(size: int, sizes: Iterable[int]) -> int | None:
    """The measured size nearest `size` on a log scale (a tie: the larger), None for none."""
    return min(sizes, key=lambda s: (abs(math.log(s / size)), -s), default=None)


def session_warm(
    engine: Engine,
    device_id: str,
    workload: str,
    size: int,
    space: ConfigSpace,
    mode: WarmMode,
    names: Sequence[str] = (),
) -> WarmStart | None:
    """A session's warm start from this home's projection (the coordinator's: every device of
    the fleet): None when cold (`off`; `auto` and this device has an ok run of the job at this
    size; no sibling measured anything of this space). Siblings: the same workload on every
    other device (with device ids in `names`: on those only) and the workloads `names` names,
    on any device (a recorded GPU is a workload of its own), at the measured size nearest
    `size`. A name that is neither a device of the fleet nor a workload any device measured is
    a WarmError; so is naming siblings none of which measured anything of this space."""
    if mode == "off":
        return None
    devices, workloads = fleet_names(engine)
    named_devices = [n for n in names if n in devices]
    named_workloads = [n for n in names if n not in devices]
    unknown = [n for n in named_workloads if n not in workloads]
    if unknown:
        raise WarmError(
            f"warm_from names {', '.join(map(repr, unknown))}: neither a device of this fleet "
            f"nor a workload any device measured. Accepted: a device id "
            f"({_some(devices)}) or a measured workload ({_some(workloads)})"
        )
    cells = measured_cells(engine, [workload, *named_workloads])
    if mode == "auto" and size in cells.get((device_id, workload), set()):
        return None  # this device measured the job: its own model knows it

    def sibling(dev: str, wl: str) -> bool:
        if dev == device_id and wl == workload:
            return False  # the device's own runs are the session's, not a sibling's
        if wl == workload:
            return not named_devices or dev in named_devices
        return wl in named_workloads

    chosen = [key for key in cells if sibling(*key)]
    at = nearest_size(size, {s for key in chosen for s in cells[key]})
    view = knob_view(space)
    found: list[WarmSibling] = []
    prior: list[Mapping[KnobConfig, float | None]] = []
    if at is not None:
        runs = sibling_runs(engine, [workload, *named_workloads], at, device_id)
        for (dev, wl), its in sorted(runs.items()):
            one = prior_from_runs(view, [its]) if sibling(dev, wl) else []
            if one:
                prior += one
                found.append(WarmSibling(device_id=dev, workload=wl, size=at, runs=len(its)))
    if not prior:
        if names:
            raise WarmError(
                f"warm_from {', '.join(names)}: none of them measured {workload} (or, for a "
                f"named workload, itself) in this device's space at any size: nothing to start "
                "from"
            )
        return None
    plan = warm_plan(space, prior)
    return WarmStart(
        siblings=found,
        plan=[c.model_dump() for c in plan],
        reason="asked" if mode == "always" else "unmeasured",
    )


def _some(names: set[str], shown: int = 8) -> str:
    if not names:
        return "none yet"
    ordered = sorted(names)
    more = f", … {len(ordered) - shown} more" if len(ordered) > shown else ""
    return ", ".join(ordered[:shown]) + more
