"""Every held-out state decided once: right or wrong against the landscape's own best move,
and the reliability table and auto-move accuracy that follow; and (issue 43) whether the
decision was right to run unattended and whether it ends >= 5 % above the best available, with
the confidence's discrimination of both (model/discrimination.py)."""

from __future__ import annotations

import itertools
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpc_ds1.model import Model, Thresholds
from hpc_ds1.model.calibration import (
    WORSE,
    ece,
    move_good,
    move_not_slower,
    move_unattended,
    stop_good,
    stop_not_slower,
    stop_unattended,
    worse_than_best,
)
from hpc_ds1.model.discrimination import report as discrimination_report
from hpc_ds1.model.labels import Outcome, label_outcomes
from hpc_ds1.model.replay import Cell
from hpc_ds1.space import STOP, Config, apply_move, neighbours

from .landscape import SpaceFor

BIN_EDGES = (0.0, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0)
MODES = ("auto", "confirm", "escalate")


@dataclass(frozen=True)
class Checked:
    """One decision on a held-out state, and what the landscape says of it."""

    workload: str
    size: int
    config: Config
    choice: str
    best_move: str  # the label: the fastest neighbour beyond noise, else STOP
    confidence: float
    mode: str
    reasons: tuple[str, ...]
    far: bool  # the distance guard alone would flag it
    # a move: it leads to a configuration slower beyond the noise (or failing); STOP: it leaves
    # a neighbour faster beyond the noise behind (model/calibration.py, target "not_slower")
    slower: bool
    # a move at most 2 % slower; STOP with no neighbour more than 2 % faster (what the
    # confidence of models calibrated on "good" states, model/calibration.py)
    good: bool = False
    # right to run unattended (issue 43; model/calibration.py, target "unattended"): a move makes
    # the job faster beyond the noise of the two measurements; STOP leaves at most 2 % on the
    # table (no neighbour more than 2 % faster)
    unattended: bool = False
    # the decision ends >= 5 % above the best it could reach from this state (the current
    # configuration or a neighbour that ran); a move to a configuration that failed always does
    worse_5: bool = False

    @property
    def right(self) -> bool:
        return self.choice == self.best_move

    @property
    def flagged(self) -> bool:
        return bool(self.reasons_from_guard)

    @property
    def reasons_from_guard(self) -> tuple[str, ...]:
        return tuple(r for r in self.reasons if not r.startswith("confidence "))


def cell_labels(cell: Cell, space_for: SpaceFor) -> dict[Config, str]:
    outcomes = {
        (cell.workload, cell.size, c): Outcome(True, p.runtime_s, p.spread, p.throughput)
        for c, p in cell.points.items()
    }
    outcomes.update(
        {(cell.workload, cell.size, c): Outcome(False, None, None, None) for c in cell.failed}
    )
    return {c: move for (_, _, c), move in label_outcomes(outcomes, space_for).items()}


def check_cell(
    model: Model,
    cell: Cell,
    space_for: SpaceFor,
    thresholds: Thresholds,
    only: Collection[Config] | None = None,
) -> list[Checked]:
    """Every state of the cell that ran (`only`: those of them) decided once."""
    space = space_for(cell.workload)
    labels = cell_labels(cell, space_for)
    out = []
    for config, point in sorted(cell.points.items(), key=lambda cp: cp[0].label()):
        if only is not None and config not in only:
            continue
        d = model.decide(
            cell.state(config),
            space=space,
            thresholds=thresholds,
        )
        found = [cell.points.get(c) for c in neighbours(config, space).values()]
        around = [(p.runtime_s, p.spread) for p in found if p is not None]
        around_s = [t for t, _ in around]
        if d.choice != STOP:
            target = apply_move(config, d.choice, space)
            there = cell.points.get(target) if target is not None else None
            there_s, there_spread = (there.runtime_s, there.spread) if there else (None, None)
            slower = not move_not_slower(point.runtime_s, point.spread, there_s, there_spread)
            good = move_good(point.runtime_s, there_s)
            unattended = move_unattended(point.runtime_s, point.spread, there_s, there_spread)
            worse_5 = worse_than_best(there_s, point.runtime_s, around_s)
        else:
            slower = not stop_not_slower(point.runtime_s, point.spread, around)
            good = stop_good(point.runtime_s, around_s)
            unattended = stop_unattended(point.runtime_s, around_s)
            worse_5 = worse_than_best(point.runtime_s, point.runtime_s, around_s)
        out.append(
            Checked(
                cell.workload,
                cell.size,
                config,
                d.choice,
                labels[config],
                d.confidence,
                d.mode,
                tuple(d.reasons),
                _far(d.distance, d.distance_threshold),
                slower,
                good,
                unattended,
                worse_5,
            )
        )
    return out


