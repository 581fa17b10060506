"""Model files nobody here made are checked before onnxruntime sees them (issue 41): every model
our training can export passes both checks; a constant bomb, external data, an operator we never
export and a subgraph are refused by the static check (with no file read); a model within the
static bounds that needs more memory or time than the caps is stopped by the sandbox; the
services' loader refuses what the static check refuses. No message carries onnxruntime's text."""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import numpy as np
import psutil
import pytest
from onnx import TensorProto, helper

from hpc_ds1.model import Model, TrainedModel
from hpc_ds1.model import estimators as est
from hpc_ds1.model import features as ft
from hpc_ds1.model.guard import DistanceGuard
from hpc_ds1.model.onnx_graph import build
from hpc_ds1.model.vetting import (
    ALLOWED_OPS,
    LEGACY_OPS,
    UnsafeModel,
    check_sandboxed,
    check_static,
    vet,
)
from hpc_ds1.settings import Settings
from tests.model.unsafe_models import (
    bomb_in,
    constant_of_shape_bomb,
    external_in,
    grafted,
    heavy_in,
    open_watch,
    parsed,
    peak_rss_growth,
    with_op,
)

LIMITS = Settings.model_fields
MAX_BYTES = LIMITS["max_model_bytes"].default
MEMORY_MB = LIMITS["model_vet_memory_mb"].default
TIMEOUT_S = LIMITS["model_vet_timeout_s"].default


def _candidate_models() -> list[tuple[str, bytes]]:
    """onnx_graph.build over every move-model candidate (4 classes and 2) beside a ridge, and
    every runtime-model candidate beside a logistic move model, on random rows: every operator
    training can export."""
    warnings.simplefilter("ignore")
    rng = np.random.default_rng(0)
    layout = ft.Layout(None, None)
    Xs = rng.normal(size=(120, layout.n_state)).astype(np.float32)
    Xb = rng.normal(size=(120, layout.n_base))
    groups = np.arange(120) % 4
    guard = DistanceGuard.fit(Xb)
    classifiers = {}
    for (name, factory), classes in itertools.product(est.classifier_candidates(0).items(), (4, 2)):
        y = rng.integers(0, classes, size=len(Xs))
        classifiers[f"{name}/{classes}"] = est.fit_quietly(factory(groups), Xs, y)
    regressors = {
        n: f().fit(Xb, rng.normal(size=len(Xb))) for n, f in est.regressor_candidates(0).items()
    }
    pairs = [(c, "ridge") for c in classifiers] + [("logistic/4", r) for r in regressors]
    return [
        (f"{c}+{r}", build(classifiers[c], regressors[r], guard, layout.n_state, layout.n_base, {}))
        for c, r in pairs
    ]


def test_every_model_training_can_export_passes_the_static_check() -> None:
    used: set[tuple[str, str]] = set()
    for name, data in _candidate_models():
        model = check_static(data, MAX_BYTES)
        used |= {(n.domain, n.op_type) for n in model.graph.node}
        assert model.graph.node, name
    # the allowlist is what ours use, and what files of earlier versions used: an op neither
    # exports has no place in it
    assert used == ALLOWED_OPS - LEGACY_OPS and not used & LEGACY_OPS


def test_a_real_model_passes_both_checks(trained: TrainedModel) -> None:
    data = trained.to_onnx()
    vet(data, MAX_BYTES, MEMORY_MB, TIMEOUT_S)
    assert Model.from_untrusted(data, MAX_BYTES).version == Model.from_onnx(data).version


def test_the_bomb_is_refused_statically_without_the_memory_it_asks_for(
    trained: TrainedModel,
) -> None:
    with peak_rss_growth() as growth:
        with pytest.raises(UnsafeModel, match=r"inputs are \[\]"):
            check_static(constant_of_shape_bomb(), MAX_BYTES)
        with pytest.raises(UnsafeModel, match=r"ConstantOfShape.*only on the output of a Shape"):
            check_static(bomb_in(trained.to_onnx()), MAX_BYTES)
        # the services' loader refuses it before onnxruntime builds (and folds) anything
        with pytest.raises(UnsafeModel, match="ConstantOfShape"):
            Model.from_untrusted(bomb_in(trained.to_onnx()), MAX_BYTES)
    assert growth.mb < 200


