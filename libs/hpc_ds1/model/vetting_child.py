"""The child of model.vetting's sandboxed check: loads the model bytes on stdin under a memory
cap, runs it on a few rows and prints one JSON line, `{"ok": bool, "reason": str | None}`.
Apart from vetting.py because it builds a Model (inference), which itself vets what it loads.

    python -m hpc_ds1.model.vetting_child --memory-mb 1024 < model.onnx
"""

from __future__ import annotations

import argparse
import json
import resource
import sys

from hpc_ds1.model.onnx_graph import DISTANCE, PROBABILITIES, RUNTIME
from hpc_ds1.model.vetting import TEST_ROWS


def _run_child(data: bytes) -> str | None:
    """None when the model loads as an hpc_ds1 model and gives sane outputs on TEST_ROWS rows;
    else what was wrong, in our words (onnxruntime's are dropped: they can tell about files)."""
    import numpy as np

    from hpc_ds1.model.inference import Model

    try:
        model = Model(data, optimize=False)
    except Exception as error:
        if _from_onnxruntime(error):
            return _memory_or(error, "onnxruntime cannot build a session from the model")
        if isinstance(error, KeyError):
            return f"its hpc_ds1 metadata lacks the entry {str(error)[:80]}"
        if isinstance(error, json.JSONDecodeError):
            return "its hpc_ds1 metadata is not JSON"
        if isinstance(error, ValueError):  # Model's own messages
            return str(error)[:300]
        return f"its hpc_ds1 metadata is malformed ({type(error).__name__})"
    rows = np.random.default_rng(0).uniform(0.0, 1.0, (TEST_ROWS, model.layout.n_state))
    try:
        proba, runtime, distance = model.raw(rows.astype(np.float32))
    except Exception as error:
        return _memory_or(error, f"running the model on {TEST_ROWS} test rows fails")
    expected = {
        PROBABILITIES: (proba, (TEST_ROWS, len(model.metadata["classes"]))),
        RUNTIME: (runtime, (TEST_ROWS, 1)),
        DISTANCE: (distance, (TEST_ROWS,)),
    }
    for name, (value, shape) in expected.items():
        if value.shape != shape:
            got, want = list(value.shape), list(shape)
            return f"its output {name!r} has shape {got} on {TEST_ROWS} rows, not {want}"
        if not np.all(np.isfinite(value)):
            return f"its output {name!r} is not finite on {TEST_ROWS} test rows"
    return None


def _from_onnxruntime(error: BaseException) -> bool:
    return type(error).__module__.startswith("onnxruntime")


def _memory_or(error: BaseException, message: str) -> str:
    text = str(error).lower()
    if isinstance(error, MemoryError) or "alloc" in text or "memory" in text:
        return "loading and running the model needs more memory than a model may use here"
    return message


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memory-mb", type=int, required=True)
    args = parser.parse_args(argv)
    cap = args.memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    try:
        reason = _run_child(sys.stdin.buffer.read())
    except MemoryError:
        reason = "loading and running the model needs more memory than a model may use here"
    print(json.dumps({"ok": reason is None, "reason": reason}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
