"""Vetting of a model file nobody here made (a device's upload, the model bucket): is it safe to
hand these ONNX bytes to onnxruntime?

`check_static` reads the protobuf with the `onnx` package alone (no onnxruntime, no file reads)
and refuses what our training never exports: tensors stored outside the upload (ONNX external
data: onnxruntime would open a file of the server's), operators outside ALLOWED_OPS,
subgraphs and functions, shapes or constants past the bounds below. It is cheap (about 40 ms
for a 2 MB model), so every service runs it before it builds a session from a stored model.

`check_sandboxed` then loads the model in a child process under a memory cap (RLIMIT_AS) and a
wall-clock timeout, with graph optimization off (constant folding would compute constants at
load), in an empty working directory, and runs one forward pass on a few rows. Every node that
depends on no input feeds an output (check_static), so that pass computes everything the
services' optimized sessions could fold at load. The child reports one line of ours;
onnxruntime's text never leaves it.

    python -m hpc_ds1.model.vetting_child --memory-mb 1024 < model.onnx   # one JSON line
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import onnx
from google.protobuf.message import DecodeError
from onnx import AttributeProto, TensorProto

from hpc_ds1.model.onnx_graph import CONFIGS, DISTANCE, INPUT, PROBABILITIES, RUNTIME


class UnsafeModel(ValueError):
    """The model file is refused; the message says what was wrong in our words (names from the
    file are quoted in it: cut to a length an answer can carry)."""

    def __init__(self, message: str) -> None:
        super().__init__(message if len(message) <= 600 else f"{message[:597]}...")


# What our training exports, and nothing else: every (domain, op) of onnx_graph.build over
# every candidate training can choose (estimators.classifier_candidates: gradient boosting,
# random forest, logistic regression, each raw or sigmoid-calibrated;
# estimators.regressor_candidates: gradient boosting, random forest, ridge, ridge on degree-2
# polynomial features, each alone or SizeRelative), as converted by skl2onnx with zipmap off,
# plus the guard's nodes. tests/model/test_vetting.py converts every candidate and fails when
# one needs an operator missing here. Not in it on purpose: Constant, Expand, Tile, Range,
# Loop/If/Scan (subgraphs) and every other op that makes a tensor of a size it reads from its
# input; the one such op ours use, ConstantOfShape (PolynomialFeatures' column of ones), is
# accepted only on a Shape node's output (the size of a tensor that already exists).
# Operators of model files written by earlier versions that no training exports any more:
# the guard's Unsqueeze (its elementwise distance, before 7 Dec 2026). Such files keep loading.
LEGACY_OPS: frozenset[tuple[str, str]] = frozenset({("", "Unsqueeze")})
ALLOWED_OPS: frozenset[tuple[str, str]] = frozenset(
    [
        # onnx_graph.build: Identity joins the parts; the guard's distance; SizeRelative's Add
        *(("", op) for op in ("Identity", "Add", "Sub", "Mul", "Sqrt", "MatMul", "Relu")),
        *(("", op) for op in ("ReduceSumSquare", "ReduceMin")),
        *LEGACY_OPS,
        # sigmoid calibration (CalibratedClassifierCV): per-class sigmoid, then normalized
        *(("", op) for op in ("ArgMax", "Cast", "Concat", "Div", "Exp", "Not", "ReduceSum")),
        *(("", op) for op in ("Reshape", "Sum")),
        # PolynomialFeatures: products of column pairs, a column of ones
        *(("", op) for op in ("ReduceProd", "Shape", "ConstantOfShape")),
        # the estimators themselves (skl2onnx's ai.onnx.ml operators)
        *(
            ("ai.onnx.ml", op)
            for op in (
                "ArrayFeatureExtractor",
                "LinearClassifier",
                "LinearRegressor",
                "Normalizer",
                "Scaler",
                "TreeEnsembleClassifier",
                "TreeEnsembleRegressor",
            )
        ),
    ]
)
DOMAINS = frozenset({"", "ai.onnx.ml"})

# Bounds. Ours are far below them: the largest tensor is the guard's matrix (unique training
# rows x 15 columns: 1e4 rows are 1.5e5 elements); a tensor's size counts per row where its
# shape has a row dimension (the graph's inputs have one).
MAX_TENSOR_ELEMENTS = 1 << 22  # one tensor: 16 MiB of float32
MAX_CONSTANT_ELEMENTS = 1 << 24  # all whose shape is fixed (what constant folding can hold)
MAX_NODES = 20_000  # ours: a few hundred (a sigmoid calibration per class, a product per pair)
MAX_NODE_INPUTS = 4096  # ours: PolynomialFeatures' Concat, one input per column pair
MAX_CLASSES = 1024  # a classifier's or regressor's output columns (ours: 13 moves, 1 runtime)
_WIDTH_ATTRIBUTES = ("classlabels_int64s", "classlabels_strings", "classlabels_ints")
_COUNT_ATTRIBUTES = ("n_targets", "targets")

INPUTS = (INPUT, CONFIGS)
OUTPUTS = (PROBABILITIES, RUNTIME, DISTANCE)
TEST_ROWS = 4

# Several uploads at once each start a child up to its memory cap: at most this many at a time.
_SANDBOXES = threading.BoundedSemaphore(2)


# --- the static check -----------------------------------------------------------------------


def check_static(data: bytes, max_bytes: int) -> onnx.ModelProto:
    """The parsed model, when it is one our training could have exported; else UnsafeModel."""
    if len(data) > max_bytes:
        raise UnsafeModel(f"the model is {len(data)} bytes: at most {max_bytes} are accepted")
    model = onnx.ModelProto()
    try:
        # ParseFromString reads the bytes only: external data is never loaded from here
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError):
        raise UnsafeModel("the file does not parse as an ONNX model (protobuf)") from None
    graph = model.graph
    if not graph.node:
        raise UnsafeModel("the file does not parse as an ONNX model: its graph has no nodes")
    _check_opsets(model)
    if model.functions:
        raise UnsafeModel("the model defines ONNX functions: ours have none, none are accepted")
    if graph.sparse_initializer:
        raise UnsafeModel("the model has sparse initializers: every tensor must be stored dense")
    _check_interface(graph)
    if len(graph.node) > MAX_NODES:
        raise UnsafeModel(f"the model has {len(graph.node)} nodes: at most {MAX_NODES}")
    constants = 0
    for tensor in graph.initializer:
        constants += _check_tensor(tensor, f"initializer {tensor.name!r}")
    for node in graph.node:
        constants += _check_node(node)
    for info in (*graph.input, *graph.output, *graph.value_info):
        _check_declared(info)
    _check_nodes_in_order_and_used(graph)
    _check_constant_of_shape(graph)
    constants += _check_inferred_shapes(model)
    if constants > MAX_CONSTANT_ELEMENTS:
        raise UnsafeModel(
            f"the model's tensors of fixed shape hold {constants} elements in all: at most "
            f"{MAX_CONSTANT_ELEMENTS} are accepted"
        )
    return model


def _check_opsets(model: onnx.ModelProto) -> None:
    for opset in model.opset_import:
        if _domain(opset.domain) not in DOMAINS:
            raise UnsafeModel(
                f"the model imports the operator domain {opset.domain!r}: accepted are the ONNX "
                "standard operators and ai.onnx.ml"
            )


def _domain(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


def _check_interface(graph: onnx.GraphProto) -> None:
    """Inputs and outputs are exactly onnx_graph's (the forward pass then checks them all)."""
    inputs = [i.name for i in graph.input]
    outputs = [o.name for o in graph.output]
    if sorted(inputs) != sorted(INPUTS):
        raise UnsafeModel(
            f"the model's inputs are {inputs}: an hpc_ds1 model has exactly {list(INPUTS)}"
        )
    if sorted(outputs) != sorted(OUTPUTS):
        raise UnsafeModel(
            f"the model's outputs are {outputs}: an hpc_ds1 model has exactly {list(OUTPUTS)}"
        )