def test_a_size_made_by_broadcasting_constants_is_refused(trained: TrainedModel) -> None:
    """[65536, 1] + [1, 65536]: two 256 KiB constants, a 16 GiB sum (shape inference sees it)."""
    column = helper.make_tensor("column", TensorProto.FLOAT, [1 << 16, 1], [0.0] * (1 << 16))
    row = helper.make_tensor("row", TensorProto.FLOAT, [1, 1 << 16], [0.0] * (1 << 16))
    nodes = [
        helper.make_node("Add", ["column", "row"], ["square"]),
        helper.make_node("ReduceSum", ["square"], ["extra"], keepdims=0),
    ]
    data = grafted(trained.to_onnx(), nodes, [column, row])
    with pytest.raises(UnsafeModel, match="'square' has 4294967296 elements: at most"):
        check_static(data, MAX_BYTES)


def test_external_data_is_refused_without_opening_the_file(
    trained: TrainedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the location is relative to the reader's working directory
    (tmp_path / "join.token").write_bytes(b"\0" * 4096)
    messages: list[str] = []
    with open_watch(tmp_path / "join.token") as watch:
        for location in ("join.token", "missing.token"):
            with pytest.raises(UnsafeModel) as refused:
                check_static(external_in(trained.to_onnx(), location), MAX_BYTES)
            messages.append(str(refused.value))
        with pytest.raises(UnsafeModel):
            Model.from_untrusted(external_in(trained.to_onnx(), "join.token"), MAX_BYTES)
    assert not watch.opened()
    # the answer is the same whether the file exists or not: it tells nothing about it
    expected = (
        "the model stores initializer 'g_mean' in an external file: every tensor must be "
        "inside the upload"
    )
    assert messages == [expected, expected]


def test_an_operator_outside_the_allowlist_is_refused(trained: TrainedModel) -> None:
    with pytest.raises(UnsafeModel, match="operator Cos, which our training never exports"):
        check_static(with_op(trained.to_onnx(), "Cos"), MAX_BYTES)


def test_subgraphs_and_unused_constant_nodes_are_refused(trained: TrainedModel) -> None:
    model = parsed(trained.to_onnx())
    branch = helper.make_graph([], "b", [], [helper.make_tensor_value_info("X", 1, None)])
    node = next(n for n in model.graph.node if n.op_type == "Identity")
    node.attribute.append(helper.make_attribute("then_branch", branch))
    with pytest.raises(UnsafeModel, match="holds a subgraph"):
        check_static(model.SerializeToString(), MAX_BYTES)
    # a constant-only node no output needs: the forward pass would never run it
    dead = parsed(with_op(trained.to_onnx(), "Identity"))
    dead.graph.node[-1].input[:] = ["distance_raw", "distance_raw"]  # `extra` unused
    with pytest.raises(UnsafeModel, match="feeds none of the model's outputs"):
        check_static(dead.SerializeToString(), MAX_BYTES)


def test_junk_and_oversized_bodies_are_refused_in_our_words() -> None:
    with pytest.raises(UnsafeModel, match="does not parse as an ONNX model"):
        check_static(b"not a model" * 1000, MAX_BYTES)
    with pytest.raises(UnsafeModel, match="at most 1024 are accepted"):
        check_static(b"\0" * 1025, 1024)


def test_the_sandbox_stops_a_model_over_its_memory_cap(trained: TrainedModel) -> None:
    """2 GiB of concatenated copies that no static bound sees: the child dies at its cap of
    1 GiB, the caller's memory stays where it was."""
    data = heavy_in(trained.to_onnx(), copies=512)
    check_static(data, MAX_BYTES)  # within every static bound
    with peak_rss_growth() as growth, pytest.raises(UnsafeModel) as refused:
        check_sandboxed(data, MEMORY_MB, TIMEOUT_S)
    # ours, whether onnxruntime raised (its text stays in the child) or the child died
    assert str(refused.value) in (
        "loading and running the model needs more memory than a model may use here",
        f"the model's check ended abnormally (exit status {-6}): loading and running it needs "
        f"more than the {MEMORY_MB} MB it may use, or crashes onnxruntime",
    )
    assert growth.mb < 200


def test_the_sandbox_kills_a_check_past_its_time(trained: TrainedModel) -> None:
    before = set(psutil.Process().children(recursive=True))  # the session's servers
    with pytest.raises(UnsafeModel, match=r"took over 0\.05 s"):
        check_sandboxed(trained.to_onnx(), MEMORY_MB, 0.05)
    left = set(psutil.Process().children(recursive=True)) - before
    assert left == set()  # killed, not left running
