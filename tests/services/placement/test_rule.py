"""The placement rule and its fold, pure: measured beats predicted numbers, the queue counts,
a guard-rejecting device only when none accepts (and the reason says so), devices the task
failed on are left out, and a task with nowhere to go says what it waits for."""

from __future__ import annotations

import random
from typing import Any

import pytest

from hpc_ds1.events import (
    DeviceDraining,
    DeviceLeft,
    DeviceRegistered,
    DeviceStatusChanged,
    MeasurementRecorded,
    ModelPublished,
    TaskFinished,
    TaskPlaced,
    TaskRequeued,
    TaskRunFailed,
    TaskStarted,
    TaskSubmitted,
    TaskWaiting,
)
from hpc_ds1.fleet.placement import (
    FLEET_SPREAD,
    DeviceView,
    Estimate,
    FleetState,
    Placement,
    TaskSpec,
    Waiting,
    place,
    seconds,
)
from tests.services.placement.devices import FP

JOB = TaskSpec("t1", "nbody", 4096)
KEY = (JOB.workload, JOB.size)
A = {"ranks": 1, "threads": 2, "tile": 64, "gpu": False}
B = {"ranks": 2, "threads": 1, "tile": 64, "gpu": False}


def device(device_id: str, **fields: Any) -> DeviceView:
    return DeviceView(device_id, registered=True, online=True, **fields)


def measured(runtime_s: float, config: dict[str, Any] = A) -> Estimate:
    return Estimate(runtime_s, config, "measured")


def predicted(runtime_s: float, config: dict[str, Any] = B, *reasons: str) -> Estimate:
    return Estimate(runtime_s, config, "predicted", not reasons, reasons, "dev:v1")


def placed(result: Placement | Waiting) -> Placement:
    assert isinstance(result, Placement), result
    return result


def test_the_earliest_finish_wins_and_the_reason_names_the_numbers_and_the_runner_up() -> None:
    a = device("dev-a", best={KEY: measured(9.0, A)})
    b = device("dev-b", best={KEY: measured(4.2, B)})
    b.add_queued("other", 3.1)
    got = placed(place(JOB, [a, b], now=100.0))
    assert got.device_id == "dev-b"
    assert got.config == B and got.basis == "measured"
    assert got.expected_s == 4.2 and got.queue_s == pytest.approx(3.1)
    assert got.reason == (
        "dev-b: queue 3.1 s + best measured 4.2 s (ranks=2 threads=1 tile=64) = 7.3 s; "
        "next dev-a 9.0 s"
    )
    assert got.runner_up == "dev-a"
    assert [c.device_id for c in got.candidates] == ["dev-b", "dev-a"]
    assert got.candidates[0].finish_s == pytest.approx(7.3)


def test_a_queue_longer_than_the_gain_sends_it_to_the_slower_device() -> None:
    a = device("dev-a", best={KEY: measured(9.0)})
    b = device("dev-b", best={KEY: measured(4.2)})
    b.add_queued("x", 3.0)
    b.add_queued("y", 2.5)
    assert placed(place(JOB, [a, b], now=0.0)).device_id == "dev-a"  # 9.0 < 5.5 + 4.2


def test_the_running_task_counts_what_it_has_left_never_below_zero() -> None:
    state = FleetState()
    b = state.device("dev-b")
    b.registered = b.online = True
    b.best[KEY] = measured(1.0)
    state.apply(1, TaskSubmitted(task_id="r", workload="gemm", size=8, submitted_by="x"), 0.0)
    state.apply(2, placed_event("r", "dev-b", expected_s=10.0), 0.0)
    state.apply(3, TaskStarted(task_id="r", attempt=1, device_id="dev-b"), 100.0)
    assert b.queue_s(104.0) == pytest.approx(6.0)
    assert b.queue_s(130.0) == 0.0  # running past its estimate: nothing left, not negative
    a = device("dev-a", best={KEY: measured(5.5)})
    assert placed(place(JOB, [a, b], now=104.0)).device_id == "dev-a"  # 5.5 < 6.0 + 1.0
    assert placed(place(JOB, [a, b], now=106.0)).device_id == "dev-b"  # 4.0 + 1.0 < 5.5


