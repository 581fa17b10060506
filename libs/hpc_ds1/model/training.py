"""train(): measurements of one device -> move model, runtime model and guard, as one ONNX file."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from hpc_ds1.model import estimators as est
from hpc_ds1.model import features as ft
from hpc_ds1.model.blend import Blend, choose_blend
from hpc_ds1.model.calibration import (
    TARGETS,
    WORSE,
    Calibration,
    calibrated,
    crossed_confidence,
    decision_features,
    ece,
    fit_and_score,
    move_good,
    move_not_slower,
    move_unattended,
    stop_good,
    stop_not_slower,
    stop_unattended,
    worse_than_best,
)
from hpc_ds1.model.discrimination import report as discrimination_report
from hpc_ds1.model.guard import DISTANCE_MARGIN, DISTANCE_PERCENTILE, DistanceGuard
from hpc_ds1.model.labels import Outcome, SpaceFor, StateKey, aggregate, label_outcomes
from hpc_ds1.model.labels import measured_space as _measured_space
from hpc_ds1.model.onnx_graph import CONVERSION_TOLERANCE, build, classifier_conversion_error
from hpc_ds1.model.schema import Measurement, Thresholds
from hpc_ds1.model.transfer import (
    Table,
    blended_deltas,
    choose_bandwidth,
    choose_weights,
    loso_prior,
    relative_table,
    to_metadata,
)
from hpc_ds1.space import (
    ALL_ACTIONS,
    STOP,
    ConfigSpace,
    action_class,
    apply_move,
    neighbours,
    representatives,
)

FORMAT = 1
DEFAULT_MOVE = "random_forest+sigmoid"
DEFAULT_RUNTIME = "gradient_boosting"
Array = npt.NDArray[Any]


def content_version(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


class TrainedModel:
    """The in-memory scikit-learn models, their ONNX file and the training metrics."""

    def __init__(
        self,
        move_estimator: Any,
        runtime_estimator: Any,
        guard: DistanceGuard,
        metadata: dict[str, Any],
        onnx_bytes: bytes,
        metrics: dict[str, Any],
    ) -> None:
        self.n_base = int(metadata["n_base"])
        self.move_estimator = move_estimator
        self.runtime_estimator = runtime_estimator
        self.guard = guard
        self.metadata = metadata
        self.metrics = metrics
        self._onnx = onnx_bytes
        self.version = content_version(onnx_bytes)

    def to_onnx(self) -> bytes:
        return self._onnx

    def save(self, path: str | Path) -> Path:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(target.suffix + ".tmp")
        tmp.write_bytes(self._onnx)
        tmp.replace(target)
        return target

    def sklearn_outputs(self, X: Array) -> tuple[Array, Array, Array]:
        """What the ONNX graph computes, from the scikit-learn objects: probabilities (columns
        in classes order), log10 runtime, distance."""
        X = np.asarray(X, dtype=np.float32)
        proba = np.asarray(self.move_estimator.predict_proba(X))
        runtime = np.asarray(self.runtime_estimator.predict(X[:, : self.n_base]))
        return proba, runtime, self.guard.distance(X[:, : self.n_base])

    def load(self) -> Any:
        from hpc_ds1.model.inference import Model

        return Model.from_onnx(self._onnx)


def _coerce(m: Measurement | Mapping[str, Any]) -> Measurement:
    m = m if isinstance(m, Measurement) else Measurement.model_validate(m)
    if not m.held_out and m.size in registered_held_out(m.workload):
        # A run at a held-out size (a decision, a session) is still evaluation ground.
        return m.model_copy(update={"held_out": True})
    return m


@functools.lru_cache(maxsize=256)
def registered_held_out(workload: str) -> frozenset[int]:
    """The held-out sizes of a registered workload: never trained on, whatever measured them."""
    from hpc_ds1.workloads import UnknownWorkload, get_workload

    try:
        return frozenset(get_workload(workload).held_out)
    except UnknownWorkload:
        return frozenset()


class _Rows:
    """Feature rows for states of one set of outcomes."""

    def __init__(
        self,
        outcomes: dict[StateKey, Outcome],
        machine: list[float],
        tiles: dict[str, tuple[int, ...]],
        space_for: SpaceFor | None,
        layout: ft.Layout,
    ) -> None:
        self.layout = layout
        self.outcomes = outcomes
        self.labels = label_outcomes(outcomes, space_for)
        # per state: each move class's move (`representatives`), set by _oof_deltas
        self.representative: dict[StateKey, dict[str, str]] = {}
        self.machine = machine
        self.tiles = tiles
        self.space_for = space_for
        self.skipped: set[str] = set()
        self._spaces: dict[str, Any] = {}

    def work(self, workload: str, size: int) -> tuple[float, ...] | None:
        w = ft.registry_work(workload, size)
        if w is None:
            self.skipped.add(workload)
        return w

    def state_row(self, key: StateKey, telemetry: bool) -> list[float] | None:
        workload, size, config = key
        w = self.work(workload, size)
        if w is None:
            return None
        o = self.outcomes[key]
        rt, tp = (o.runtime_s, o.throughput) if telemetry else (None, None)
        return self.layout.state(ft.row(w, config, self.tiles.get(workload), self.machine, rt, tp))

    def space(self, workload: str) -> Any:
        if workload not in self._spaces:
            self._spaces[workload] = (
                self.space_for(workload)
                if self.space_for
                else _measured_space(self.outcomes, workload)
            )
        return self._spaces[workload]

    def classification(self) -> tuple[Array, Array, Array, Array, list[StateKey]]:
        """X (each state twice: with telemetry, without), y, feasibility mask, has-telemetry."""
        rows, ys, masks, tele, keys = [], [], [], [], []
        for key, move in sorted(self.labels.items(), key=lambda kv: _sort_key(kv[0])):
            workload, _, config = key
            mask = np.zeros(len(ALL_ACTIONS))
            for name in (*neighbours(config, self.space(workload)), STOP):
                mask[ALL_ACTIONS.index(action_class(name))] = 1.0
            for telemetry in (True, False):
                r = self.state_row(key, telemetry)
                if r is None:
                    break
                rows.append(r)
                ys.append(ALL_ACTIONS.index(action_class(move)))
                masks.append(mask)
                tele.append(telemetry)
                keys.append(key)
        return (
            ft.as_matrix(rows),
            np.asarray(ys, dtype=int),
            np.asarray(masks).reshape(len(masks), len(ALL_ACTIONS)),
            np.asarray(tele, dtype=bool),
            keys,
        )

    def regression(self) -> tuple[Array, Array, list[StateKey]]:
        rows, ys, keys = [], [], []
        for key, o in sorted(self.outcomes.items(), key=lambda kv: _sort_key(kv[0])):
            if not o.ok or o.runtime_s is None:
                continue
            r = self.state_row(key, False)
            if r is None:
                continue
            rows.append(r[: self.layout.n_base])
            ys.append(np.log10(o.runtime_s))
            keys.append(key)
        return ft.as_matrix(rows), np.asarray(ys, dtype=np.float64), keys


def _represented(moves: dict[str, Any], rows: _Rows, key: StateKey) -> dict[str, Any]:
    """The moves that stand for their class at `key` (every move where no representative was
    recorded: states of workloads without knobs of their own)."""
    chosen = rows.representative.get(key)
    if chosen is None:
        return {n: t for n, t in moves.items() if n in ALL_ACTIONS}
    return {move: moves[move] for move in chosen.values() if move in moves}


def _with_registered_knobs(outcomes: Mapping[StateKey, Outcome]) -> SpaceFor:
    """The measured space, with a registered workload's own knobs and constraints where it has
    any: the measured knob values alone, unconstrained, let a move such as RANKS_UP leave
    `p * q == ranks` for a configuration never measured, and every state would be a STOP."""

    def space_for(workload: str) -> ConfigSpace:
        measured = _measured_space(outcomes, workload)
        if not measured.knobs:
            return measured
        from hpc_ds1.workloads import UnknownWorkload, get_workload

        try:
            wl = get_workload(workload)
        except UnknownWorkload:
            return measured
        return replace(measured, knobs=wl.knobs, constraints=wl.constraints)

    return space_for


def _sort_key(key: StateKey) -> tuple[str, int, int, int, int, bool, int, str]:
    w, s, c = key
    return (w, s, c.ranks, c.threads, c.tile, c.gpu, c.block, repr(c.knobs))


def _oof_deltas(
    rows: _Rows,
    keys: Sequence[StateKey],
    groups: Array,
    Xr: Array,
    yr: Array,
    rgroups: Array,
    factory: Any,
    fitted: dict[int, Any] | None = None,
) -> Array:
    """Per state and action: log10(runtime after the move / runtime now) as predicted by a
    runtime model fitted without the state's size (NaN where the move is infeasible).
    `fitted`: the fold models already fitted (_fold_models), else fitted here."""
    out = np.full((len(keys), len(ALL_ACTIONS)), np.nan)
    for fold in np.unique(groups):
        fit_rows = rgroups != fold
        if not fit_rows.any():
            continue
        if fitted is not None and int(fold) in fitted:
            model = fitted[int(fold)]
        else:
            model = factory()
            model.fit(Xr[fit_rows], yr[fit_rows])
        batch: list[list[float]] = []
        where: list[tuple[int, list[str]]] = []
        for i in np.flatnonzero(groups == fold).tolist():
            workload, size, config = keys[i]
            work = rows.work(workload, size)
            assert work is not None  # states of unregistered workloads have no rows
            moves = neighbours(config, rows.space(workload))
            for c in (config, *moves.values()):
                full = ft.row(work, c, rows.tiles.get(workload), rows.machine)
                batch.append(rows.layout.base(full))
            where.append((i, list(moves)))
        predicted = np.asarray(model.predict(ft.as_matrix(batch)), dtype=np.float64)
        at = 0
        for state, names in where:
            per_move = {n: predicted[at + 1 + j] - predicted[at] for j, n in enumerate(names)}
            chosen = representatives(per_move)
            rows.representative[keys[state]] = chosen
            for cls, move in chosen.items():
                out[state, ALL_ACTIONS.index(cls)] = per_move[move]
            at += 1 + len(names)
    return out


DECIDE_SHARES = (0.0, 0.5, 1.0)
CONFIG_FOLDS = 5  # runtime-model CV folds over configurations, where one size was measured


def _choose_decide_share(
    rows: _Rows,
    keys: Sequence[StateKey],
    oof: Array,
    deltas: Array,
    mask: Array,
    y: Array,
    table: Table,
    transfer_choice: Mapping[str, Any],
    bandwidth: float = 0.0,
) -> tuple[float, Blend, dict[str, Any], Array]:
    """How much of the transfer prior `decide` blends into its neighbours' runtime differences
    (a share of the weight `recommend` uses), chosen with the blend by the same out-of-fold
    sessions on the training sizes: the highest mean % of best, ties to the smaller share."""
    best: tuple[float, float, Blend, dict[str, Any], Array] | None = None
    tried = []
    for share in DECIDE_SHARES:
        weights = {k: share * float(v) for k, v in transfer_choice["weight"].items()}
        if share > 0 and not any(weights.values()):
            break  # no prior to blend: every share decides as share 0 does
        d = _with_transfer(deltas, keys, rows, table, weights, bandwidth) if share > 0 else deltas
        blend, info = choose_blend(oof, d, mask, y, _session_scorer(rows, keys, oof, d, mask))
        score = float(info["sessions_pct_of_best"])
        tried.append({"share": share, "sessions_pct_of_best": round(score, 3), **blend.as_dict()})
        if best is None or round(score, 6) > round(best[0], 6):
            best = (score, share, blend, info, d)
    assert best is not None
    _, share, blend, info, d = best
    info["transfer_in_decide"] = {
        "share": share,
        "tried": tried,
        "chosen_by": "mean % of best of leave-one-size-out sessions on the training sizes, "
        "ties to the smaller share",
    }
    return share, blend, info, d


def _with_transfer(
    deltas: Array,
    keys: Sequence[StateKey],
    rows: _Rows,
    table: Table,
    weights: Mapping[str, float],
    bandwidth: float = 0.0,
) -> Array:
    """The out-of-fold deltas with the transfer prior blended in as `decide` blends the model
    file's (transfer.blended_deltas): at each state, the prior of the workload's other sizes,
    at the weight leave-one-size-out chose for its kind. The blend, its calibration and the
    sessions that choose them then see the decisions the model will make."""
    out = deltas.copy()
    priors: dict[tuple[str, int], Any] = {}
    for i, (workload, size, config) in enumerate(keys):
        if (workload, size) not in priors:
            priors[workload, size] = loso_prior(table, workload, size, bandwidth)
        found = priors[workload, size]
        if found is None:
            continue
        prior, kind = found
        moves = _represented(neighbours(config, rows.space(workload)), rows, keys[i])
        cols = [ALL_ACTIONS.index(action_class(n)) for n in moves]
        out[i, cols] = blended_deltas(
            out[i, cols], prior, config, list(moves.values()), float(weights.get(kind, 0.0))
        )
    return out


def _choose_runtime(
    Xr: Array,
    yr: Array,
    groups: Array,
    rkeys: Sequence[StateKey],
    seed: int,
    selection: str,
    candidates: Sequence[str] | None,
    how: str,
) -> tuple[str, float, dict[str, Any]]:
    """The runtime model `selection` prefers on the CV folds `groups`, its RMSE, and the
    metrics that say why (`how`: the folds, where they are not the sizes)."""
    name, cv, rmse = est.choose_regressor(
        Xr, yr, groups, [(w, s) for w, s, _ in rkeys], seed, selection, candidates
    )
    return (
        name,
        rmse,
        {
            "chosen": name,
            "selection": selection,
            "why": f"{how}{est.RUNTIME_SELECTIONS[selection][0]} (RMSE {rmse}, pairwise order "
            f"{cv[name]['pairwise_order']}) among {len(cv)} candidates",
            "candidates": cv,
            "rmse_log10": rmse,
        },
    )


def _fold_models(Xr: Array, yr: Array, rgroups: Array, factory: Any) -> dict[int, Any]:
    """The runtime model fitted without each size group."""
    out = {}
    for fold in np.unique(rgroups):
        fit_rows = rgroups != fold
        if fit_rows.any():
            out[int(fold)] = factory().fit(Xr[fit_rows], yr[fit_rows])
    return out


def _oof_runtime(Xr: Array, rgroups: Array, fitted: dict[int, Any]) -> Array:
    """Each runtime row's log10 runtime, predicted by the model fitted without its size."""
    out = np.full(len(Xr), np.nan)
    for fold, model in fitted.items():
        rows = rgroups == fold
        out[rows] = np.asarray(model.predict(Xr[rows]), dtype=np.float64)
    return out


