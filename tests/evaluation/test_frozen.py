"""A frozen test set (issue 43, item 3): drawn before anything of it is measured, verified by
its SHA-256, measured once; its cells inside and 2-4x beyond the trained range, a kernel and a
recorded device the model never saw."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from hpc_ds1.evaluation import frozen as fz
from hpc_ds1.model import Model
from hpc_ds1.workloads import get_workload, load_file

DATA = Path(__file__).resolve().parents[1] / "tuning" / "data"
CACHE = DATA / "convolution_milo_A6000_cut.json"
KERNEL = DATA / "convolution_milo_cut.json"
ROOMY = fz.Machine(total_bytes=64 * 2**30, available_bytes=32 * 2**30, max_run_s=600.0)


def _document(model: Model, seed: int = 0, machine: fz.Machine = ROOMY) -> dict[str, Any]:
    workloads = [get_workload(w) for w in sorted(model.workloads)]
    drawn = fz.draw(model, workloads, seed=seed, machine=machine, repeats=2, truth_repeats=5)
    return fz.document_for(
        model, drawn, seed=seed, repeats=2, truth_repeats=5, workloads=sorted(model.workloads)
    )


def test_the_file_verifies_and_an_edited_one_is_refused(model: Model, tmp_path: Path) -> None:
    document = _document(model)
    path = fz.write(tmp_path, document)
    assert path == tmp_path / "evaluation" / "frozen" / f"{document['sha256'][:12]}.json"
    assert fz.load_verified(path) == document
    assert fz.digest(orjson.loads(path.read_bytes())) == document["sha256"]
    assert not os.access(path, os.W_OK) or os.geteuid() == 0  # written read-only

    edited = orjson.loads(path.read_bytes())
    edited["cells"][0]["size"] += 8
    path.chmod(0o644)
    path.write_bytes(orjson.dumps(edited, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2))
    with pytest.raises(fz.EditedSet, match="edited after it was frozen"):
        fz.load_verified(path)
    # re-hashed by hand: the content verifies, but the file's name is the old hash's
    edited["sha256"] = fz.digest(edited)
    path.write_bytes(orjson.dumps(edited))
    with pytest.raises(fz.EditedSet, match="its name does not match its SHA-256"):
        fz.load_verified(path)


def test_cells_inside_and_two_to_four_times_beyond_the_trained_range(model: Model) -> None:
    document = _document(model, seed=3)
    assert document["model"]["version"] == model.version
    assert document["code"]["commit"] or document["code"]["source"] == "package version"
    for name in model.workloads:
        wl, trained = get_workload(name), sorted(model.sizes[name])
        inside = [
            c["size"] for c in fz.cells_of(document, "interpolation") if c["workload"] == name
        ]
        assert len(inside) == fz.INTERPOLATION_PER_WORKLOAD
        for size in inside:
            assert trained[0] < size < trained[-1]
            assert size not in {*trained, *wl.sizes, *wl.held_out}
        (beyond,) = [c for c in fz.cells_of(document, "extrapolation") if c["workload"] == name]
        assert 2 * trained[-1] <= beyond["size"] <= 4 * trained[-1]
        assert beyond["estimate"]["memory_gib"] > 0
    (kernel,) = fz.cells_of(document, "unseen_kernel")  # the model knows gemm and stencil only
    assert kernel["workload"] not in model.workloads and kernel["source"] == "built-in"
    assert kernel["size"] == min(get_workload(kernel["workload"]).sizes)
    assert fz.cells_of(document, "unseen_device") == []  # no recorded workload registered
    (device,) = [a for a in document["absent"] if a["kind"] == "unseen_device"]
    assert "no recorded workload" in device["reason"]
    # another seed draws other cells; the same seed and time, the same ones
    assert _document(model, seed=4)["cells"] != document["cells"]
    again = fz.draw(
        model,
        [get_workload(w) for w in sorted(model.workloads)],
        seed=3,
        machine=ROOMY,
        repeats=2,
        truth_repeats=5,
    )
    assert again.cells == document["cells"]


def test_a_size_that_does_not_fit_is_not_drawn_and_the_set_says_why(model: Model) -> None:
    small = fz.Machine(total_bytes=2**30, available_bytes=2**30, max_run_s=600.0)
    document = _document(model, machine=small)
    assert fz.cells_of(document, "extrapolation") == []
    reasons = [a["reason"] for a in document["absent"] if a["kind"] == "extrapolation"]
    assert len(reasons) == len(model.workloads)
    assert all("fits this machine" in r and "GiB" in r for r in reasons)
    # the run cap too: a run predicted close to it is not drawn
    capped = fz.Machine(total_bytes=64 * 2**30, available_bytes=32 * 2**30, max_run_s=1e-6)
    document = _document(model, machine=capped)
    assert fz.cells_of(document, "extrapolation") == []
    assert all("run cap" in a["reason"] for a in document["absent"] if a["kind"] == "extrapolation")


def test_a_set_is_claimed_once(model: Model, tmp_path: Path) -> None:
    path = fz.write(tmp_path, _document(model))
    marker = fz.claim(path, {"argv": ["evaluate", "--final"]})
    assert marker == path.with_suffix(".measured") and marker.exists()
    with pytest.raises(fz.FrozenSetError, match="a set is measured once") as refused:
        fz.claim(path, {})
    assert "did not finish" in str(refused.value)  # a crash midway still counts as measured
    fz.finished(path, "ev-1")
    with pytest.raises(fz.FrozenSetError, match=r"evaluation ev-1\)"):
        fz.claim(path, {})


def test_the_newest_set_is_found_and_a_prefix_names_one(model: Model, tmp_path: Path) -> None:
    with pytest.raises(fz.FrozenSetError, match="run `hpc-ds1 evaluate --freeze` first"):
        fz.find(tmp_path, None)
    first = fz.write(tmp_path, _document(model, seed=1))
    second = fz.write(tmp_path, _document(model, seed=2))
    assert fz.find(tmp_path, None) == second
    assert fz.find(tmp_path, first.stem[:8]) == first
    assert fz.find(tmp_path, str(first)) == first
    with pytest.raises(fz.FrozenSetError, match="no frozen set"):
        fz.find(tmp_path, "ffffffffffff0")
    # a later set never draws a cell an earlier one holds
    earlier = fz.earlier_cells(tmp_path)
    workloads = [get_workload(w) for w in sorted(model.workloads)]
    later = fz.draw(
        model, workloads, seed=1, machine=ROOMY, repeats=2, truth_repeats=5, earlier=earlier
    )
    measured = {(c["workload"], c["size"]) for c in later.cells if c["kind"] in fz.MEASURED_KINDS}
    assert measured and not measured & earlier


def test_a_recorded_device_never_trained_on_is_scored_against_its_optimum(
    model: Model, tmp_path: Path
) -> None:
    toml = tmp_path / "conv.toml"
    toml.write_text(f'[workload]\nname = "conv-a6000"\nrecorded = "{CACHE}"\nkernel = "{KERNEL}"\n')
    load_file(toml)
    document = _document(model)
    (cell,) = fz.cells_of(document, "unseen_device")
    assert cell["workload"] == "conv-a6000" and cell["size"] == 1 and cell["device"]
    both = fz.unseen(model, document, [], [], model.thresholds)
    kernel = both["unseen_kernel"]  # nothing measured: decided on, flagged, not scored
    assert kernel["flagged"] is True and kernel["scored"] is False
    assert kernel["reason"] == "its configurations were not measured"
    result = both["unseen_device"]
    assert result["flagged"] is True  # a workload never measured on this machine
    assert "never measured" in " ".join(result["system1"]["reasons"])
    if result["scored"]:
        assert 0 <= result["system1"]["pct_of_optimum"] <= 100
        assert result["optimum"]["mean_s"] > 0
    else:
        assert result["reason"]
