"""The training states of a measurement set: one state per (workload, size, config) that ran,
with its aggregated runtime and throughput, in a stable order. Shared by tests/model/test_model.py
and tests/model/test_onnx_graph.py."""

from __future__ import annotations

from hpc_ds1.model import Measurement, State, aggregate


def training_states(measurements: list[Measurement]) -> list[State]:
    out = []
    for (w, s, c), o in sorted(aggregate(measurements).items(), key=lambda kv: str(kv[0])):
        if o.ok:
            out.append(
                State(workload=w, size=s, config=c, runtime_s=o.runtime_s, throughput=o.throughput)
            )
    return out