def _decisions_came_true(
    rows: _Rows, keys: Sequence[StateKey], proba: Array
) -> tuple[Array, dict[str, Array], Array]:
    """For each out-of-fold decision (argmax of `proba`): whether it is STOP, and whether it
    came true on the measured runtimes by each calibration target's meaning (good:
    calibration.move_good, stop_good; not_slower: move_not_slower, stop_not_slower)."""
    stop: list[bool] = []
    came_true: dict[str, list[bool]] = {"good": [], "not_slower": [], "unattended": []}
    worse: list[bool] = []
    for key, p in zip(keys, proba, strict=True):
        workload, size, config = key
        choice = ALL_ACTIONS[int(np.argmax(p))]
        choice = rows.representative.get(key, {}).get(choice, choice)
        here = rows.outcomes[key]
        assert here.runtime_s is not None  # decisions are taken at states that ran
        space = rows.space(workload)
        stop.append(choice == STOP)
        found = [rows.outcomes.get((workload, size, c)) for c in neighbours(config, space).values()]
        around = [(o.runtime_s, o.spread) for o in found if o and o.ok and o.runtime_s]
        around_s = [t for t, _ in around]
        if choice == STOP:
            came_true["good"].append(stop_good(here.runtime_s, around_s))
            came_true["not_slower"].append(stop_not_slower(here.runtime_s, here.spread, around))
            came_true["unattended"].append(stop_unattended(here.runtime_s, around_s))
            worse.append(worse_than_best(here.runtime_s, here.runtime_s, around_s))
            continue
        target = apply_move(config, choice, space)
        there = rows.outcomes.get((workload, size, target)) if target is not None else None
        there_s, there_spread = (
            (there.runtime_s, there.spread) if there and there.ok else (None, None)
        )
        came_true["good"].append(move_good(here.runtime_s, there_s))
        came_true["not_slower"].append(
            move_not_slower(here.runtime_s, here.spread, there_s, there_spread)
        )
        came_true["unattended"].append(
            move_unattended(here.runtime_s, here.spread, there_s, there_spread)
        )
        worse.append(worse_than_best(there_s, here.runtime_s, around_s))
    return (
        np.asarray(stop, dtype=bool),
        {k: np.asarray(v, dtype=bool) for k, v in came_true.items()},
        np.asarray(worse, dtype=bool),
    )


