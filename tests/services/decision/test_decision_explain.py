"""What a decision answers besides its move, for the console's playground: every neighbour's
expected runtime, the familiarity guard's distance, and System 1's whole configuration, on the
real decision service (NATS, Postgres, a model trained on real tiny runs)."""

from __future__ import annotations

from hpc_ds1.stack import Stack

from .decide import GEMM, decide


async def test_the_answer_explains_itself(decider: tuple[Stack, str]) -> None:
    stack, _ = decider
    body = {"workload": "gemm", "size": 48, "config": GEMM, "telemetry": {"runtime_s": 0.002}}
    answer = await decide(stack, body, timeout=30)
    assert answer["ok"], answer
    d = answer["decision"]
    # One expected runtime per alternative (every feasible move, and STOP: the job as it is).
    assert set(d["predicted_runtimes_s"]) == set(d["alternatives"])
    assert all(v > 0 for v in d["predicted_runtimes_s"].values())
    assert d["predicted_runtime_s"] == d["predicted_runtimes_s"][d["choice"]]
    f = d["familiarity"]
    assert f["distance"] >= 0 and f["threshold"] > 0
    assert f["familiar"] is (f["distance"] <= f["threshold"])
    s1 = d["system1"]
    assert s1["predicted_runtime_s"] > 0 and 0 <= s1["confidence"] <= 1
    assert s1["mode"] in ("auto", "confirm", "escalate")
    assert s1["label"] == "ranks={ranks} threads={threads} tile={tile} gpu={gpu}".format(
        **s1["config"]
    )
    # System 1 does not depend on the configuration: another start, the same answer.
    other = {**body, "config": {**GEMM, "threads": 2}}
    again = await decide(stack, other, timeout=30)
    assert again["ok"], again
    assert again["decision"]["system1"] == s1

    # A workload outside the registry still gets a move, but no System 1 (no space to score).
    mystery = {**body, "workload": "mystery"}
    unknown = await decide(stack, mystery, timeout=30)
    assert unknown["ok"], unknown
    assert unknown["decision"]["system1"] is None
    assert unknown["decision"]["mode"] == "escalate"