def _check_tensor(tensor: TensorProto, what: str) -> int:
    """Its element count, once it is stored inside the upload and within the bounds."""
    if tensor.data_location == TensorProto.EXTERNAL or len(tensor.external_data) > 0:
        raise UnsafeModel(
            f"the model stores {what} in an external file: every tensor must be inside the upload"
        )
    return _elements(tensor.dims, what)


def _elements(dims: Iterable[int], what: str) -> int:
    count = 1
    for dim in dims:
        if dim < 0:
            raise UnsafeModel(f"{what} has a negative dimension ({dim})")
        count *= dim
        if count > MAX_TENSOR_ELEMENTS:
            raise UnsafeModel(
                f"{what} has {math.prod(dims)} elements: at most {MAX_TENSOR_ELEMENTS} are "
                "accepted in one tensor"
            )
    return count


def _check_node(node: onnx.NodeProto) -> int:
    """The node's op is allowed, it has no subgraph; the elements of its attribute tensors."""
    name = f"node {node.name or node.op_type!r} ({node.op_type})"
    if (_domain(node.domain), node.op_type) not in ALLOWED_OPS:
        domain = f"{node.domain}." if node.domain else ""
        raise UnsafeModel(
            f"{name} uses the operator {domain}{node.op_type}, which our training never "
            f"exports: accepted are {', '.join(sorted(_op_names()))}"
        )
    if len(node.input) > MAX_NODE_INPUTS:
        raise UnsafeModel(f"{name} has {len(node.input)} inputs: at most {MAX_NODE_INPUTS}")
    elements = 0
    for attribute in node.attribute:
        kind = attribute.type
        if kind in (AttributeProto.GRAPH, AttributeProto.GRAPHS) or attribute.HasField("g"):
            raise UnsafeModel(f"{name} holds a subgraph: ours have none, none are accepted")
        if kind in (AttributeProto.SPARSE_TENSOR, AttributeProto.SPARSE_TENSORS):
            raise UnsafeModel(f"{name} holds a sparse tensor: none are accepted")
        if attribute.ref_attr_name:
            raise UnsafeModel(f"{name} refers to a function's attribute: none are accepted")
        tensors = [attribute.t] if attribute.HasField("t") else []
        for tensor in [*tensors, *attribute.tensors]:
            elements += _check_tensor(tensor, f"the tensor {attribute.name!r} of {name}")
        width = len(attribute.ints) + len(attribute.strings)
        if attribute.name in _WIDTH_ATTRIBUTES and width > MAX_CLASSES:
            raise UnsafeModel(f"{name} has {width} classes: at most {MAX_CLASSES}")
        if attribute.name in _COUNT_ATTRIBUTES and attribute.i > MAX_CLASSES:
            raise UnsafeModel(
                f"{name} has {attribute.i} outputs per row: at most {MAX_CLASSES} are accepted"
            )
    return elements