def _session_scorer(
    rows: _Rows, keys: Sequence[StateKey], oof: Array, deltas: Array, mask: Array
) -> Callable[[Blend], float]:
    """Mean % of best reached by tuning sessions from every start of every training size, each
    decision taken from out-of-fold predictions (models fitted without that size), with the
    coordinator's own session rules replayed on the measured runtimes."""
    from types import SimpleNamespace

    from hpc_ds1.model.replay import Cell, Point, model_session
    from hpc_ds1.model.schema import State, Thresholds

    index = {key: i for i, key in enumerate(keys)}
    grouped: dict[tuple[str, int], dict[Any, Outcome]] = {}
    for (w, s, c), o in rows.outcomes.items():
        grouped.setdefault((w, s), {})[c] = o
    cells = [
        Cell(
            w,
            s,
            {
                c: Point(o.runtime_s, o.spread, o.throughput)
                for c, o in found.items()
                if o.ok and o.runtime_s
            },
            frozenset(c for c, o in found.items() if not o.ok),
        )
        for (w, s), found in sorted(grouped.items())
        if all((w, s, c) in index for c, o in found.items() if o.ok)
    ]
    thresholds = Thresholds(auto=0.0)

    class OutOfFold:
        device_id = ""

        def __init__(self, proba: Array) -> None:
            self.proba = proba

        def decide(self, state: State, *, space: Any, thresholds: Thresholds) -> Any:
            p = self.proba[index[(state.workload, state.size, state.config)]]
            key = (state.workload, state.size, state.config)
            names = [*_represented(neighbours(state.config, space), rows, key), STOP]
            alternatives = {n: float(p[ALL_ACTIONS.index(action_class(n))]) for n in names}
            choice = max(alternatives, key=lambda n: alternatives[n])
            return SimpleNamespace(
                choice=choice, alternatives=alternatives, mode="auto", reasons=[]
            )

    def score(blend: Blend) -> float:
        decider = OutOfFold(blend.proba(oof, deltas, mask))
        pcts = [
            model_session(decider, cell, start, rows.space(cell.workload), thresholds).pct_of_best
            for cell in cells
            for start in cell.points
            if cell.points
        ]
        return float(np.mean(pcts)) if pcts else 0.0

    return score


