"""PICK, the replayed variant of section 15: System 1's configuration, once, where never run."""

from __future__ import annotations

from hpc_ds1.evaluation.policies import pick_to_offer
from hpc_ds1.space import Config

START = Config(ranks=1, threads=1, tile=32)
FAR = Config(ranks=2, threads=1, tile=128, block=4)


def test_the_pick_is_offered_once_and_only_where_the_session_never_ran_it() -> None:
    assert pick_to_offer(None, [START], False) is None  # no System 1 answer: nothing to offer
    assert pick_to_offer({"config": FAR.model_dump()}, [START], False) == FAR
    # the start was run: its pick is not offered, however it was dumped (block 0 or left out)
    assert pick_to_offer({"config": {**START.model_dump(), "block": 0}}, [START], False) is None
    assert pick_to_offer({"config": FAR.model_dump()}, [START, FAR], False) is None
    assert pick_to_offer({"config": FAR.model_dump()}, [START], True) is None  # once a session


def test_a_gain_gate_offers_the_pick_only_where_it_is_predicted_that_much_faster() -> None:
    here = Config(ranks=1, threads=2, tile=64)
    answer = {
        "config": FAR.model_dump(),
        "predicted_runtimes_s": {FAR.label(): 1.0, here.label(): 1.08},
    }
    assert pick_to_offer(answer, [START], False, here, 0.05) == FAR  # 8 % faster: offered
    assert pick_to_offer(answer, [START], False, here, 0.10) is None  # not 10 %
    assert pick_to_offer(answer, [START], False, here, None) == FAR  # no gate: as before
    # a configuration without a prediction is not judged faster or slower: nothing offered
    assert pick_to_offer(answer, [START], False, START, 0.0) is None