def _op_names() -> Iterator[str]:
    return (f"{d}.{op}" if d else op for d, op in ALLOWED_OPS)


def _check_declared(info: onnx.ValueInfoProto) -> None:
    _shape_elements(info, f"the declared shape of {info.name!r}")


def _shape_elements(info: onnx.ValueInfoProto, what: str) -> int | None:
    """Elements of a tensor's shape per row (a dimension without a value counts 1); None when
    the shape is not fixed. UnsafeModel past the bound."""
    if not info.type.HasField("tensor_type"):
        if info.type.WhichOneof("value") is None:
            return None
        raise UnsafeModel(f"{what} is not a tensor: ours are tensors only")
    tensor_type = info.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    dims = tensor_type.shape.dim
    fixed = all(d.HasField("dim_value") for d in dims)
    count = _elements([d.dim_value for d in dims if d.HasField("dim_value")], what)
    return count if fixed else None


def _check_nodes_in_order_and_used(graph: onnx.GraphProto) -> None:
    """Nodes come in order (each input defined before it is used), and a node no output needs
    depends on an input. A constant-only node no output needs would never run in the sandbox's
    forward pass, yet an optimized session could fold it at load. Ours have such nodes only on
    the inputs' side (a classifier's unused labels)."""
    defined = {i.name for i in graph.initializer} | {i.name for i in graph.input} | {""}
    varying = {i.name for i in graph.input}  # what depends on the graph's inputs
    for node in graph.node:
        missing = [i for i in node.input if i not in defined]
        if missing:
            raise UnsafeModel(
                f"node {node.name or node.op_type!r} ({node.op_type}) reads {missing[0]!r} before "
                "any node makes it: the nodes must be in order, every input defined"
            )
        defined.update(node.output)
        if any(i in varying for i in node.input):
            varying.update(node.output)
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    needed = [o.name for o in graph.output]
    reached: set[int] = set()
    seen: set[str] = set()
    while needed:
        name = needed.pop()
        if name in seen:
            continue
        seen.add(name)
        at = producer.get(name)
        if at is not None and at not in reached:
            reached.add(at)
            needed.extend(i for i in graph.node[at].input if i)
    for i, node in enumerate(graph.node):
        if i not in reached and not any(o in varying for o in node.output):
            raise UnsafeModel(
                f"node {node.name or node.op_type!r} ({node.op_type}) feeds none of the model's "
                "outputs and depends on none of its inputs: ours have no such nodes"
            )


