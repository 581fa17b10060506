"""`hpc-ds1 tune --warm-from` through the product (issue 42, item 5): the A100 cut is set up on
this home (a sibling GPU the fleet measured); a session of the A6000 cut, never measured here,
starts warm from it: session.started records the sibling and the plan, the start is the top of
the A100's consensus, and the plan's next configuration is the first move (WARM). A --warm-from
name the fleet does not know is refused, saying what is accepted."""

from __future__ import annotations

import json
import subprocess

from hpc_ds1.settings import Settings
from hpc_ds1.tuning.session import WARM
from tests.support.commands import run_hpc
from tests.support.recorded import write_recorded


def test_a_session_of_an_unmeasured_gpu_starts_warm_from_its_sibling(settings: Settings) -> None:
    write_recorded(settings.home, "conv-a100", "A100")
    write_recorded(settings.home, "conv-a6000", "A6000")

    def hpc(*args: str) -> subprocess.CompletedProcess[str]:
        return run_hpc(settings, *args, env={"HPC_DS1_REPLAY_SEED": "5"})

    setup = hpc("setup", "--workload", "conv-a100")
    assert setup.returncode == 0, setup.stdout + setup.stderr

    unknown = hpc("tune", "--workload", "conv-a6000", "--size", "1",
                  "--warm-from", "conv-h100", "--no-wait")  # fmt: skip
    assert unknown.returncode == 2, unknown.stdout + unknown.stderr
    assert "'conv-h100': neither a device of this fleet nor a workload" in unknown.stderr
    assert "a measured workload (conv-a100)" in unknown.stderr

    tuned = hpc("tune", "--workload", "conv-a6000", "--size", "1",
                "--warm-from", "conv-a100", "--no-wait", "--json")  # fmt: skip
    assert tuned.returncode == 0, tuned.stdout + tuned.stderr
    events = json.loads(tuned.stdout[tuned.stdout.index("{") :])["events"]
    started = next(e["data"] for e in events if e["type"] == "started")
    warm = started["warm"]
    assert warm["reason"] == "unmeasured"
    assert [(w["workload"], w["size"], w["runs"]) for w in warm["siblings"]] == [
        ("conv-a100", 1, 36)
    ]
    assert started["start"] == warm["plan"][0] and len(warm["plan"]) == 4
    baseline = next(e["data"] for e in events if e["type"] == "step_run")
    assert baseline["step"] == 0 and baseline["config"] == warm["plan"][0]
    first_move = next(e["data"] for e in events if e["type"] == "move_decided")
    assert first_move["move"] == WARM and first_move["target"] == warm["plan"][1]