def _far(distance: float | None, threshold: float | None) -> bool:
    return distance is not None and threshold is not None and distance > threshold


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def came_true(c: Checked, not_slower: bool, good: bool, unattended: bool) -> bool:
    """Whether the decision came out as its confidence states it would, for each label."""
    if unattended:
        return c.unattended
    if good:
        return c.good
    return (not c.slower) if not_slower else c.right


def reliability(
    checks: Sequence[Checked],
    *,
    not_slower: bool = False,
    good: bool = False,
    unattended: bool = False,
) -> list[dict[str, Any]]:
    """Stated confidence against observed accuracy, per confidence bin; with `not_slower`,
    accuracy is the share of moves that are not slower (an equally good move is not wrong);
    with `good`, the share of good decisions (Checked.good); with `unattended`, the share right
    to run unattended (Checked.unattended)."""

    rows = []
    for lo, hi in itertools.pairwise(BIN_EDGES):
        inside = [c for c in checks if lo <= c.confidence < hi or (hi == 1.0 and c.confidence == 1)]
        if not inside:
            continue
        rows.append(
            {
                "bin": f"{lo:.2f}–{hi:.2f}",  # noqa: RUF001
                "decisions": len(inside),
                "mean_confidence": round(sum(c.confidence for c in inside) / len(inside), 4),
                "accuracy": round(
                    sum(came_true(c, not_slower, good, unattended) for c in inside) / len(inside), 4
                ),
            }
        )
    return rows


def _ece(
    checks: Sequence[Checked],
    *,
    not_slower: bool = False,
    good: bool = False,
    unattended: bool = False,
) -> float | None:
    """The expected calibration error (model.calibration.ece, over the reliability table's
    bins) of the confidence against one label; None without decisions."""
    if not checks:
        return None
    stated = np.array([c.confidence for c in checks])
    true = np.array([came_true(c, not_slower, good, unattended) for c in checks])
    return round(ece(stated, true), 4)