def test_measured_is_used_over_the_devices_own_prediction() -> None:
    a = device("dev-a", best={KEY: measured(6.0)}, predicted={KEY: predicted(1.0)})
    b = device("dev-b", predicted={KEY: predicted(5.0)})
    got = placed(place(JOB, [a, b], now=0.0))
    assert got.device_id == "dev-b" and got.basis == "predicted" and got.config == B
    assert got.reason == (
        "dev-b: queue 0.0 s + predicted 5.0 s (ranks=2 threads=1 tile=64, its model dev:v1) "
        "= 5.0 s; next dev-a 6.0 s (measured)"
    )


def test_a_guard_rejected_device_is_chosen_only_when_none_accepts_and_the_reason_says_so() -> None:
    far = "size 99999 is outside the measured range 64-8192 for nbody"
    a = device("dev-a", predicted={KEY: predicted(1.0, B, far)})
    b = device("dev-b", predicted={KEY: predicted(8.0)})
    got = placed(place(JOB, [a, b], now=0.0))
    assert got.device_id == "dev-b" and not got.guard_rejected
    assert "dev-a would finish at 1.0 s but its familiarity guard rejects the job" in got.reason
    assert far in got.reason
    assert [(c.device_id, c.accepted) for c in got.candidates] == [
        ("dev-b", True),
        ("dev-a", False),
    ]

    c = device("dev-c", predicted={KEY: predicted(3.0, A, "other hardware")})
    alone = placed(place(JOB, [a, c], now=0.0))
    assert alone.device_id == "dev-a" and alone.guard_rejected
    assert "every device's familiarity guard rejects nbody size 4096" in alone.reason
    assert far in alone.reason and alone.runner_up == "dev-c"


def test_devices_the_task_failed_on_draining_offline_and_left_ones_are_left_out() -> None:
    fast = {KEY: measured(1.0)}
    devices = [
        device("dev-a", best=dict(fast)),
        device("dev-b", best=dict(fast), draining=True),
        device("dev-c", best=dict(fast), left=True),
        DeviceView("dev-d", registered=True, online=False, best=dict(fast)),
        device("dev-e", best={KEY: measured(50.0)}),
        DeviceView("dev-f", registered=False, online=True, best=dict(fast)),  # never joined
    ]
    assert placed(place(JOB, devices, 0.0)).device_id == "dev-a"
    got = placed(place(JOB, devices, 0.0, excluded={"dev-a"}))
    assert got.device_id == "dev-e" and got.reason.endswith("no other device can take it")


def test_what_a_task_waits_for() -> None:
    def waiting(devices: list[DeviceView], excluded: frozenset[str] = frozenset()) -> Waiting:
        result = place(JOB, devices, 0.0, excluded)
        assert isinstance(result, Waiting), result
        return result

    none = waiting([])
    assert none.kind == "no_device" and "no device has joined" in none.reason
    gone = waiting([device("dev-a", left=True)])
    assert gone.kind == "all_left" and "every device has left" in gone.reason
    off = waiting([DeviceView("dev-a", registered=True), DeviceView("dev-b", registered=True)])
    assert off.kind == "offline"
    assert off.reason == (
        "no device is online (dev-a, dev-b offline); it waits for one to come online"
    )
    drain = waiting([device("dev-a", draining=True)])
    assert drain.kind == "draining" and "every online device is draining (dev-a)" in drain.reason
    failed = waiting([device("dev-a"), device("dev-b")], frozenset({"dev-a", "dev-b"}))
    assert failed.kind == "failed"
    assert "it already failed on dev-a, dev-b" in failed.reason
    mixed = waiting([device("dev-a", draining=True), DeviceView("dev-b", registered=True)])
    assert mixed.kind == "mixed"
    assert mixed.reason.startswith("no device can take it now: ")
    assert "1 offline (dev-b)" in mixed.reason and "1 draining (dev-a)" in mixed.reason


def test_no_estimate_anywhere_runs_at_the_default_configuration_of_the_shortest_queue() -> None:
    a = device("dev-a", fingerprint=FP)
    a.add_queued("x", 2.0)
    b = device("dev-b", fingerprint=FP)
    got = placed(place(TaskSpec("t", "gemm", 256), [a, b], 0.0))
    assert got.device_id == "dev-b" and got.basis == "none" and got.expected_s == 0.0
    assert got.config["ranks"] == 1 and got.config["threads"] == 4  # one rank, every core
    assert "no online device has measured gemm size 256" in got.reason


