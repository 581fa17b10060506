"""System 1 for a job, the same on every surface (`hpc-ds1 recommend`, POST /v1/recommend):
the whole configuration before anything runs, its expected runtime, the confidence that it is
the fastest, the mode the thresholds give, and the familiarity guard's reasons apart."""

from __future__ import annotations

import shlex
from typing import Any

from .requests import MAX_SIZE

ALTERNATIVES_SHOWN = 5


class RecommendError(ValueError):
    """A request the model cannot answer (unknown workload, size out of range): the message
    says what was wrong and what is accepted."""


def check_job(model: Any, workload: str, size: int) -> Any:
    """The registered Workload (None when only the model knows the name); raises
    RecommendError for a workload neither knows or a size outside what it accepts."""
    from .workloads import UnknownWorkload, get_workload, list_workloads

    try:
        found: Any = get_workload(workload)
    except UnknownWorkload:
        found = None
    if found is None and workload not in model.workloads:
        known = sorted(set(list_workloads()) | set(model.workloads))
        raise RecommendError(f"unknown workload {workload!r}; known workloads: {', '.join(known)}")
    least = found.min_size(1) if found is not None else 1
    if not least <= size <= MAX_SIZE:
        raise RecommendError(
            f"size {size} is out of range for {workload}: give a whole number from {least} "
            f"to {MAX_SIZE}"
        )
    return found


def recommend(
    model: Any, workload: str, size: int, *, fingerprint: Any, thresholds: Any
) -> dict[str, Any]:
    """The recommendation for `workload` at `size` on the device of `fingerprint` (whose
    hardware the guard compares with the model's), as a JSON-ready dict."""
    from .model import Thresholds
    from .space import ConfigSpace

    registered = check_job(model, workload, size)
    space = (
        ConfigSpace.for_device(fingerprint, registered)
        if registered is not None
        else model.space_for(workload, fingerprint)
    )
    # With both thresholds at 0 the mode's reasons are the guard's alone; the real thresholds
    # then give the mode and add the confidence reason.
    try:
        rec = model.recommend(
            workload,
            size,
            thresholds=Thresholds(auto=0.0, escalate=0.0),
            space=space,
            fingerprint=fingerprint,
        )
    except ValueError as error:
        raise RecommendError(str(error)) from None
    guard = list(rec.reasons)
    mode, reasons = thresholds.mode(rec.confidence, guard)
    config = rec.config
    return {
        "workload": workload,
        "size": size,
        "config": config.model_dump(),
        "label": config.label(),
        "predicted_runtime_s": rec.predicted_runtime_s,
        "confidence": rec.confidence,
        "mode": mode,
        "reasons": reasons,
        "guard_reasons": guard,
        "familiar": not guard,
        "thresholds": {"auto": thresholds.auto, "escalate": thresholds.escalate},
        "alternatives": dict(list(rec.alternatives.items())[:ALTERNATIVES_SHOWN]),
        "model_version": rec.model_version,
        "trained_on_device": model.device_id,
        "device_id": _device_id(fingerprint),
    }


def _device_id(fingerprint: Any) -> str | None:
    if isinstance(fingerprint, dict):
        return fingerprint.get("device_id")
    return getattr(fingerprint, "device_id", None)


def as_text(rec: dict[str, Any]) -> str:
    """One line a person reads, and the reasons when it is not auto."""
    c = rec["config"]
    gpu = " gpu" if c.get("gpu") else ""
    block = f" block={c['block']}" if c.get("block") else ""
    block += "".join(f" {k}={v}" for k, v in (c.get("knobs") or {}).items())
    line = (
        f"{rec['workload']} {rec['size']}: ranks={c['ranks']} threads={c['threads']} "
        f"tile={c['tile']}{block}{gpu} · expected {rec['predicted_runtime_s']:.4g} s · confidence "
        f"{rec['confidence']:.2f} · {rec['mode']} · model {rec['model_version']}"
    )
    if rec["reasons"]:
        line += "\n  why not auto: " + "; ".join(rec["reasons"])
    return line


def as_env(rec: dict[str, Any]) -> str:
    """Shell assignments for `eval "$(hpc-ds1 recommend ... --format env)"`, exported so that
    srun, mpiexec and the job's own processes see them."""
    c = rec["config"]
    values = {
        "HPC_DS1_RANKS": c["ranks"],
        "HPC_DS1_THREADS": c["threads"],
        "OMP_NUM_THREADS": c["threads"],
        "HPC_DS1_TILE": c["tile"],
        "HPC_DS1_BLOCK": c.get("block", 0),
        "HPC_DS1_GPU": 1 if c.get("gpu") else 0,
        "HPC_DS1_MODE": rec["mode"],
        "HPC_DS1_CONFIDENCE": f"{rec['confidence']:.4f}",
        "HPC_DS1_EXPECTED_RUNTIME_S": f"{rec['predicted_runtime_s']:.6g}",
        "HPC_DS1_MODEL_VERSION": rec["model_version"],
        # the workload's own knobs: HPC_DS1_KNOB_NB=64 for a knob `nb`
        **{f"HPC_DS1_KNOB_{k.upper()}": v for k, v in (c.get("knobs") or {}).items()},
    }
    return "\n".join(f"export {k}={shlex.quote(str(v))}" for k, v in values.items())


def as_slurm(rec: dict[str, Any]) -> str:
    """#SBATCH lines for a job script's header (sbatch reads them until the first command)."""
    c = rec["config"]
    lines = [
        f"# hpc-ds1 recommend: {rec['workload']} {rec['size']} · expected "
        f"{rec['predicted_runtime_s']:.4g} s · confidence {rec['confidence']:.2f} · "
        f"{rec['mode']} · model {rec['model_version']}",
        f"#SBATCH --ntasks={c['ranks']}",
        f"#SBATCH --cpus-per-task={c['threads']}",
    ]
    if c.get("gpu"):
        lines.append(f"#SBATCH --gpus={c['ranks']}")  # one rank per GPU, as the space has it
    lines.append(f"# export OMP_NUM_THREADS={c['threads']}")
    if c.get("knobs"):
        lines.append("# knobs: " + " ".join(f"{k}={v}" for k, v in c["knobs"].items()))
    return "\n".join(lines)
