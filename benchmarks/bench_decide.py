"""Decision benchmark (in-process): Model.decide with telemetry given, beside the same
scikit-learn model's predict_proba, and recommend() (System 1).

    .venv/bin/python benchmarks/bench_decide.py [--calls 5000] [--onnx PATH] [--cache PATH]

Model: trained here on a small real measurement set (gemm and stencil at tiny sizes, every
configuration of this machine's space, real runner; the measurements are cached in --cache so a
rerun skips them), or loaded from --onnx / $HPC_DS1_HOME/models/latest.onnx when present (then
there is no scikit-learn object to compare against). Method: each call is timed alone with
perf_counter_ns after 200 warm-up calls; the states cycle through every training state (with
telemetry), so the numbers include feature building, the one onnxruntime run (state row plus its
feasible neighbours), masking, and building the pydantic Decision."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hpc_ds1.machine.hardware import fingerprint
from hpc_ds1.model import Measurement, Model, State, TrainedModel, aggregate, train
from hpc_ds1.runner import Job, run_many
from hpc_ds1.space import ConfigSpace

SIZES = {"gemm": (48, 64, 96, 128), "stencil": (12, 16, 20, 24)}
WARMUP = 200


def measure(cache: Path) -> list[Measurement]:
    if cache.exists():
        return [Measurement.model_validate(d) for d in json.loads(cache.read_text())]
    jobs = [
        Job(workload=name, size=size, config=c, repeats=3)
        for name, sizes in SIZES.items()
        for size in sizes
        for c in ConfigSpace.for_device(workload=name).configs()
    ]
    started = time.perf_counter()
    results = run_many(jobs, timeout_s=180)
    print(f"measured {len(jobs)} real runs in {time.perf_counter() - started:.1f} s")
    ms = [Measurement.from_result(r) for r in results]
    cache.write_text(json.dumps([m.model_dump() for m in ms]))
    return ms


def timed(fn: Callable[[int], object], calls: int) -> np.ndarray:
    for i in range(WARMUP):
        fn(i)
    out = np.empty(calls)
    for i in range(calls):
        start = time.perf_counter_ns()
        fn(i)
        out[i] = time.perf_counter_ns() - start
    return out / 1000.0  # µs


def report(name: str, us: np.ndarray) -> None:
    p50, p99 = np.percentile(us, [50, 99])
    print(
        f"{name:<44} n={len(us):>6}  p50 {p50:8.1f} µs  p99 {p99:8.1f} µs  mean {us.mean():8.1f} µs"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--onnx", type=Path, default=None)
    parser.add_argument(
        "--cache", type=Path, default=Path(tempfile.gettempdir()) / "hpc_ds1_bench_decide.json"
    )
    args = parser.parse_args()
    home = os.environ.get("HPC_DS1_HOME")
    path = args.onnx or (Path(home) / "models" / "latest.onnx" if home else None)
    trained: TrainedModel | None = None
    if path is not None and path.exists():
        model = Model.from_file(path)
        states = [
            State(workload=w, size=s, config=ConfigSpace.for_device(workload=w).default(),
                  runtime_s=0.01, throughput=1.0)
            for w, sizes in model.sizes.items() for s in sizes
        ]  # fmt: skip
        print(f"model {model.version} from {path}")
    else:
        ms = measure(args.cache)
        started = time.perf_counter()
        trained = train(ms, fingerprint(), seed=0)
        print(f"trained in {time.perf_counter() - started:.1f} s on {len(ms)} measurements")
        model = Model.from_onnx(trained.to_onnx())
        states = [
            State(workload=w, size=s, config=c, runtime_s=o.runtime_s, throughput=o.throughput)
            for (w, s, c), o in aggregate(ms).items()
            if o.ok
        ]
    est = model.metadata["estimators"]
    print(
        f"move model: {est['move']}, runtime model: {est['runtime']}, "
        f"guard rows: {model.metrics.get('guard', {}).get('training_rows')}, states: {len(states)}"
    )
    n = len(states)
    report(
        "Model.decide (telemetry given)", timed(lambda i: model.decide(states[i % n]), args.calls)
    )
    X = np.vstack([model.state_features(s) for s in states])
    report(
        "onnxruntime run alone (1 row, all outputs)",
        timed(lambda i: model.raw(X[i % n : i % n + 1]), args.calls),
    )
    if trained is not None:
        clf = trained.move_estimator
        sk_calls = max(args.calls // 5, 500)
        report(
            "scikit-learn predict_proba (same model, 1 row)",
            timed(lambda i: clf.predict_proba(X[i % n : i % n + 1]), sk_calls),
        )
    workloads = sorted(model.sizes)
    report(
        "Model.recommend (all configs, one pass)",
        timed(
            lambda i: model.recommend(
                workloads[i % len(workloads)], model.sizes[workloads[i % len(workloads)]][0]
            ),
            max(args.calls // 5, 1000),
        ),
    )


if __name__ == "__main__":
    main()
