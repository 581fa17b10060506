"""The Python API like the CLI: decisions of `hpc_ds1.load()` reach a served home's log and audit
trail (a warning, once, when none serves it), the hardware guard checks the machine it runs on,
`observe()` uses the home it was loaded from, and the public names are exported."""

from __future__ import annotations

import getpass
import time
import warnings
from pathlib import Path

import httpx
import pytest

import hpc_ds1
from hpc_ds1.decision_log import DecisionNotLogged
from hpc_ds1.infra.ports import free_port
from hpc_ds1.machine.hardware import fingerprint
from hpc_ds1.model import State
from hpc_ds1.space import Config
from tests.support.serving import cli_headers, start_serve, stop, wait_ready
from tests.support.trained import home_with_model

STATE = State(workload="gemm", size=64, config=Config(ranks=1, threads=1, tile=64), runtime_s=0.01)


def test_without_a_server_the_decision_is_returned_and_a_warning_says_so_once(
    tmp_path: Path,
) -> None:
    home_with_model(tmp_path, fingerprint())
    model = hpc_ds1.load(tmp_path)
    with pytest.warns(DecisionNotLogged, match="not logged"):
        first = model.decide(STATE)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        second = model.decide(STATE)
    assert not [w for w in caught if issubclass(w.category, DecisionNotLogged)]
    assert first.decision_id is None and second.choice == first.choice
    quiet = hpc_ds1.load(tmp_path, log_decisions=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet.decide(STATE)


def test_a_model_copied_from_another_machine_is_flagged_by_its_guard(tmp_path: Path) -> None:
    here = fingerprint()
    elsewhere = here.model_copy(
        update={"device_id": "0123456789abcdef", "cpu_model": "Other CPU 9000", "logical_cpus": 64}
    )
    home_with_model(tmp_path, elsewhere)
    model = hpc_ds1.load(tmp_path, log_decisions=False)
    decision = model.decide(STATE)
    assert decision.mode == "escalate"
    assert any("differs from the one the model was trained on" in r for r in decision.reasons)
    assert any("Other CPU 9000" in r for r in decision.reasons)
    recommendation = model.recommend("gemm", 64)
    assert recommendation.mode == "escalate"
    # The space is this machine's allocation, not the 64 CPUs of the training machine.
    assert recommendation.config.threads <= here.cpus
    # Built from bytes alone, the model knows no host: the guard has nothing to compare.
    bare = hpc_ds1.Model.from_onnx((tmp_path / "models" / "latest.onnx").read_bytes())
    assert not any("differs" in r for r in bare.decide(STATE).reasons)


def test_observe_uses_the_home_the_model_was_loaded_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hpc_ds1.machine.devicelock as devicelock

    home_with_model(tmp_path / "mine", fingerprint())
    model = hpc_ds1.load(tmp_path / "mine", log_decisions=False)
    locked: list[Path] = []

    class Stop(Exception):
        pass

    def fake_lock(home: Path, *args: object, **kwargs: object) -> None:
        locked.append(home)
        raise Stop

    monkeypatch.setattr(devicelock, "device_lock", fake_lock)
    monkeypatch.setenv("HPC_DS1_HOME", str(tmp_path / "other"))
    with pytest.raises(Stop):
        model.observe("gemm", 64, {"ranks": 1, "threads": 1})
    assert locked == [tmp_path / "mine"]


def test_the_public_names_are_exported_with_docstrings() -> None:
    for name in ("Model", "State", "Decision", "Config", "Recommendation", "load"):
        assert name in hpc_ds1.__all__
        assert (getattr(hpc_ds1, name).__doc__ or "").strip(), name
    assert hpc_ds1.Config is Config and hpc_ds1.State is State
    with pytest.raises(AttributeError):
        _ = hpc_ds1.NoSuchThing  # type: ignore[attr-defined]
    assert (Path(hpc_ds1.__file__).parent / "py.typed").exists()


def test_decisions_reach_the_log_and_audit_trail_of_a_served_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home_with_model(home, fingerprint())
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start_serve(home, port)
    try:
        wait_ready(url, process, timeout=300)  # a loaded machine starts it slowly
        model = hpc_ds1.load(home)
        with warnings.catch_warnings():
            warnings.simplefilter("error", DecisionNotLogged)
            decision = model.decide(STATE)
        assert decision.decision_id
        headers = cli_headers(home)
        found: list[dict] = []
        for _ in range(100):
            reply = httpx.get(f"{url}/v1/events", params={"type": "decision.made"}, headers=headers)
            found = [
                e for e in reply.json()["events"]
                if e["data"]["decision_id"] == decision.decision_id
            ]  # fmt: skip
            if found:
                break
            time.sleep(0.1)
        assert found, "the decision never reached the log"
        event = found[0]
        assert event["data"]["source"] == "python" and event["actor"] == getpass.getuser()
        assert event["data"]["choice"] == decision.choice
        assert event["data"]["device_id"] == fingerprint().device_id
        model.decide(STATE)  # the connection is kept and used again
    finally:
        stop(process)
    audit = (home / "audit.jsonl").read_text()
    assert decision.decision_id in audit
    # The server gone, the next decision is returned all the same, with the warning.
    with pytest.warns(DecisionNotLogged, match="no `hpc-ds1 serve` runs"):
        assert model.decide(STATE).decision_id is None