def _size_groups(keys: Sequence[StateKey], sizes: dict[str, list[int]]) -> Array:
    return np.asarray([sizes[w].index(s) for w, s, _ in keys], dtype=int)


def _single_threaded(model: Any) -> Any:
    """Fitted with 2 jobs; predicting one row is faster without a thread pool."""
    inner = [c.estimator for c in getattr(model, "calibrated_classifiers_", [])]
    if hasattr(model, "relative_"):  # relative.SizeRelative: its fitted tree
        inner.append(model.relative_)
    for m in (model, *inner):
        keys = [k for k in m.get_params() if k == "n_jobs" or k.endswith("__n_jobs")]
        if keys:
            m.set_params(**dict.fromkeys(keys, 1))
    return model


def _fit_classifier(name: str, X: Array, y: Array, groups: Array, seed: int) -> Any:
    model = est.classifier_candidates(seed)[name](groups)
    return est.fit_quietly(model, X, y)


def _held_out_eval(
    held: list[Measurement],
    machine: list[float],
    tiles: dict[str, tuple[int, ...]],
    space_for: SpaceFor | None,
    move_model: Any,
    runtime_model: Any,
    layout: ft.Layout,
) -> dict[str, Any] | None:
    """Scores of the final models on the held-out sizes (never used in training)."""
    if not held:
        return None
    outcomes = aggregate(m.model_copy(update={"held_out": False}) for m in held)
    rows = _Rows(outcomes, machine, tiles, space_for or _with_registered_knobs(outcomes), layout)
    out: dict[str, Any] = {}
    X, y, mask, tele, _ = rows.classification()
    if len(y):
        proba = est.masked(est.full_proba(move_model, X), mask)
        out["move"] = est.classification_scores(proba[tele], y[tele])
        out["move"]["states"] = int(tele.sum())
        out["move_without_telemetry"] = est.classification_scores(proba[~tele], y[~tele])
    Xr, yr, keys = rows.regression()
    if len(yr):
        pred = np.asarray(runtime_model.predict(Xr))
        out["runtime"] = est.regression_scores(pred, yr, [(w, s) for w, s, _ in keys])
    return out


