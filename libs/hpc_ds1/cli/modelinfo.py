"""`hpc-ds1 model show`: this home's model: version, where and when it was trained, on which
workloads and sizes, the guard's ranges, the thresholds and its headline metrics."""

from __future__ import annotations

import argparse
from typing import Any

from . import EXIT_PRECONDITION
from .common import add_home_argument, add_json_argument, load_settings, print_json


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("model", help="this home's model")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    show = actions.add_parser(
        "show",
        help="version, training data (workloads, sizes, when), guard ranges and metrics",
    )
    add_json_argument(show, "the model's description")
    add_home_argument(show)
    show.set_defaults(handler=handle_show)


def describe(model: Any, path: Any, this_machine: Any) -> dict[str, Any]:
    """What `model show` prints: the model's own metadata (nothing from a server)."""
    from ..model.guard import hardware_reason
    from ..model.summary import summarize

    fp = model.fingerprint
    difference = hardware_reason(fp, this_machine) if this_machine is not None else None
    return {
        **model.describe(),
        "path": str(path),
        "hostname": fp.get("hostname"),
        "cpu_model": fp.get("cpu_model"),
        "logical_cpus": fp.get("logical_cpus"),
        "gpus": len(fp.get("gpus") or ()),
        "this_machine": difference is None,
        "hardware_difference": difference,
        "summary": summarize(model.metrics),
        "metrics": model.metrics,
    }


_MEANS = {
    "not_slower": "not slower (beyond the noise)",
    "good": "good (at most 2 % slower)",
    "unattended": "right to run unattended (faster beyond the noise; a STOP leaving <= 2 %)",
}


def render(d: dict[str, Any]) -> str:
    lines = [
        f"model {d['version']} ({d['name']}) · {d['path']}",
        f"trained   {d['trained_at'] or '?'} on device {d['device_id']} ({d['hostname']}, "
        f"{d['cpu_model']}, {d['logical_cpus']} cpus"
        + (f", {d['gpus']} GPU(s)" if d["gpus"] else "")
        + ")",
        "machine   "
        + ("this one" if d["this_machine"] else f"NOT this one: {d['hardware_difference']}"),
        f"thresholds auto >= {d['thresholds']['auto']:g}, escalate < "
        f"{d['thresholds']['escalate']:g}",
        "confidence the calibrated chance that a decision is "
        + _MEANS.get(d["confidence_means"], d["confidence_means"]),
        "workloads (sizes trained on; guard range)",
    ]
    for name, w in sorted(d["workloads"].items()):
        lo, hi = w["guard_range"]
        lines.append(f"  {name:<12} {', '.join(str(s) for s in w['sizes'])}  ({lo}-{hi})")
    found = ((d.get("metrics") or {}).get("move_model") or {}).get("discrimination")
    if found and found.get("decisions"):
        at = (found.get("selective_risk") or {}).get("at_threshold") or {}
        brier = found.get("brier") or {}
        auroc = found.get("auroc")
        taken = (
            f"{at['coverage']:.0%} taken, {at['risk']:.1%} of them wrong"
            if at.get("risk") is not None
            else "none taken"
        )
        lines.append(
            f"discrimination {found['decisions']} out-of-fold decisions: AUROC "
            f"{'-' if auroc is None else f'{auroc:.3f}'} for ending < 5 % above the best, "
            f"Brier {brier.get('brier', float('nan')):.4f} (resolution "
            f"{brier.get('resolution', float('nan')):.4f}); at auto {taken}"
        )
    if d["summary"]:
        lines.append("metrics")
        for m in d["summary"]:
            value = m["value"]
            shown = f"{value:.4g}" if isinstance(value, float) else str(value)
            lines.append(f"  {m['label']:<40} {shown}")
    return "\n".join(lines)


def handle_show(args: argparse.Namespace) -> int:
    from ..api import NoModelError
    from ..machine.hardware import fingerprint
    from ..model import Model, Thresholds
    from ..models_store import latest_path

    settings = load_settings(quiet=True, home=args.home)
    path = latest_path(settings.models_dir)
    if path is None:
        missing = NoModelError(
            f"no model for this machine in {settings.models_dir}: run `hpc-ds1 setup --quick` "
            "(measures this machine, then trains) first"
        )
        if args.json:
            print_json({"model": None, "missing": str(missing)})
            return EXIT_PRECONDITION
        raise missing
    thresholds = Thresholds(auto=settings.auto_threshold, escalate=settings.escalate_threshold)
    model = Model.from_file(path, thresholds)
    found = describe(model, path, fingerprint())
    if args.json:
        print_json({"model": found, "missing": None})
    else:
        print(render(found))
    return 0
