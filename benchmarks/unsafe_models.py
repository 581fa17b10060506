"""Model files an attacker holding a device credential could upload (issue 41), built from a
real model of ours so that only the added part is wrong, and a way to see whether anything
opened a file while they were checked. Used by benchmarks/probe_devices.py (against a running
`hpc-ds1 serve`) and, through tests/model/unsafe_models.py, by the vetting and agent API tests:
one copy of each builder."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from hpc_ds1.model.onnx_graph import DISTANCE

BOMB_ELEMENTS = 1 << 28  # float32: 1 GiB, made by a file of a few hundred bytes


def parsed(data: bytes) -> onnx.ModelProto:
    model = onnx.ModelProto()
    model.ParseFromString(data)
    return model


def constant_of_shape_bomb(elements: int = BOMB_ELEMENTS) -> bytes:
    """The issue's 156-byte model: ConstantOfShape([elements]) -> ReduceSum, nothing else."""
    shape = numpy_helper.from_array(np.array([elements], dtype=np.int64), "shape")
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    graph = helper.make_graph(
        [
            helper.make_node("ConstantOfShape", ["shape"], ["big"], value=one),
            helper.make_node("ReduceSum", ["big"], ["y"], keepdims=0),
        ],
        "bomb",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
        initializer=[shape],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def grafted(
    data: bytes, nodes: list[onnx.NodeProto], initializers: list[onnx.TensorProto]
) -> bytes:
    """`data` (an hpc_ds1 model) with `nodes` computing a scalar `extra` added to its distance
    output: every added node feeds an output, so a forward pass runs them all."""
    model = parsed(data)
    for node in model.graph.node:
        node.output[:] = ["distance_raw" if o == DISTANCE else o for o in node.output]
    model.graph.node.extend(
        [*nodes, helper.make_node("Add", ["distance_raw", "extra"], [DISTANCE])]
    )
    model.graph.initializer.extend(initializers)
    return model.SerializeToString()


def bomb_in(data: bytes, elements: int = BOMB_ELEMENTS) -> bytes:
    """The bomb inside a real model: an optimizing onnxruntime session computes the 1 GiB
    constant when it is built, and the file is otherwise a valid hpc_ds1 model."""
    shape = numpy_helper.from_array(np.array([elements], dtype=np.int64), "bomb_shape")
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [0.0])
    nodes = [
        helper.make_node("ConstantOfShape", ["bomb_shape"], ["bomb"], value=one),
        helper.make_node("ReduceSum", ["bomb"], ["extra"], keepdims=0),
    ]
    return grafted(data, nodes, [shape])


def heavy_in(data: bytes, copies: int = 512) -> bytes:
    """A real model with `copies` of a 4 MiB constant concatenated (2 GiB at 512): within every
    static bound (the ai.onnx.ml Scaler hides the shape from ONNX shape inference), so only
    the sandbox's memory cap can stop it."""
    block = numpy_helper.from_array(np.zeros((1, 1 << 20), dtype=np.float32), "block")
    nodes = [
        helper.make_node(
            "Scaler", ["block"], ["scaled"], domain="ai.onnx.ml", scale=[1.0], offset=[0.0]
        ),
        helper.make_node("Concat", ["scaled"] * copies, ["stacked"], axis=0),
        helper.make_node("ReduceSum", ["stacked"], ["extra"], keepdims=0),
    ]
    return grafted(data, nodes, [block])


def with_op(data: bytes, op_type: str = "Cos") -> bytes:
    """A real model with one harmless operator our training never exports."""
    zero = numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero")
    return grafted(data, [helper.make_node(op_type, ["zero"], ["extra"])], [zero])


def external_in(data: bytes, location: str, tensor: str = "g_mean") -> bytes:
    """A real model whose `tensor` is stored as ONNX external data at `location` (a path
    relative to the reader's working directory), as the probe in issue 41 sent it."""
    model = parsed(data)
    found = next(t for t in model.graph.initializer if t.name == tensor)
    length = len(found.raw_data) or len(numpy_helper.to_array(found).tobytes())
    found.ClearField("raw_data")
    found.ClearField("float_data")
    found.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(length))):
        entry = found.external_data.add()
        entry.key, entry.value = key, value
    return model.SerializeToString()


IN_ACCESS, IN_OPEN, IN_NONBLOCK = 0x1, 0x20, 0o4000


@dataclass
class Watch:
    fd: int
    seen: bool = False

    def opened(self) -> bool:
        """Whether anything opened or read the file since the watch began (inotify); after the
        watch ended, whether anything did while it ran."""
        if self.fd >= 0:
            try:
                self.seen |= len(os.read(self.fd, 4096)) > 0
            except BlockingIOError:
                pass
        return self.seen


@contextmanager
def open_watch(path: Path) -> Iterator[Watch]:
    """Tells whether anything opens or reads `path` (Linux inotify: IN_OPEN, IN_ACCESS). A
    FIFO is no such test: onnxruntime refuses one unopened ("require a regular file")."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(IN_NONBLOCK)
    if fd < 0 or libc.inotify_add_watch(fd, str(path).encode(), IN_OPEN | IN_ACCESS) < 0:
        raise OSError(ctypes.get_errno(), f"inotify cannot watch {path}")
    watch = Watch(fd)
    try:
        yield watch
    finally:
        watch.opened()
        watch.fd = -1
        os.close(fd)