def feature_layout(base: Sequence[str] | None) -> ft.Layout:
    """The columns of a model trained on the BASE columns `base` (None: the default ones,
    features.DEFAULT_BASE_FEATURES), telemetry after."""
    if base is None:
        base = ft.DEFAULT_BASE_FEATURES
    unknown = [n for n in base if n not in ft.BASE_FEATURES]
    if unknown or not base:
        raise ValueError(
            f"features {list(base)!r}: accepted are a non-empty subset of "
            f"{', '.join(ft.BASE_FEATURES)}"
        )
    names = [n for n in ft.BASE_FEATURES if n in base]
    return ft.Layout([*names, *ft.TELEMETRY_FEATURES], len(names))


def train(
    measurements: Sequence[Measurement | Mapping[str, Any]],
    fingerprint: Any,
    *,
    seed: int = 0,
    space_for: SpaceFor | None = None,
    trained_at: str | None = None,
    candidates: Sequence[str] | None = None,
    calibrate_on: str = "unattended",
    runtime_selection: str = "order",
    features: Sequence[str] | None = None,
    runtime_candidates: Sequence[str] | None = None,
) -> TrainedModel:
    """Train on the ok, not held-out measurements of one device (`fingerprint`: a Fingerprint).
    A measurement at a registered workload's held-out size counts as held out, flagged or not.

    Failed runs only make their configuration worse than any ok one in the labels; held-out rows
    are scored after training (metrics["held_out"]) and never fitted. Neighbours for the labels
    come from `space_for(workload)` when given, else from the space the measurements span.
    `candidates` limits the move-model candidates compared (names in
    estimators.classifier_candidates); all by default. `calibrate_on`: what the confidence
    states the chance of (calibration.TARGETS; "good" was the target before 1 Dec 2026).
    `runtime_selection`: how the runtime model is chosen (estimators.RUNTIME_SELECTIONS).
    `runtime_candidates`: the runtime models compared (names in
    estimators.regressor_candidates); all by default. `features`: the BASE columns to train on
    (features.BASE_FEATURES, in that order; default features.DEFAULT_BASE_FEATURES); telemetry
    always follows."""
    if calibrate_on not in TARGETS:
        raise ValueError(f"calibrate_on={calibrate_on!r}: accepted are {', '.join(TARGETS)}")
    if runtime_selection not in est.RUNTIME_SELECTIONS:
        raise ValueError(
            f"runtime_selection={runtime_selection!r}: accepted are "
            f"{', '.join(est.RUNTIME_SELECTIONS)}"
        )
    started = time.perf_counter()
    ms = [_coerce(m) for m in measurements]
    if features is None and any(m.config.get("knobs") for m in ms):
        features = (*ft.DEFAULT_BASE_FEATURES, *ft.OWN_KNOB_FEATURES)
    layout = feature_layout(features)
    fp = (
        fingerprint.model_dump(mode="json")
        if hasattr(fingerprint, "model_dump")
        else dict(fingerprint)
    )
    held = [m for m in ms if m.held_out]
    outcomes = aggregate(ms)
    machine = ft.machine_vector(fp)
    measured = sorted({w for (w, _, _), o in outcomes.items() if o.ok})
    if not measured:
        raise ValueError("no successful measurements to train on")
    sizes = {w: sorted({s for (x, s, _) in outcomes if x == w}) for w in measured}
    tiles = {w: _measured_space(outcomes, w).tiles for w in measured}
    rows = _Rows(outcomes, machine, tiles, space_for or _with_registered_knobs(outcomes), layout)
    transfer_table = relative_table(outcomes)
    runtimes = {k: o.runtime_s for k, o in outcomes.items() if o.ok and o.runtime_s}
    smoothing = choose_bandwidth(transfer_table, runtimes)
    bandwidth = float(smoothing["bandwidth"])

    X, y, mask, tele, ckeys = rows.classification()
    Xr, yr, rkeys = rows.regression()
    if len(set(y.tolist())) < 2:
        found = ALL_ACTIONS[int(y[0])] if len(y) else "nothing"
        raise ValueError(
            f"the measurements teach only one move ({found}); measure more sizes or "
            "configurations so that at least two different moves are right somewhere"
        )
    groups = _size_groups(ckeys, sizes)
    rgroups = _size_groups(rkeys, sizes)
    n_groups = len(np.unique(groups))

    move_metrics: dict[str, Any]
    runtime_metrics: dict[str, Any]
    if n_groups >= 2:
        # CV on the rows with telemetry (the decision path); the final fit adds the same states
        # without telemetry so that a state with none still gets an answer.
        move_name, move_cv, oof = est.choose_classifier(
            X[tele], y[tele], groups[tele], mask[tele], seed, candidates
        )
        why = (
            f"lowest leave-one-size-out log loss ({move_cv[move_name]['log_loss']}) among "
            f"{len(move_cv)} candidates over {n_groups} folds"
        )
        conf, correct = oof.max(axis=1), (oof.argmax(axis=1) == y[tele])
        move_metrics = {
            "chosen": move_name,
            "why": why,
            "candidates": move_cv,
            "held_out_size_accuracy": move_cv[move_name]["accuracy"],
            "calibration": {
                "ece": move_cv[move_name]["ece"],
                "table": est.calibration_table(conf, correct.astype(float)),
            },
        }
        rt_name, rt_rmse, runtime_metrics = _choose_runtime(
            Xr, yr, rgroups, rkeys, seed, runtime_selection, runtime_candidates, ""
        )
        tele_keys = [k for k, t in zip(ckeys, tele, strict=True) if t]
        rt_factory = est.regressor_candidates(seed)[rt_name]
        fitted = _fold_models(Xr, yr, rgroups, rt_factory)
        deltas = _oof_deltas(rows, tele_keys, groups[tele], Xr, yr, rgroups, rt_factory, fitted)
        oof_runtime = _oof_runtime(Xr, rgroups, fitted)
        transfer_choice = choose_weights(
            transfer_table,
            {k: float(v) for k, v in zip(rkeys, oof_runtime, strict=True) if np.isfinite(v)},
            runtimes,
            bandwidth,
        )
        decide_share, blend, move_metrics["blend"], deltas = _choose_decide_share(
            rows,
            tele_keys,
            oof,
            deltas,
            mask[tele],
            y[tele],
            transfer_table,
            transfer_choice,
            bandwidth,
        )
        decided = blend.proba(oof, deltas, mask[tele])
        d_conf, d_correct = decided.max(axis=1), (decided.argmax(axis=1) == y[tele])
        move_metrics["decision"] = {
            "what": "the probabilities decisions use: classifier and runtime ranking blended",
            **est.classification_scores(decided, y[tele]),
            "table": est.calibration_table(d_conf, d_correct.astype(float)),
        }
        d_stop, came_true, worse = _decisions_came_true(rows, tele_keys, decided)
        d_features = decision_features(decided, deltas, ALL_ACTIONS.index(STOP))
        calibration, move_metrics["not_slower"] = fit_and_score(
            d_conf, d_stop, came_true[calibrate_on], groups[tele], calibrate_on, d_features
        )
        crossed = crossed_confidence(
            d_conf,
            d_stop,
            came_true[calibrate_on],
            groups[tele],
            d_features,
            tuple(calibration.logistic),
        )
        # issue 43: does the confidence tell the decisions that end >= 5 % above the best they
        # could reach from the others? (leave-one-size-out calibrated, out-of-fold decisions)
        move_metrics["discrimination"] = {
            "what": f"confidence against 'ends less than {WORSE:.0%} above the best available' "
            "(AUROC), its Brier decomposition, and the error among the decisions taken at each "
            "coverage, highest confidence first",
            **discrimination_report(crossed, ~worse, threshold=Thresholds().auto),
        }
        # the other target, scored in sample under this calibration (what it would have meant)
        move_metrics["not_slower"]["ece_in_sample_on_other_targets"] = {
            t: round(ece(calibrated(calibration, d_conf, d_stop, d_features), v), 4)
            for t, v in came_true.items()
            if t != calibrate_on
        }
    else:
        move_name, rt_name, rt_rmse = DEFAULT_MOVE, DEFAULT_RUNTIME, 0.3
        note = "only one measured size per workload: no leave-one-size-out CV possible; default"
        move_metrics = {"chosen": move_name, "why": note, "candidates": {}}
        runtime_metrics = {"chosen": rt_name, "why": note, "candidates": {}, "rmse_log10": None}
        if len(yr) >= CONFIG_FOLDS * 4:
            # One size (a recorded GPU space, a setup of one size): the runtime model is still
            # chosen, on folds of configurations instead of sizes.
            folds = np.random.default_rng(seed).permutation(len(yr)) % CONFIG_FOLDS
            rt_name, rt_rmse, runtime_metrics = _choose_runtime(
                Xr, yr, folds, rkeys, seed, runtime_selection, runtime_candidates,
                f"one measured size: {CONFIG_FOLDS}-fold CV over its configurations, ",
            )  # fmt: skip
        blend = Blend()
        decide_share = 0.0
        transfer_choice = choose_weights(transfer_table, {}, {}, bandwidth)
        calibration = Calibration({})

    order = [move_name] + [n for n in est.ranked(move_metrics["candidates"]) if n != move_name]
    move_model = None
    for name in order:
        try:
            fitted = _fit_classifier(name, X, y, groups, seed)
        except ValueError as error:
            move_metrics.setdefault("final_fit_failed", {})[name] = str(error)
            continue
        gap = classifier_conversion_error(fitted, X)
        if not gap <= CONVERSION_TOLERANCE:
            move_metrics.setdefault("final_fit_failed", {})[name] = (
                f"its ONNX conversion differs from scikit-learn by {gap:.3g} in probability "
                f"(accepted: {CONVERSION_TOLERANCE:g})"
            )
            continue
        move_model = fitted
        if name != move_name:
            move_metrics["chosen"] = name
            move_metrics["why"] += f"; {move_name} failed its final fit (final_fit_failed)"
            move_name = name
        break
    if move_model is None:
        raise ValueError(f"no move model could be fitted: {move_metrics.get('final_fit_failed')}")
    runtime_model = est.regressor_candidates(seed)[rt_name]()
    runtime_model.fit(Xr, yr)
    guard = DistanceGuard.fit(Xr)
    move_model, runtime_model = _single_threaded(move_model), _single_threaded(runtime_model)

    label_counts = Counter(ALL_ACTIONS[i] for i in y[tele])
    flagged = float(np.mean(guard.loo_distances > guard.threshold))
    metrics: dict[str, Any] = {
        "counts": {
            "measurements": len(ms),
            "held_out_ignored": len(held),
            "failed_or_wrong": sum(1 for m in ms if not m.held_out and not m.ok),
            "states": int(tele.sum()),
            "runtime_rows": len(yr),
            "labels": dict(sorted(label_counts.items())),
            "workloads": {w: len(sizes[w]) for w in measured},
            "skipped_unregistered_workloads": sorted(rows.skipped),
        },
        "cv": f"leave-one-size-out: fold k holds out the k-th measured size of every workload "
        f"({n_groups} folds)",
        "move_model": move_metrics,
        "runtime_model": runtime_metrics,
        "transfer": {**transfer_choice, "smoothing": smoothing},
        "guard": {
            "distance_threshold": round(guard.threshold, 5),
            "rule": f"{DISTANCE_PERCENTILE:g}th percentile of leave-one-out nearest-neighbour "
            f"distances x {DISTANCE_MARGIN:g}",
            "loo_distance_median": round(float(np.median(guard.loo_distances)), 5),
            "training_rows_flagged": round(flagged, 5),
            "training_rows": len(guard.loo_distances),
        },
        "held_out": _held_out_eval(
            held, machine, tiles, space_for, move_model, runtime_model, layout
        ),
        "seed": seed,
    }
    metadata: dict[str, Any] = {
        "format": FORMAT,
        "name": "hpc_ds1-move-runtime-guard",
        "trained_at": trained_at or dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device_id": fp.get("device_id", ""),
        "fingerprint": fp,
        "machine": machine,
        "features": list(layout.names),
        "n_base": layout.n_base,
        "classes": [ALL_ACTIONS[int(c)] for c in move_model.classes_],
        "workloads": {
            w: {
                "range": [sizes[w][0], sizes[w][-1]],
                "sizes": sizes[w],
                "tiles": list(tiles[w]),
                "blocks": list(_measured_space(outcomes, w).blocks),
            }
            for w in measured
        },
        "unknown_work": [float(v) for v in Xr[:, : ft.N_WORK].mean(axis=0)],
        "distance_threshold": guard.threshold,
        "runtime_rmse_log10": rt_rmse,
        "blend": blend.as_dict(),
        "transfer": {
            "table": to_metadata(transfer_table),
            # the table is stored as measured; a reader smooths it at this width (ln size)
            "bandwidth": bandwidth,
            "weight": transfer_choice["weight"],
            "rmse_log10": transfer_choice["rmse_log10"],
            # the share of that weight decide blends into its neighbours' runtime
            # differences (older files: none, and their calibration was fitted without it)
            "decide_share": decide_share,
        },
        "calibration": calibration.as_dict(),
        "calibration_target": calibrate_on,
        "estimators": {"move": move_name, "runtime": rt_name},
        "metrics": metrics,
    }
    data = build(move_model, runtime_model, guard, layout.n_state, layout.n_base, metadata)
    metrics["train_seconds"] = round(time.perf_counter() - started, 3)
    trained = TrainedModel(move_model, runtime_model, guard, metadata, data, metrics)
    metrics["version"] = trained.version
    metrics["onnx_bytes"] = len(data)
    return trained
