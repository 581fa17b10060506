"""Recorded landscapes as devices (hpc_ds1.workloads.recorded_space) on a cut of the benchmark hub's
convolution cache for the RTX A6000 (tests/tuning/data/README.md says where it came from)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from hpc_ds1.workloads.recorded_space import (
    NotRecorded,
    RecordedDevice,
    RecordedError,
    RecordedSpace,
)

DATA = Path(__file__).resolve().parents[1] / "tuning" / "data"
CACHE = DATA / "convolution_milo_A6000_cut.json"
T4 = DATA / "convolution_milo_A6000_cut_T4.json.gz"
KERNEL = DATA / "convolution_milo_cut.json"
NAMES = (
    "block_size_x",
    "block_size_y",
    "tile_size_x",
    "tile_size_y",
    "read_only",
    "use_padding",
    "use_shmem",
    "use_cmem",
    "filter_height",
    "filter_width",
)
OK = (32, 8, 4, 4, 0, 0, 1, 1, 15, 15)
RUNTIME = (80, 4, 3, 4, 0, 0, 0, 1, 15, 15)
COMPILE = (80, 8, 3, 4, 0, 1, 1, 1, 15, 15)


@pytest.fixture(scope="module")
def recorded() -> RecordedSpace:
    return RecordedSpace.load(CACHE, kernel=KERNEL)


def raw() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(CACHE.read_text())
    return data


def test_loads_knobs_values_constraints_and_failures(recorded: RecordedSpace) -> None:
    space = recorded.space
    assert space.names == NAMES
    assert [k.values for k in space.knobs][:4] == [(32, 80), (4, 8), (3, 4), (4,)]
    assert all(k.kind == "int" for k in space.knobs)
    assert len(space.constraints) == 4
    assert space.constraints[1].text == "block_size_x*block_size_y<=1024"
    assert recorded.device == "NVIDIA RTX A6000" and recorded.objective == "time"
    assert recorded.format == "kernel_tuner" and recorded.count == 36
    kinds = sorted(recorded.failures().values())
    assert kinds == ["compile"] * 2 + ["runtime"] * 18
    assert recorded.failures()[COMPILE] == "compile" and recorded.failures()[RUNTIME] == "runtime"
    repeats = recorded.records[OK]
    assert isinstance(repeats, tuple) and len(repeats) == 32
    record = raw()["cache"]["32,8,4,4,0,0,1,1,15,15"]
    assert repeats == pytest.approx([t / 1000 for t in record["times"]], rel=1e-12)  # ms -> s
    assert statistics.fmean(repeats) == pytest.approx(record["time"] / 1000)


def test_the_constraints_describe_exactly_what_was_recorded(recorded: RecordedSpace) -> None:
    # the hub records no InvalidConfig: the constraints leave out what was never run, so the
    # valid space is exactly the recorded set, failures included
    assert set(recorded.space.configs()) == set(recorded.configs())
    assert recorded.outside() == () and recorded.unrecorded() == ()
    assert recorded.space.product == 64 and recorded.space.count() == 36


def test_t4_file_gives_the_same_landscape(recorded: RecordedSpace) -> None:
    t4 = RecordedSpace.load(T4, kernel=KERNEL)
    assert t4.format == "t4" and t4.device == "convolution_milo_A6000_cut"
    assert t4.space.names == NAMES and t4.records == recorded.records
    with pytest.raises(RecordedError, match="kernel: a T4 file needs its T1 kernel file"):
        RecordedSpace.load(T4)


def test_run_draws_only_recorded_repeats_deterministically(recorded: RecordedSpace) -> None:
    repeats = recorded.records[OK]
    assert isinstance(repeats, tuple)
    draws = [RecordedDevice(recorded, seed=7).run(OK) for _ in range(3)]
    assert len({d.seconds for d in draws}) == 1  # a fresh device with the same seed: same draw
    device, again = RecordedDevice(recorded, seed=7), RecordedDevice(recorded, seed=7)
    runs = [device.run(OK) for _ in range(400)]
    assert [r.seconds for r in runs] == [again.run(OK).seconds for _ in range(400)]
    assert all(r.ok and r.seconds == repeats[r.repeat or 0] for r in runs)
    assert len({r.repeat for r in runs}) == 32  # every repeat drawn in 400 draws
    seed_8 = RecordedDevice(recorded, seed=8)
    assert [r.seconds for r in runs] != [seed_8.run(OK).seconds for _ in range(400)]
    assert device.run(dict(zip(NAMES, OK, strict=True))).seconds in repeats


def test_failed_configurations_fail_with_their_kind(recorded: RecordedSpace) -> None:
    device = RecordedDevice(recorded, seed=1)
    for config, kind in ((RUNTIME, "runtime"), (COMPILE, "compile")):
        result = device.run(config)
        assert not result.ok and result.failure == kind and result.seconds is None


def test_unrecorded_configuration_is_refused(tmp_path: Path) -> None:
    data = raw()
    del data["cache"]["32,8,4,4,0,0,1,1,15,15"]
    path = tmp_path / "gap.json"
    path.write_text(json.dumps(data))
    device = RecordedDevice(RecordedSpace.load(path, kernel=KERNEL), seed=0)
    with pytest.raises(NotRecorded) as caught:
        device.run(OK)
    message = str(caught.value)
    assert str(path) in message and "block_size_x=32 block_size_y=8 tile_size_x=4" in message
    assert "was not recorded" in message
    with pytest.raises(NotRecorded, match="violates 'use_padding==0 or block_size_x % 32 != 0'"):
        device.run((32, 8, 3, 4, 0, 1, 1, 1, 15, 15))
    assert device.recorded.unrecorded() == (OK,)


def test_optimum_is_the_lowest_mean(recorded: RecordedSpace) -> None:
    config, seconds = recorded.optimum()
    means = {c: recorded.mean(c) for c in recorded.configs() if c not in recorded.failures()}
    assert seconds == min(m for m in means.values() if m is not None) and means[config] == seconds
    assert 1e-4 < seconds < 1e-2  # convolution on an A6000: about a millisecond


def test_gzip_and_restrictions_in_the_cache(tmp_path: Path) -> None:
    data = raw()
    data["restrictions"] = ["block_size_x * block_size_y <= 256"]
    path = tmp_path / "restricted.json"
    path.write_text(json.dumps(data))
    loaded = RecordedSpace.load(path)  # no kernel file: the cache's own restrictions
    assert len(loaded.space.constraints) == 1
    assert set(loaded.outside()) == {c for c in loaded.configs() if int(c[0]) * int(c[1]) > 256}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d.pop("tune_params"), "tune_params"),
        (lambda d: d.pop("cache"), "cache/results"),
        (lambda d: d.update(tune_params_keys=["block_size_x"]), "tune_params_keys"),
        (lambda d: d.update(objective="GFLOP/s"), "objective"),
        (lambda d: d.update(restrictions=[{"f": 1}]), "restrictions"),
        (lambda d: d["cache"].update({"32,8": {"time": 1.0}}), "cache['32,8']"),
        (
            lambda d: d["cache"]["32,8,4,4,0,0,1,1,15,15"].update(time="Oops"),
            "cache['32,8,4,4,0,0,1,1,15,15'].time",
        ),
        (
            lambda d: d["cache"]["32,8,4,4,0,0,1,1,15,15"].update(times=[]),
            "cache['32,8,4,4,0,0,1,1,15,15'].times",
        ),
        (
            lambda d: d["cache"]["32,8,4,4,0,0,1,1,15,15"].update(times=[1.0, "x"]),
            "cache['32,8,4,4,0,0,1,1,15,15'].times",
        ),
        (lambda d: d["tune_params"].update(read_only="01"), "tune_params.read_only"),
        (lambda d: d.update(restrictions=["__import__('os')"]), "constraints[0]"),
    ],
)
def test_malformed_files_are_refused_naming_file_and_field(
    tmp_path: Path, change: Any, field: str
) -> None:
    data = raw()
    change(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(RecordedError) as caught:
        RecordedSpace.load(path)
    assert str(caught.value).startswith(f"{path}: {field}")


def test_unreadable_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(RecordedError, match=f"{path}: file: is not JSON"):
        RecordedSpace.load(path)
    with pytest.raises(RecordedError, match="file: cannot be read"):
        RecordedSpace.load(tmp_path / "missing.json.gz")
