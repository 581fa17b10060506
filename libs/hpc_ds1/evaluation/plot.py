"""The evaluation as a picture: % of best against real runs per policy, and reliability."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpc_ds1.model.replay import SessionOutcome

from .decisions import Checked
from .policies import ALL_POLICIES

COLOURS = {
    "model": "#1f77b4",
    "model_recommend": "#1a9850",
    "model_transfer": "#17becf",
    "model_engineer": "#6baed6",
    "model_live": "#08306b",
    "model_recommend_live": "#00441b",
    "greedy": "#ff7f0e",
    "random": "#2ca02c",
    "optuna_tpe": "#9467bd",
    "exhaustive": "#7f7f7f",
    "always_stop": "#bdbdbd",
    "lookup": "#8c564b",
    "start_then_lookup": "#e377c2",
    "optuna_tpe_warm": "#5e3c99",
}


def write_plot(
    path: Path,
    sessions: Sequence[SessionOutcome],
    checks: Sequence[Checked],
    reliability: Sequence[dict[str, Any]],
    title: str,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display here
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    for policy in ALL_POLICIES:
        mine = [o for o in sessions if o.policy == policy]
        if not mine:
            continue
        runs = [o.runs for o in mine]
        pcts = [o.pct_of_best for o in mine]
        left.scatter(runs, pcts, s=10, alpha=0.25, color=COLOURS[policy])
        left.scatter(
            [statistics.median(runs)],
            [statistics.median(pcts)],
            s=120,
            marker="D",
            edgecolor="black",
            color=COLOURS[policy],
            label=f"{policy} (median)",
        )
    left.set_xlabel("real runs per session")
    left.set_ylabel("% of best configuration reached")
    left.set_title("Tuning sessions on held-out sizes")
    left.grid(alpha=0.3)
    left.legend(loc="lower right", fontsize=8)

    right.plot([0, 1], [0, 1], linestyle="--", color="grey", label="perfectly calibrated")
    if reliability:
        right.plot(
            [r["mean_confidence"] for r in reliability],
            [r["accuracy"] for r in reliability],
            marker="o",
            label=f"model ({len(checks)} held-out decisions)",
        )
        for r in reliability:
            right.annotate(str(r["decisions"]), (r["mean_confidence"], r["accuracy"]), fontsize=7)
    right.set_xlim(0, 1)
    right.set_ylim(0, 1.02)
    right.set_xlabel("stated confidence")
    right.set_ylabel("observed accuracy (move = best move)")
    right.set_title("Reliability")
    right.grid(alpha=0.3)
    right.legend(loc="upper left", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path
