from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from hpc_ds1.runner import Job, Status, run_many
from hpc_ds1.space import Config
from hpc_ds1.workloads import register, unregister
from tests.runner import plugins


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_timeout_kills_the_process_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPCDS1_TEST_PID_DIR", str(tmp_path))
    register(plugins.HANG, replace=True)
    register(plugins.VECTOR_SUM, replace=True)
    c = Config(ranks=2, threads=1, tile=1)
    # Session fixtures (NATS, Postgres) are children of this process too: only new ones count.
    before = {p.pid for p in psutil.Process(os.getpid()).children(recursive=True)}
    try:
        hung, after = run_many(
            [
                Job(workload="test-hang", size=4, config=c, repeats=1),
                Job(workload="test-vector-sum", size=10, config=c, repeats=1),
            ],
            timeout_s=10,  # a loaded machine takes seconds to import the plug-in
        )
    finally:
        unregister(plugins.HANG.name)
        unregister(plugins.VECTOR_SUM.name)
    assert hung.status is Status.TIMED_OUT and "killed" in hung.error
    assert after.status is Status.OK  # the batch went on in a fresh launch
    rank_pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    assert len(rank_pids) == 2
    assert not [pid for pid in rank_pids if _alive(pid)]
    children = psutil.Process(os.getpid()).children(recursive=True)
    assert not [p for p in children if p.pid not in before and _alive(p.pid)]