def test_seconds_keep_small_durations_readable() -> None:
    assert seconds(3.14159) == "3.1 s"
    assert seconds(0.0042) == "0.0042 s"
    assert seconds(0.0) == "0.0 s"


# --- the fold ---------------------------------------------------------------------------


def placed_event(task_id: str, device_id: str, attempt: int = 1, expected_s: float = 2.0) -> Any:
    return TaskPlaced(
        task_id=task_id,
        attempt=attempt,
        device_id=device_id,
        config=A,
        expected_s=expected_s,
        queue_s=0.0,
        basis="measured",
        reason="r",
    )


def measurement(mid: str, device_id: str, runtime_s: float, **fields: Any) -> Any:
    values: dict[str, Any] = {
        "measurement_id": mid,
        "device_id": device_id,
        "workload": "nbody",
        "size": 4096,
        "config": B,
        "status": "ok",
        "runtime_s": runtime_s,
        **fields,
    }
    return MeasurementRecorded(**values)


def test_the_fold_keeps_each_devices_best_correct_run_and_its_lifecycle() -> None:
    s = FleetState()
    assert s.apply(1, DeviceRegistered(device_id="a", hostname="h", fingerprint=FP), 0).fleet
    s.apply(2, measurement("m1", "a", 5.0), 0)
    s.apply(3, measurement("m2", "a", 1.0, check_ok=False), 0)  # a wrong answer is no best
    s.apply(4, measurement("m3", "a", 0.5, status="failed"), 0)
    s.apply(5, measurement("m4", "a", 3.0, config=A), 0)
    s.apply(6, measurement("m5", "a", 4.0), 0)
    best = s.devices["a"].best[KEY]
    assert (best.runtime_s, best.config, best.source) == (3.0, A, "m4")
    assert s.apply(7, DeviceStatusChanged(device_id="a", status="online"), 0).fleet
    assert s.devices["a"].online
    assert not s.apply(8, DeviceDraining(device_id="a", draining=True, by="x"), 0).fleet
    assert s.apply(9, DeviceDraining(device_id="a", draining=False, by="x"), 0).fleet
    s.devices["a"].predicted[KEY] = predicted(1.0)
    pub = ModelPublished(
        model_version="a:v2", device_id="a", artifact="a/v2.onnx", sha256="0" * 64, trained_on=3
    )
    assert s.apply(10, pub, 0).fleet
    assert s.devices["a"].model_artifact == "a/v2.onnx" and not s.devices["a"].predicted
    s.apply(11, DeviceLeft(device_id="a", reason="revoked"), 0)
    assert s.devices["a"].left


def test_the_fold_follows_a_task_and_its_devices_queue() -> None:
    s = FleetState()
    change = s.apply(1, TaskSubmitted(task_id="t", workload="nbody", size=4, submitted_by="u"), 0)
    assert change.task == "t" and s.tasks["t"].needs_placement
    s.apply(2, TaskWaiting(task_id="t", reason="no device"), 0)
    assert s.tasks["t"].status == "waiting" and [t.task_id for t in s.waiting()] == ["t"]
    s.apply(3, placed_event("t", "a", expected_s=2.5), 0)
    assert s.devices["a"].queued_s == 2.5 and s.tasks["t"].status == "placed"
    assert [t.task_id for t in s.placed_not_started()] == ["t"]
    s.apply(3, placed_event("t", "a", expected_s=2.5), 0)  # the same event again: skipped
    assert s.devices["a"].queued == {"t": 2.5}
    s.apply(4, TaskStarted(task_id="t", attempt=1, device_id="a"), 10.0)
    assert s.devices["a"].queued_s == 0 and s.devices["a"].queue_s(11.0) == pytest.approx(1.5)
    s.apply(5, TaskRunFailed(task_id="t", attempt=1, device_id="a", error="boom"), 0)
    assert s.tasks["t"].failed_on == {"a"} and not s.devices["a"].running
    assert not s.tasks["t"].needs_placement  # the coordinator requeues it, not placement
    again = s.apply(6, TaskRequeued(task_id="t", attempt=1, device_id="a", reason="failed"), 0)
    assert again.task == "t" and s.tasks["t"].status == "requeued"
    s.apply(7, placed_event("t", "b", attempt=2), 0)
    s.apply(8, TaskRequeued(task_id="t", attempt=1, device_id="a", reason="late"), 0)
    assert s.tasks["t"].status == "placed"  # a requeue of an older attempt changes nothing
    s.apply(9, TaskFinished(task_id="t", attempt=2, device_id="b", config=A, runtime_s=1.0), 0)
    assert "t" not in s.tasks and s.ended == {"t"} and not s.devices["b"].queued
    s.apply(10, TaskSubmitted(task_id="t", workload="nbody", size=4, submitted_by="u"), 0)
    assert "t" not in s.tasks  # an ended task is not submitted again