def calibration_summary(checks: Sequence[Checked], thresholds: Thresholds) -> dict[str, Any]:
    auto = [c for c in checks if c.mode == "auto"]
    moves = [c for c in checks if c.choice != STOP]
    table = reliability(checks)
    lenient = reliability(checks, not_slower=True)
    strict = reliability(checks, good=True)
    n = len(checks)
    confidence = [c.confidence for c in checks]
    unattended = reliability(checks, unattended=True)
    modes = {m: sum(c.mode == m for c in checks) for m in MODES}
    return {
        "decisions": n,
        "accuracy": _share(sum(c.right for c in checks), n),
        "auto_threshold": thresholds.auto,
        "auto_moves": len(auto),
        "auto_right": _share(sum(c.right for c in auto), len(auto)),
        "auto_not_slower": _share(sum(not c.slower for c in auto), len(auto)),
        "ece": _ece(checks),
        "not_slower": _share(sum(not c.slower for c in checks), n),
        "ece_not_slower": _ece(checks, not_slower=True),
        # A STOP is slower when it leaves a neighbour faster beyond the noise behind (before
        # 1 Dec 2026 a STOP was never slower); the moves alone are scored apart as well.
        "moves": len(moves),
        "moves_not_slower": _share(sum(not c.slower for c in moves), len(moves)),
        "ece_not_slower_moves": _ece(moves, not_slower=True),
        "ece_good_moves": _ece(moves, good=True),
        "reliability": table,
        "reliability_not_slower": lenient,
        "good": _share(sum(c.good for c in checks), n),
        "ece_good": _ece(checks, good=True),
        "auto_good": _share(sum(c.good for c in auto), len(auto)),
        "reliability_good": strict,
        "good_means": "a move at most 2 % slower; STOP with no neighbour more than 2 % faster "
        "(what the confidence of models with calibration_target 'good' states)",
        "not_slower_means": "a move whose target is not slower beyond the noise; STOP whose "
        "fastest neighbour is not faster beyond the noise (what the confidence of models with "
        "calibration_target 'not_slower' states)",
        "right_means": "the chosen move is the landscape's best move (the fastest neighbour "
        "beyond the noise, else STOP)",
        # issue 43: the label the confidence should now state, and whether it discriminates
        "unattended": _share(sum(c.unattended for c in checks), n),
        "ece_unattended": _ece(checks, unattended=True),
        "auto_unattended": _share(sum(c.unattended for c in auto), len(auto)),
        "reliability_unattended": unattended,
        "unattended_means": "right to run unattended: a move makes the job faster beyond the "
        "noise of the two measurements; STOP leaves at most 2 % on the table (what the "
        "confidence of models with calibration_target 'unattended' states)",
        "worse_5": _share(sum(c.worse_5 for c in checks), n),
        "worse_5_means": f"the decision ends at least {WORSE:.0%} above the best configuration "
        "it could reach (the current one or a neighbour that ran); a move to one that failed "
        "always does",
        "modes": modes,
        "mode_shares": {m: _share(k, n) for m, k in modes.items()},
        # of the decisions run automatically (STOP included, as in auto_moves), the share that
        # end within 5 % of the best available (issue 43's target: >= 99 %)
        "auto_within_5": _share(sum(not c.worse_5 for c in auto), len(auto)),
        "discrimination": {
            "what": f"confidence against 'ends less than {WORSE:.0%} above the best available' "
            "(AUROC; 0.5: no better than chance, 1: every such decision more confident than "
            "every worse one), its Brier decomposition, and the error among the decisions taken "
            "at each coverage, highest confidence first; at_threshold: confidence >= the auto "
            "threshold (the guard aside)",
            **discrimination_report(
                confidence, [not c.worse_5 for c in checks], threshold=thresholds.auto
            ),
            "unattended": discrimination_report(
                confidence, [c.unattended for c in checks], threshold=thresholds.auto
            ),
        },
    }


def false_flags(checks: Sequence[Checked]) -> dict[str, Any]:
    """Held-out sizes of familiar workloads flagged by the guard (size range or distance)."""
    per: dict[str, list[Checked]] = {}
    for c in checks:
        per.setdefault(c.workload, []).append(c)
    return {
        "states": len(checks),
        "flagged": sum(c.flagged for c in checks),
        "rate": _share(sum(c.flagged for c in checks), len(checks)),
        "by_workload": {
            w: _share(sum(c.flagged for c in cs), len(cs)) for w, cs in sorted(per.items())
        },
    }


def guard_row(workload: str, checks: Sequence[Checked], thresholds: Thresholds) -> dict[str, Any]:
    """One never-seen kernel: how often the guard flags it, and the confidently wrong moves
    (confidence >= auto threshold, and not the best move or slower) before and after."""
    confident_wrong = [
        c for c in checks if c.confidence >= thresholds.auto and (not c.right or c.slower)
    ]
    n = len(checks)
    return {
        "kernel": workload,
        "states": n,
        "flagged_by_guard": _share(sum(c.flagged for c in checks), n),
        "flagged_by_distance": _share(sum(c.far for c in checks), n),
        "confidently_wrong_before": len(confident_wrong),
        "confidently_wrong_after_guard": sum(c.mode == "auto" for c in confident_wrong),
        "confidently_wrong_after_distance_only": sum(not c.far for c in confident_wrong),
    }
