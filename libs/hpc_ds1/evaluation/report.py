"""The evaluation's tables, as text for the terminal."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .headline import versus_note

TAIL_SIZES_SHOWN = 4  # the sizes holding most of the model's low tail, named in the report


def _cell(value: Any) -> str:
    if value is None:
        return "–"  # noqa: RUF001
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    text = [[_cell(v) for v in row] for row in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in text)) if text else len(h) for i, h in enumerate(headers)
    ]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in text]
    return "\n".join(out)


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"  # noqa: RUF001


def render(results: dict[str, Any]) -> str:
    parts = []
    land, noise = results["landscape"], results["landscape"]["noise"]
    parts.append(
        f"Held-out landscape: {land['cells']} sizes x every configuration, "
        f"{land['measurements']} real runs; run-to-run spread median "
        f"{_pct(noise['spread_median'])}, p90 {_pct(noise['spread_p90'])}; "
        f"configurations within noise of the best: median "
        f"{noise['tied_with_best_median']} per size\n"
    )
    s = results["sessions"]
    parts.append(
        f"Tuning sessions on held-out sizes ({s['sessions_per_policy']} sessions per policy, "
        f"budget {s['budget']} real runs for random and TPE)"
    )
    parts.append(
        table(
            ["policy", "% of best: median", "p10", "real runs: median", "max"],
            [
                [r["policy"], r["pct_median"], r["pct_p10"], r["runs_median"], r["runs_max"]]
                for r in s["table"]
            ],
        )
    )
    model_row = next((r for r in s["table"] if r["policy"] == "model"), None)
    if model_row is not None:
        parts.append(
            f"model: {model_row['engineer_moves_per_session']} proposals per session would have "
            f"waited for an engineer ({s['replayed_engineer']})"
        )
    if "truth" in results:
        parts.append(render_truth(results["truth"]))
    if results.get("live"):
        parts.append(render_live(results["live"]))
    s1 = results["system1"]
    parts.append("\nSystem 1: the whole configuration before anything runs")
    parts.append(
        table(
            ["approach", "% of best: median", "p10", "real runs"],
            [[r["approach"], r["median"], r["p10"], r["real_runs"]] for r in s1["table"]],
        )
    )
    g = results["guard"]
    parts.append("\nFamiliarity guard on never-seen kernels (retrained without each)")
    parts.append(
        table(
            [
                "kernel held out",
                "flagged by guard",
                "by distance alone",
                "confidently wrong auto-runs",
            ],
            [
                [
                    r["kernel"],
                    _pct(r.get("flagged_by_guard")),
                    _pct(r.get("flagged_by_distance")),
                    f"{r['confidently_wrong_before']} → {r['confidently_wrong_after_guard']}"
                    if "confidently_wrong_before" in r
                    else r.get("error", ""),
                ]
                for r in g["kernels"]
            ],
        )
    )
    ff = g["false_flags"]
    parts.append(
        f"false flags on familiar workloads' held-out sizes: {ff['flagged']} of {ff['states']} "
        f"({_pct(ff['rate'])})"
    )
    c = results["calibration"]
    parts.append(
        f"\nCalibration: {c['auto_moves']} of {c['decisions']} held-out decisions would run "
        f"automatically; right {_pct(c['auto_right'])}, not slower {_pct(c['auto_not_slower'])}; "
        f"all decisions right {_pct(c['accuracy'])}; ECE {c['ece']}; all decisions not slower "
        f"{_pct(c.get('not_slower'))}, ECE on not slower {c.get('ece_not_slower')}; the "
        f"{c.get('moves')} moves alone (STOP is never slower): not slower "
        f"{_pct(c.get('moves_not_slower'))}, ECE on not slower {c.get('ece_not_slower_moves')}, "
        f"on good {c.get('ece_good_moves')}"
    )
    parts.append(
        table(
            ["confidence", "decisions", "mean confidence", "accuracy"],
            [
                [r["bin"], r["decisions"], r["mean_confidence"], r["accuracy"]]
                for r in c["reliability"]
            ],
        )
    )
    parts += _discrimination(c)
    return "\n".join(parts)


def _num(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"  # noqa: RUF001


def _discrimination(c: dict[str, Any]) -> list[str]:
    """Issue 43's figures (absent from evaluations before it): the modes, the automatic
    decisions within 5 % of the best, the unattended label's calibration, and whether the
    confidence discriminates."""
    d = c.get("discrimination")
    if not d:
        return []
    shares = c.get("mode_shares") or {}
    unattended = d.get("unattended") or {}
    brier = d.get("brier") or {}
    risk = d.get("selective_risk") or {}
    at = risk.get("at_threshold") or {}
    lines = [
        "\nConfidence as the right to run unattended (issue 43)",
        "modes: "
        + ", ".join(f"{m} {_pct(shares.get(m))}" for m in ("auto", "confirm", "escalate"))
        + f"; automatic within 5 % of the best available {_pct(c.get('auto_within_5'))} "
        "(target >= 99 %)",
        f"right unattended: {_pct(c.get('unattended'))} of all, {_pct(c.get('auto_unattended'))} "
        f"of the automatic; ECE on unattended {_num(c.get('ece_unattended'), 4)}",
        f"discrimination: AUROC {_num(d.get('auroc'))} for ending < 5 % above the best "
        f"({_pct(c.get('worse_5'))} end >= 5 % above), {_num(unattended.get('auroc'))} for "
        f"right unattended; Brier {_num(brier.get('brier'), 4)} (resolution "
        f"{_num(brier.get('resolution'), 4)})",
        "selective risk (taken, most confident first: >= 5 % worse among them): "
        + ", ".join(f"{_pct(p['coverage'])}: {_pct(p['risk'])}" for p in risk.get("curve", [])),
    ]
    if at:
        lines.append(
            f"at the auto threshold (confidence >= {at['threshold']:g}): {_pct(at['coverage'])} "
            f"taken, {_pct(at.get('risk'))} of them >= 5 % worse"
        )
    rows = c.get("reliability_unattended") or []
    if rows:
        lines.append(
            table(
                ["confidence", "decisions", "mean confidence", "right unattended"],
                [[r["bin"], r["decisions"], r["mean_confidence"], r["accuracy"]] for r in rows],
            )
        )
    return lines


def render_truth(t: dict[str, Any]) -> str:
    """The sessions scored on the truth pass, with the observed-pass score beside."""
    x = t["exhaustive_check"]
    head = (
        f"\nScored against the truth pass ({t['configurations']} configurations re-measured, "
        f"{t['repeats']} repeats in interleaved rounds, seed {t.get('seed')}; spread median "
        f"{_pct(t['spread_median'])}, p90 {_pct(t['spread_p90'])})"
    )
    body = table(
        [
            "policy",
            "true % of best: median",
            "p10",
            "mean",
            "within noise",
            "speed-up captured: median",
            "cost s: median",
            "observed % (old): median",
            "p10",
        ],
        [
            [
                r["policy"],
                r["pct_median"],
                r["pct_p10"],
                r["pct_mean"],
                _pct(r["within_noise_share"]),
                _pct(r["speedup_captured_median"]),
                r["cost_s_median"],
                r["observed_pct_median"],
                r["observed_pct_p10"],
            ]
            for r in t["table"]
        ],
    )
    check = (
        f"exhaustive search on the truth pass: mean {x['pct_mean']} % of the true best, "
        f"below 100 % at {x['cells_below_100']} of {x['cells']} sizes (min {x['pct_min']} %)"
    )
    parts = [head, body, check]
    tail = t.get("model_tail") or {}
    if tail.get("sizes"):
        where = "; ".join(
            f"{r['workload']} {r['size']} {r['below_p10']} of {r['sessions']} (median "
            f"{r['model_median']}, exhaustive {r['exhaustive_median']})"
            for r in tail["sizes"][:TAIL_SIZES_SHOWN]
        )
        more = len(tail["sizes"]) - TAIL_SIZES_SHOWN
        parts.append(
            f"below the model's p10 ({tail['p10']}): {tail['below']} of its sessions, at {where}"
            + (f"; {more} more sizes" if more > 0 else "")
        )
    parts.append(f"within noise: {t['noise']}")
    a = t.get("agreement") or {}
    if a.get("cells"):
        parts.append(
            f"the two passes agree: truth / observed median {a['level_median']} (per size "
            f"{a['level_range'][0]}-{a['level_range'][1]}), beyond it "
            f"{_pct(a['disagreement_median'])} at the median size (max "
            f"{_pct(a['disagreement_max'])}), rank correlation median "
            f"{a['rank_correlation_median']} (min {a['rank_correlation_min']}), "
            f"{a['cells']} sizes"
        )
    if t.get("system1"):
        parts.append("System 1 on the truth pass (0 runs), true % of best:")
        parts += [
            f"  {r['key']:22} median {r['median']}, p10 {r['p10']} "
            f"({r['scored']} sizes scored, {r['unscored']} not re-measured)"
            for r in t["system1"]
        ]
    for other, v in (t.get("system1_versus") or {}).items():
        if v is None:
            continue
        parts.append(
            f"System 1 model - {other}: median {v['median_difference']:+} {v['median_interval']} "
            f"({v['interval']}, {v['cells']} cells); same pick at {v['same_pick']}, ahead at "
            f"{v['ahead']} ({v['ahead_beyond_noise']} beyond the truth's noise), behind at "
            f"{v['behind']} ({v['behind_beyond_noise']} beyond it)"
        )
    if t.get("model_interval"):
        parts.append(_figure_interval("model sessions", t["model_interval"]))
    for other, v in (t.get("versus") or {}).items():
        if v is None:
            continue
        parts.append(f"model - {other}: {versus_note(v)} ({v['interval']}, {v['cells']} cells)")
    return "\n".join(parts)


def _figure_interval(name: str, m: dict[str, Any]) -> str:
    return (
        f"{name}: median {m['median']} {m['median_interval']}, p10 {m['p10']} "
        f"{m['p10_interval']} ({m['interval']}, {m['cells']} cells)"
    )


def render_live(live: dict[str, Any]) -> str:
    """Live sessions against the replay of the same starts, both on the truth pass."""

    def row(name: str, f: dict[str, Any]) -> list[Any]:
        first = [f[k] for k in ("sessions", "pct_median", "pct_p10", "pct_mean")]
        rest = [f[k] for k in ("runs_median", "runs_mean", "cost_s_median")]
        return [name, *first, _pct(f["within_noise_share"]), *rest]

    rows = [
        row(f"{r['policy']} ({side})", r[side])
        for r in live["table"]
        for side in ("live", "replayed")
    ]
    headers = ["sessions", "n", "true %: median", "p10", "mean", "within noise"]
    parts = [
        "\nLive sessions: every run a real launch, beside the replay of the same start "
        "(truth pass)",
        table([*headers, "runs: median", "mean", "cost s: median"], rows),
    ]
    parts += [
        _figure_interval(r["policy"], r["live_interval"])
        for r in live["table"]
        if r.get("live_interval")
    ]
    v = live.get("live_minus_replayed")
    if v is not None:
        parts.append(
            f"live - replayed: median {v['median_difference']:+} {v['median_interval']}, "
            f"p10 {v['p10_difference']:+} {v['p10_interval']} ({v['interval']}, "
            f"{v['cells']} cells)"
        )
    if "runs" in live:
        parts.append(
            f"{live['runs']} live runs ({live['failed_runs']} failed) in {live['run_seconds']} s; "
            f"their own spread (the repeats of one launch) median {_pct(live['run_spread_median'])}"
        )
    return "\n".join(parts)
