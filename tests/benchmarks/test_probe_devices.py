"""The device probe's small mode (benchmarks/probe_devices.py --quick): issue 41's attacks by a
device credential's holder against a real `hpc-ds1 serve`. Only the safety outcomes are
asserted, those that hold whatever the machine's load: the bombs refused with the gateway's
memory within a bound, external data refused alike for an existing and a missing file that
nobody opened, 1e-6 s refused, a spent join token refused, 429s among wrong tokens and relayed
joins, the flood logged in a few lines, another device's task refused in a heartbeat, a
forwarded header ignored, no secret in serve's log. The figures are the benchmark's to print."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BOMBS = ("ConstantOfShape([2^28]) -> ReduceSum", "the same bomb inside a real model")


def test_the_probe_finds_every_defence_holding(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "probe_devices.py"), "--quick", "--json"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    probe: dict[str, Any] = json.loads(done.stdout)
    print(done.stderr)  # the report, shown with -s or on a failure

    models = {m["what"]: m for m in probe["models"]}
    assert models["legitimate model"]["status"] == 201, models["legitimate model"]
    for what in BOMBS:
        assert models[what]["status"] == 422, models[what]
        assert "ConstantOfShape" in models[what]["error"] or "inputs" in models[what]["error"]
        assert models[what]["rss_growth_mb"] < probe["rss_bound_mb"], models[what]
    heavy = models["a real model + 2 GiB no static bound sees"]
    assert heavy["status"] == 422 and "memory" in heavy["error"], heavy
    assert set(probe["models_concurrent"]["statuses"]) == {"422"}, probe["models_concurrent"]
    for model in probe["models"]:  # our words only
        assert "ONNXRuntimeError" not in str(model["error"]), model

    external = probe["external"]
    assert [a["status"] for a in external["answers"]] == [422, 422], external
    assert external["identical"] and not external["file_opened"], external
    assert "external file" in external["answers"][0]["error"]

    refused = {r["measurement_id"] for r in probe["measurements"]["deva_1e-6"]["refused"]}
    assert refused == {"m-512", "m-1024"}
    assert probe["measurements"]["deva_1e-6"]["accepted"] == 0

    cap = probe["join_cap"]
    assert cap["joined"] == probe["sizes"]["join_uses"] and cap["status"] == 401, cap
    assert "was used" in cap["error"], cap
    assert probe["forwarded_joins"]["statuses"].get("429", 0) > 0, probe["forwarded_joins"]

    wrong = probe["wrong_tokens"]
    assert wrong["status_429"] > 0 and wrong["other"] == {}, wrong
    assert wrong["status_401"] + wrong["status_429"] == wrong["sent"]
    # one line per address and minute (a flood may straddle two minutes), not one per token
    lines = wrong["auth_rejected_lines"] + wrong["request_lines_401"] + wrong["request_lines_429"]
    assert lines <= 6, wrong

    # the liar's own 1e-6 s results (its claimed hardware let them through) verify nothing
    after = probe["placement"]["after_liar_ran"]
    assert after and not any(p["device"] == "liar" and p["verified"] for p in after), after

    heartbeat = probe["heartbeat"]
    assert heartbeat["other_status"] == 403 and heartbeat["own_status"] == 204, heartbeat

    clients = probe["forwarded"]["logged_clients"]
    assert clients and "8.8.8.8" not in clients, probe["forwarded"]

    assert probe["log"]["clean"], probe["log"]
    assert probe["serve_exit"] == 0