def test_the_candidates_are_the_best_16_by_guard_finish_and_id_whatever_the_order() -> None:
    """The bounded selection gives what a full sort gives, ties and guard rejections included."""
    rng = random.Random(7)
    for _ in range(300):
        devices = []
        for i in range(rng.choice((3, 17, 60))):
            runtime = rng.choice((1.0, 2.0, rng.uniform(0.1, 9.0)))
            guard = ("far",) if rng.random() < 0.3 else ()
            d = device(f"d{i:02d}", predicted={KEY: predicted(runtime, B, *guard)})
            if rng.random() < 0.5:
                d.add_queued("x", rng.choice((1.0, rng.uniform(0.0, 4.0))))
            devices.append(d)
        rng.shuffle(devices)
        ranked = sorted(
            devices,
            key=lambda d: (
                not d.predicted[KEY].accepted,
                d.queue_s(0.0) + d.predicted[KEY].runtime_s,
                d.device_id,
            ),
        )
        got = placed(place(JOB, devices, 0.0))
        assert got.device_id == ranked[0].device_id
        assert [c.device_id for c in got.candidates] == [d.device_id for d in ranked[:16]]
        assert got.runner_up == ranked[1].device_id


# --- verified and unverified estimates ----------------------------------------------------


def test_an_unverified_claim_counts_no_faster_than_the_verified_best_less_the_spread() -> None:
    """The probe: dev-a uploads 1e-6 s; dev-b has run the job for the fleet in 0.1 s."""
    a = device("dev-a", best={KEY: measured(1e-6)})
    b = device("dev-b", best={KEY: measured(0.1)}, ran={KEY: 0.1})
    got = placed(place(JOB, [a, b], now=0.0))
    floor = 0.1 / (1 + FLEET_SPREAD)
    assert got.device_id == "dev-a" and got.verified is False
    assert got.expected_s == pytest.approx(floor) and got.claimed_s == 1e-6
    assert got.reason == (
        "dev-a: queue 0.0 s + best measured 1e-06 s (ranks=1 threads=2 tile=64) unverified, "
        "counted as 0.091 s (dev-b's verified best 0.1 s less the fleet's spread of 10 %) "
        "= 0.091 s; next dev-b 0.1 s"
    )
    first, second = got.candidates
    assert (first.verified, first.runtime_s, first.counted_s) == (False, 1e-6, pytest.approx(floor))
    assert (second.verified, second.counted_s) == (True, None)
    event = got.event(1)
    assert event.claimed_s == 1e-6 and event.verified is False


def test_claims_of_1e_6_s_do_not_take_every_task() -> None:
    """Placed one after another, the clamped claim fills dev-a's queue like any other: the
    tasks alternate instead of all going to the device that claims to be fastest."""
    s = FleetState()
    for did in ("dev-a", "dev-b"):
        s.apply(1, DeviceRegistered(device_id=did, hostname="h", fingerprint=FP), 0)
        s.devices[did].online = True
    s.apply(2, measurement("ma", "dev-a", 1e-6), 0)
    s.apply(3, measurement("mb", "dev-b", 0.1), 0)
    s.apply(4, TaskSubmitted(task_id="v", workload="nbody", size=4096, submitted_by="u"), 0)
    s.apply(5, placed_event("v", "dev-b", expected_s=0.1), 0)
    s.apply(6, TaskFinished(task_id="v", attempt=1, device_id="dev-b", config=B, runtime_s=0.1), 0)
    assert s.devices["dev-b"].ran == {KEY: 0.1} and not s.devices["dev-a"].ran
    where = []
    for i in range(10):
        task_id = f"t{i}"
        submitted = TaskSubmitted(task_id=task_id, workload="nbody", size=4096, submitted_by="u")
        s.apply(10 + 2 * i, submitted, 0)
        got = placed(place(s.tasks[task_id].spec, s.devices.values(), now=0.0))
        s.apply(11 + 2 * i, got.event(1), 0)
        where.append(got.device_id)
    assert 4 <= where.count("dev-a") <= 6, where


