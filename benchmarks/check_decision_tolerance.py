"""Is the float32 tolerance of tests/model/test_model.py::test_decision_follows_scikit_learn
robust to the noise of real measurements? Measures the tiny set once for real (as the test
session does), then trains N models on N noisy copies of it (each runtime times a log-normal
factor with the run-to-run spread measured here), and runs the test's check on each.

    python benchmarks/check_decision_tolerance.py [N=20]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests package

from hpc_ds1.machine.hardware import fingerprint
from hpc_ds1.model import Model, train
from tests.model.test_model import test_decision_follows_scikit_learn as check
from tests.support.measured import measurements as measure_fixture


def main(n: int) -> int:
    started = time.perf_counter()
    real = measure_fixture.__wrapped__()  # type: ignore[attr-defined]
    spreads = [m.spread for m in real if m.ok and m.spread is not None]  # already relative
    sigma = float(np.median(spreads)) if spreads else 0.05
    print(
        f"{len(real)} real runs in {time.perf_counter() - started:.0f} s; "
        f"median relative spread {sigma:.3f}"
    )
    fp = fingerprint()
    failures = 0
    for seed in range(n):
        rng = np.random.default_rng(seed)
        noisy = [
            m.model_copy(update={"runtime_s": m.runtime_s * float(rng.lognormal(0.0, sigma))})
            if m.ok
            else m
            for m in real
        ]
        trained = train(noisy, fp, seed=seed)
        model = Model.from_onnx(trained.to_onnx())
        try:
            check(trained, model, noisy)
            verdict = "ok"
        except AssertionError as error:
            failures += 1
            verdict = f"FAILED {error}"
        print(f"run {seed + 1:2d}/{n}: blend {model.blend.as_dict()} {verdict}", flush=True)
    print(f"{n - failures} of {n} passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20))
