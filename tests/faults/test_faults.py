"""Every fault scenario of benchmarks/bench_faults.py once, with small loads: real `kill -9` of
nats-server, Postgres, the projector, the coordinator and an agent, and a cut connection, each
against real processes; nothing acknowledged may be lost, duplicated or left as a gap, and
nothing of a killed job may be left running."""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.bench_faults import parse_args
from benchmarks.faults import SCENARIOS, SMALL, Cluster, report, run_scenario, shared_cluster
from benchmarks.faults.cluster import MARKER, kill_marked, marked, stream_ids
from benchmarks.faults.outcome import Outcome
from benchmarks.faults.publisher import measurement, publish_through_faults
from benchmarks.faults.scenarios import lock_free
from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.settings import Settings


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = shared_cluster(tmp_path_factory.mktemp("faults"))
    with cluster.running():
        yield cluster


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_the_system_survives_the_fault(name: str, shared: Cluster) -> None:
    outcome = await run_scenario(name, 1, SMALL, seed=0, shared=shared)
    assert outcome.kills == 1, report([outcome])
    assert outcome.ok, report([outcome])


async def test_the_stream_check_sees_an_acknowledged_event_that_is_missing(
    settings: Settings, bus: EventBus
) -> None:
    """The scenarios' check is the acknowledged ids against the stream's: a lost one shows."""
    events = [measurement(settings.subject_prefix, i) for i in range(5)]
    published = await publish_through_faults(bus, events[:4])
    stored = set(await stream_ids(bus))
    acked = [*published.acked, events[4].id]  # as if the fifth had been acknowledged
    assert [i for i in acked if i not in stored] == [events[4].id]


def test_an_outcome_with_anything_lost_duplicated_or_left_is_not_ok() -> None:
    def survived_one(**changes: int) -> Outcome:
        outcome = Outcome("x", "x", repeats=1, kills=1, survived=1)
        for key, value in changes.items():
            setattr(outcome, key, value)
        return outcome

    assert survived_one().ok
    for bad in ({"lost": 1}, {"duplicates": 1}, {"gaps": 1}, {"orphans": 1}, {"survived": 0}):
        assert not survived_one(**bad).ok, bad
    assert not survived_one(kills=0, survived=0).ok  # a fault that never happened proves nothing


def test_the_benchmark_rejects_bad_arguments_saying_what_is_accepted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert parse_args([]).repeat == 10
    for args, expected in (
        (["--repeat", "0"], "--repeat must be at least 1, got 0"),
        (["--only", "nope"], "invalid choice: 'nope' (choose from"),
    ):
        with pytest.raises(SystemExit) as exited:
            parse_args(args)
        assert exited.value.code == 2
        assert expected in capsys.readouterr().err


async def test_an_unknown_scenario_or_repeat_count_is_refused_naming_what_is_accepted() -> None:
    with pytest.raises(ValueError, match="the scenarios are: nats-server, postgres"):
        await run_scenario("nope", 1)
    with pytest.raises(ValueError, match="repeat must be at least 1"):
        await run_scenario("agent", 0)


def test_the_orphan_check_finds_a_process_left_behind_and_the_lock_check_a_held_lock(
    tmp_path: Path,
) -> None:
    marker = f"test-{os.getpid()}"
    left = subprocess.Popen(
        ["sleep", "60"], env={**os.environ, MARKER: marker}, start_new_session=True
    )
    try:
        assert [p.pid for p in marked(marker)] == [left.pid]
        assert kill_marked(marker) == 1
        assert marked(marker) == []
    finally:
        left.kill()
        left.wait()
    assert lock_free(tmp_path)
    with (tmp_path / "device.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        assert not lock_free(tmp_path)
