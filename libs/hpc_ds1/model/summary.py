"""A model's headline metrics in words: what `hpc-ds1 model show` prints and the console's
Model section shows (GET /v1/model), from the metrics in the model file."""

from __future__ import annotations

from typing import Any

# (key, label, path into the model's metrics)
SUMMARY: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("move_model", "Move model", ("move_model", "chosen")),
    (
        "move_accuracy_cv",
        "Move accuracy, leave-one-size-out",
        ("move_model", "held_out_size_accuracy"),
    ),
    ("move_ece", "Calibration error (ECE)", ("move_model", "calibration", "ece")),
    ("runtime_model", "Runtime model", ("runtime_model", "chosen")),
    ("runtime_rmse_log10", "Runtime error (RMSE of log10 s)", ("runtime_model", "rmse_log10")),
    ("held_out_move_accuracy", "Move accuracy on held-out sizes", ("held_out", "move", "accuracy")),
    (
        "held_out_system1_pct",
        "System 1 on held-out sizes (% of best)",
        ("held_out", "runtime", "system1_pct_of_best"),
    ),
    ("guard_threshold", "Guard distance threshold", ("guard", "distance_threshold")),
    ("states", "Training states", ("counts", "states")),
    ("train_seconds", "Training time (s)", ("train_seconds",)),
)


def dig(data: Any, path: tuple[str, ...]) -> Any:
    """`data[path[0]][path[1]]…`; None where a step is missing or not a mapping."""
    for key in path:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def summarize(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """The headline metrics a person reads first, in words ({key, label, value}); those the
    model lacks left out."""
    out = []
    for key, label, path in SUMMARY:
        value = dig(metrics, path)
        if isinstance(value, int | float | str) and not isinstance(value, bool):
            out.append({"key": key, "label": label, "value": value})
    return out