def _check_constant_of_shape(graph: onnx.GraphProto) -> None:
    """ConstantOfShape makes a tensor of the size its input names: ours name the size of a
    tensor that exists (Shape's output); a size from a constant could be anything."""
    producer = {out: node for node in graph.node for out in node.output if out}
    for node in graph.node:
        if node.op_type != "ConstantOfShape":
            continue
        source = producer.get(node.input[0]) if node.input else None
        if source is None or source.op_type != "Shape":
            raise UnsafeModel(
                f"node {node.name or node.op_type!r} (ConstantOfShape) takes its size from "
                f"{node.input[0] if node.input else 'nothing'!r}: it is accepted only on the "
                "output of a Shape node (the size of an existing tensor)"
            )


def _check_inferred_shapes(model: onnx.ModelProto) -> int:
    """ONNX shape inference (no tensors computed) bounds every tensor whose shape it can tell:
    it catches sizes made by broadcasting or concatenating constants. Returns the elements of
    those of fixed shape. The model's own value_info is left out: it could claim any shape."""
    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    del bare.graph.value_info[:]
    del bare.metadata_props[:]
    try:
        inferred = onnx.shape_inference.infer_shapes(bare, strict_mode=False, data_prop=True)
    except Exception:  # onnx's text is not ours to echo
        raise UnsafeModel(
            "ONNX shape inference fails on the model's graph: it is malformed"
        ) from None
    known = {i.name for i in model.graph.initializer}
    total = 0
    for info in (*inferred.graph.value_info, *inferred.graph.output):
        count = _shape_elements(info, f"the tensor {info.name!r}")
        if count is not None and info.name not in known:  # initializers are counted already
            total += count
    return total


# --- the sandboxed check --------------------------------------------------------------------


def check_sandboxed(data: bytes, memory_mb: int, timeout_s: float) -> None:
    """Loads the model in a child process capped at `memory_mb` of address space and
    `timeout_s` of wall time and runs it on TEST_ROWS rows; UnsafeModel when that fails."""
    command = [sys.executable, "-m", "hpc_ds1.model.vetting_child", "--memory-mb", str(memory_mb)]
    env = {
        # not the server's environment (its database URL, its secrets): only what Python needs
        **{k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "LANG", "LC_ALL")},
        # one thread each: fewer thread stacks and malloc arenas inside the cap
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "MALLOC_ARENA_MAX": "2",
    }
    with _SANDBOXES, tempfile.TemporaryDirectory(prefix="hpc_ds1-vet-") as empty:
        try:
            # an empty working directory: a relative path in the model would find nothing
            done = subprocess.run(
                command,
                input=data,
                capture_output=True,
                timeout=timeout_s,
                cwd=empty,
                env=env,
                check=False,
            )
        except subprocess.TimeoutExpired:  # run() has killed the child
            raise UnsafeModel(
                f"loading the model and running it on {TEST_ROWS} test rows took over "
                f"{timeout_s:g} s: it must do so within that"
            ) from None
    verdict = _verdict(done.stdout)
    if verdict is None:
        raise UnsafeModel(
            f"the model's check ended abnormally (exit status {done.returncode}): loading and "
            f"running it needs more than the {memory_mb} MB it may use, or crashes onnxruntime"
        )
    if not verdict.get("ok"):
        raise UnsafeModel(str(verdict.get("reason") or "the model failed its check"))


def _verdict(stdout: bytes) -> dict[str, Any] | None:
    lines = stdout.strip().splitlines()
    try:
        found = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def vet(data: bytes, max_bytes: int, memory_mb: int, timeout_s: float) -> None:
    """Both checks, static first: nothing that fails it reaches onnxruntime at all."""
    check_static(data, max_bytes)
    check_sandboxed(data, memory_mb, timeout_s)
