"""The tiny measurement set is measured once per run and read by every other xdist worker."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from hpc_ds1.model import Measurement
from tests.support.measured import shared_across_workers


def _one(size: int) -> Measurement:
    return Measurement(
        workload="gemm", size=size, config={"ranks": 1, "threads": 1}, status="ok", runtime_s=0.5
    )


def test_the_first_worker_measures_and_the_others_read_what_it_wrote(tmp_path: Path) -> None:
    calls: list[int] = []

    def produce() -> list[Measurement]:
        calls.append(1)
        time.sleep(0.2)  # long enough that the second worker arrives while the first measures
        return [_one(48), _one(64)]

    got: dict[str, list[Measurement]] = {}

    def worker(name: str) -> None:
        got[name] = shared_across_workers(tmp_path, "set", produce)

    workers = [threading.Thread(target=worker, args=(f"gw{i}",)) for i in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(calls) == 1
    assert got["gw0"] == got["gw1"] == [_one(48), _one(64)]
    assert shared_across_workers(tmp_path, "set", produce) == got["gw0"]
    assert len(calls) == 1


def test_a_worker_whose_measuring_failed_leaves_it_to_the_next(tmp_path: Path) -> None:
    def fails() -> list[Measurement]:
        raise RuntimeError("the runner died")

    with pytest.raises(RuntimeError, match="the runner died"):
        shared_across_workers(tmp_path, "set", fails)
    assert not (tmp_path / "set.json").exists()
    assert shared_across_workers(tmp_path, "set", lambda: [_one(96)]) == [_one(96)]
