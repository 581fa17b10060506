"""System 1's cost with and without the transfer prior (issue 13, part 2), on one model file:
`recommend` as the model file has it (prior blended in) against the same file with the prior
and the calibration stripped from its metadata (what every model before them did). In process,
one thread; each size asked once per round, so nothing is served from the prior's cache but
the first round's. Run:

    .venv/bin/python benchmarks/bench_recommend.py MODEL.onnx [--rounds 200]

Report the load average (`uptime`) with the figures: they are wall-clock times."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import onnx

from hpc_ds1.model import Model
from hpc_ds1.model.onnx_graph import METADATA_KEY


def stripped(data: bytes) -> bytes:
    m = onnx.load_from_string(data)
    for prop in m.metadata_props:
        if prop.key == METADATA_KEY:
            meta = json.loads(prop.value)
            meta.pop("transfer", None)
            meta.pop("calibration", None)
            prop.value = json.dumps(meta)
    return m.SerializeToString()


def timed(model: Model, asks: list[tuple[str, int]], rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        for workload, size in asks:
            started = time.perf_counter()
            model.recommend(workload, size)
            out.append((time.perf_counter() - started) * 1e6)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    data = args.model.read_bytes()
    with_prior, without = Model.from_onnx(data), Model.from_onnx(stripped(data))
    asks = []
    for w, (lo, hi) in sorted(with_prior.workloads.items()):
        asks += [(w, lo + (hi - lo) * k // 7) for k in range(8)]
    for model in (with_prior, without):  # warm the spaces and rows
        timed(model, asks, 2)
    a, b = [], []
    for _ in range(5):  # interleaved, so both see the same load
        b += timed(without, asks, args.rounds // 5)
        a += timed(with_prior, asks, args.rounds // 5)
    agree = sum(
        with_prior.recommend(w, s).config == without.recommend(w, s).config for w, s in asks
    )
    for name, got in (("without prior (before)", b), ("with prior (after)", a)):
        q = statistics.quantiles(got, n=100)
        median = statistics.median(got)
        print(f"{name:24} median {median:8.1f} us  p90 {q[89]:8.1f} us  n={len(got)}")
    print(f"same configuration at {agree} of {len(asks)} asked sizes; model {with_prior.version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