def test_a_verified_devices_claim_counts_no_faster_than_its_own_last_run_of_the_job() -> None:
    a = device("dev-a", best={KEY: measured(0.01)}, ran={KEY: 0.5})
    b = device("dev-b", best={KEY: measured(0.3)})
    got = placed(place(JOB, [a, b], now=0.0))
    assert got.device_id == "dev-b"
    # dev-b has not run it: its claim is held to dev-a's verified 0.45 s less the spread.
    assert got.reason == (
        "dev-b: queue 0.0 s + best measured 0.3 s (ranks=1 threads=2 tile=64) unverified, "
        "counted as 0.41 s (dev-a's verified best 0.45 s less the fleet's spread of 10 %) "
        "= 0.41 s; next dev-a 0.45 s (measured 0.01 s, counted higher)"
    )
    alone = placed(place(JOB, [a], now=0.0))
    assert alone.verified is True and alone.expected_s == pytest.approx(0.5 / 1.1)
    own = "counted as 0.45 s (its own last run of the job took 0.5 s, less the fleet's spread"
    assert own in alone.reason


def test_the_coordinators_own_device_is_trusted_and_without_one_verified_claims_stand() -> None:
    a = device("dev-a", best={KEY: measured(1e-6)})
    b = device("dev-b", best={KEY: measured(0.1)})
    got = placed(place(JOB, [a, b], now=0.0))  # nobody has run it: nothing to hold claims to
    assert got.device_id == "dev-a" and got.expected_s == 1e-6 and got.claimed_s is None
    own = device("own", best={KEY: measured(0.1)}, local=True)
    got = placed(place(JOB, [a, own], now=0.0))
    assert got.expected_s == pytest.approx(0.1 / 1.1) and "own's verified best" in got.reason
    # A claim slower than the verified best is counted as it is.
    slow = device("slow", best={KEY: measured(0.5)})
    got = placed(place(JOB, [slow, own], now=0.0))
    assert got.device_id == "own" and got.claimed_s is None
    assert got.candidates[1].verified is False and got.candidates[1].counted_s is None


def test_a_run_far_ahead_of_the_fleets_verified_runs_does_not_verify_its_device() -> None:
    """The probe's liar claimed vast hardware at its join, so the plausibility check let its
    1e-6 s through; its own task result of 1e-6 s must not make that claim verified."""
    s = FleetState()
    for did in ("liar", "dev-b"):
        s.apply(1, DeviceRegistered(device_id=did, hostname="h", fingerprint=FP), 0)
        s.devices[did].online = True
    s.apply(2, measurement("ml", "liar", 1e-6), 0)
    s.apply(3, measurement("mb", "dev-b", 0.1), 0)
    done = 10
    for task_id, did, runtime in (("v", "dev-b", 0.1), ("w", "liar", 1e-6), ("x", "liar", 0.05)):
        s.apply(
            done, TaskSubmitted(task_id=task_id, workload="nbody", size=4096, submitted_by="u"), 0
        )
        s.apply(done + 1, placed_event(task_id, did, expected_s=runtime), 0)
        finished = TaskFinished(
            task_id=task_id, attempt=1, device_id=did, config=B, runtime_s=runtime
        )
        s.apply(done + 2, finished, 0)
        done += 3
        if task_id == "w":
            assert KEY not in s.devices["liar"].ran  # 1e-6 s: 100,000 x ahead of dev-b's 0.1 s
            got = placed(place(JOB, s.devices.values(), now=0.0))
            assert got.verified is False or got.device_id == "dev-b"
            assert got.expected_s >= 0.1 / (1 + FLEET_SPREAD) - 1e-12
    assert s.devices["liar"].ran == {KEY: 0.05}  # 2 x ahead: within the fleet's range, verified
