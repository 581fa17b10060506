"""One ONNX file: move model, runtime model and familiarity distance in one graph.

Inputs: `X` [N, STATE_FEATURES] (states, for the move model) and `C` [M, BASE_FEATURES]
(configurations, for the runtime model and the guard). Outputs: `probabilities` [N, classes],
`runtime_log10` [M, 1], `distance` [M] (to the nearest training row, standardized BASE space).
decide() feeds its state as X and the state plus its feasible neighbours as C.
Metadata (JSON) under the key `hpc_ds1`."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, compose, helper, numpy_helper

from hpc_ds1.model.guard import DistanceGuard
from hpc_ds1.model.relative import SizeRelative

OPSET = {"": 17, "ai.onnx.ml": 3}
METADATA_KEY = "hpc_ds1"
INPUT = "X"
CONFIGS = "C"
PROBABILITIES = "probabilities"
RUNTIME = "runtime_log10"
DISTANCE = "distance"


def _convert(estimator: Any, n_features: int, classifier: bool) -> onnx.ModelProto:
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    options: dict[Any, Any] | None = None
    if classifier:
        options = {id(estimator): {"zipmap": False}}
        steps = getattr(estimator, "steps", None)
        if steps:
            options[id(steps[-1][1])] = {"zipmap": False}
    return convert_sklearn(
        estimator,
        initial_types=[(INPUT, FloatTensorType([None, n_features]))],
        options=options,
        target_opset=OPSET,
    )


# float32 arithmetic in the graph against float64 in scikit-learn: 1e-7 apart in practice
CONVERSION_TOLERANCE = 1e-4


def classifier_conversion_error(estimator: Any, X: Any) -> float:
    """The largest difference between the probabilities of the classifier's ONNX conversion
    and scikit-learn's on rows X. A converter that computes another model (skl2onnx did for a
    calibrated pipeline) must never reach a model file."""
    import onnxruntime as ort

    X = np.ascontiguousarray(X, dtype=np.float32)
    converted = _convert(estimator, X.shape[1], True)
    session = ort.InferenceSession(
        converted.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    name = next(o.name for o in converted.graph.output if o.name.endswith("probabilities"))
    onnx_proba = np.asarray(session.run([name], {INPUT: X})[0], dtype=np.float64)
    return float(np.abs(onnx_proba - estimator.predict_proba(X)).max(initial=0.0))


def _const(name: str, values: Any, dtype: Any = np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name=name)


def _guard_nodes(guard: DistanceGuard) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """The guard's distance as guard.DistanceGuard.distance computes it: |z|^2 + |m|^2 -
    2 z.m, one MatMul to [N, n] (the elementwise differences of files written before 7 Dec 2026
    held [N, n, d]: 14 GB for System 1 over a recorded space of 11,130 configurations)."""
    matrix = np.asarray(guard.matrix, dtype=np.float32)
    inits = [
        _const("g_mean", guard.mean[None, :]),
        _const("g_inv_scale", guard.inv_scale[None, :]),
        _const("g_matrix_t", matrix.T),  # [d, n]
        _const("g_norms", (matrix**2).sum(axis=1)[None, :]),  # [1, n]
        _const("g_minus_two", [-2.0]),
    ]
    nodes = [
        helper.make_node("Sub", ["rt_X", "g_mean"], ["g_centered"]),
        helper.make_node("Mul", ["g_centered", "g_inv_scale"], ["g_z"]),
        helper.make_node("ReduceSumSquare", ["g_z"], ["g_zz"], axes=[1], keepdims=1),  # [N, 1]
        helper.make_node("MatMul", ["g_z", "g_matrix_t"], ["g_cross"]),  # [N, n]
        helper.make_node("Mul", ["g_cross", "g_minus_two"], ["g_cross2"]),
        helper.make_node("Add", ["g_zz", "g_norms"], ["g_sum"]),
        helper.make_node("Add", ["g_sum", "g_cross2"], ["g_d2raw"]),
        helper.make_node("Relu", ["g_d2raw"], ["g_d2"]),  # rounding may leave a tiny negative
        helper.make_node("ReduceMin", ["g_d2"], ["g_min"], axes=[1], keepdims=0),
        helper.make_node("Sqrt", ["g_min"], [DISTANCE]),
    ]
    return nodes, inits


def _only_output(model: onnx.ModelProto, name: str) -> onnx.ValueInfoProto:
    for out in model.graph.output:
        if out.name == name:
            return out
    raise ValueError(f"converted model has no output {name!r}")


def build(
    classifier: Any,
    regressor: Any,
    guard: DistanceGuard,
    n_state: int,
    n_base: int,
    metadata: dict[str, Any],
) -> bytes:
    clf = compose.add_prefix(_convert(classifier, n_state, True), "mv_")
    relative = isinstance(regressor, SizeRelative)
    reg = compose.add_prefix(
        _convert(regressor.relative_ if relative else regressor, n_base, False), "rt_"
    )
    prob_out = next(o.name for o in clf.graph.output if o.name.endswith("probabilities"))
    reg_out = reg.graph.output[0].name
    g_nodes, g_inits = _guard_nodes(guard)
    runtime_nodes = [*reg.graph.node]
    parts = [clf, reg]
    if relative:  # the size's scale plus the configuration's relative runtime
        scale = compose.add_prefix(_convert(regressor.scale_, n_base, False), "rs_")
        parts.append(scale)
        runtime_nodes += [
            helper.make_node("Identity", [CONFIGS], ["rs_X"]),
            *scale.graph.node,
            helper.make_node("Add", [reg_out, scale.graph.output[0].name], [RUNTIME]),
        ]
    else:
        runtime_nodes.append(helper.make_node("Identity", [reg_out], [RUNTIME]))
    nodes = [
        helper.make_node("Identity", [INPUT], ["mv_X"]),
        helper.make_node("Identity", [CONFIGS], ["rt_X"]),
        *clf.graph.node,
        helper.make_node("Identity", [prob_out], [PROBABILITIES]),
        *runtime_nodes,
        *g_nodes,
    ]
    inits = [initializer for part in parts for initializer in part.graph.initializer]
    inits += g_inits
    n_classes = len(classifier.classes_)
    graph = helper.make_graph(
        nodes,
        "hpc_ds1_model",
        [
            helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, [None, n_state]),
            helper.make_tensor_value_info(CONFIGS, TensorProto.FLOAT, [None, n_base]),
        ],
        [
            helper.make_tensor_value_info(PROBABILITIES, TensorProto.FLOAT, [None, n_classes]),
            helper.make_tensor_value_info(RUNTIME, TensorProto.FLOAT, [None, 1]),
            helper.make_tensor_value_info(DISTANCE, TensorProto.FLOAT, [None]),
        ],
        initializer=inits,
    )
    opsets: dict[str, int] = {}
    for m in parts:
        for op in m.opset_import:
            opsets[op.domain] = max(opsets.get(op.domain, 0), op.version)
    opsets[""] = max(opsets.get("", 0), OPSET[""])
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid(d, v) for d, v in sorted(opsets.items())],
        producer_name="hpc_ds1",
    )
    model.ir_version = min(m.ir_version for m in parts) or model.ir_version
    entry = model.metadata_props.add()
    entry.key = METADATA_KEY
    entry.value = json.dumps(metadata, sort_keys=True, separators=(",", ":"))
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())
