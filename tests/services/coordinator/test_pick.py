"""The coordinator's PICK, driven step by step with a scripted decision service and agent:
two misses in a row, then System 1's configuration once (its target recorded on the event and
run as it is), then the session goes on from it and ends when two more moves miss."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hpc_ds1.events import (
    Event,
    SessionFinished,
    SessionMoveDecided,
    SessionStarted,
    SessionStepRun,
)
from hpc_ds1.services.coordinator.sessions import SessionRunner
from hpc_ds1.space import STOP, Config, ConfigSpace, neighbours
from hpc_ds1.tuning.session import PICK, evolve

SPACE = ConfigSpace.for_cpus(2, (32, 64, 128))
START = Config(ranks=2, threads=2, tile=128)
BEST = Config(ranks=2, threads=2, tile=64)


def runtime(c: Config) -> float:
    """BEST is fastest; every other configuration is 30 % slower per knob changed."""
    changed = sum(getattr(c, k) != getattr(BEST, k) for k in ("ranks", "threads", "tile"))
    return 1.3**changed


class Scripted(SessionRunner):
    """The session's rules for real; the log, the decision service and the agent in memory."""

    def __init__(self, predicted_gain: float) -> None:
        settings = SimpleNamespace(auto_threshold=0.85, escalate_threshold=0.5)
        super().__init__(SimpleNamespace(settings=settings), "s", "coordinator", SPACE)  # type: ignore[arg-type]
        self.events: list[Event] = []
        self.ran: list[Config] = []
        self.predicted = {c.label(): runtime(c) for c in SPACE.configs()}
        self.predicted[BEST.label()] = runtime(START) / (1.0 + predicted_gain)

    async def append(self, event: Event) -> None:
        self.events.append(event)
        self.state = evolve(self.state, len(self.events), event)

    async def run_on_agent(self, config: Config) -> tuple[dict[str, Any], str | None]:
        self.ran.append(config)
        return {"status": "ok", "runtime_s": runtime(config), "spread": 0.01}, None

    async def ask_decision(self, config: Config, runtime_s: float) -> dict[str, Any]:
        # always away from BEST first: RANKS_DOWN, then THREADS_DOWN, each a miss
        moves = {STOP, *neighbours(config, SPACE)}
        likely = {"RANKS_DOWN": 0.95, "THREADS_DOWN": 0.9, STOP: 0.05}  # all auto
        alternatives = {m: p for m, p in likely.items() if m in moves}
        return {
            "decision_id": f"d{len(self.events)}",
            "choice": max(alternatives, key=lambda m: alternatives[m]),
            "alternatives": alternatives,
            "mode": "auto",
            "reasons": [],
            "system1": {
                "config": BEST.model_dump(),
                "confidence": 0.9,
                "mode": "auto",
                "predicted_runtimes_s": self.predicted,
            },
        }


async def drive(runner: Scripted) -> SessionFinished:
    await runner.append(
        SessionStarted(
            session_id="s", device_id="d", workload="gemm", size=1000, start=START.model_dump()
        )
    )
    for _ in range(50):
        if runner.state.status == "finished":
            break
        await runner.step()
    finished = runner.events[-1]
    assert isinstance(finished, SessionFinished)
    return finished


async def test_two_misses_run_system1_once_then_the_session_goes_on_from_it() -> None:
    runner = Scripted(predicted_gain=0.3)
    finished = await drive(runner)
    picks = [e for e in runner.events if isinstance(e, SessionMoveDecided) and e.move == PICK]
    assert len(picks) == 1 and picks[0].target == BEST.model_dump()
    assert (
        "System 1 recommends" in picks[0].reasons[0] and "2 moves in a row" in picks[0].reasons[0]
    )
    # start, two misses, the PICK (kept), two misses from BEST, and no second PICK
    assert runner.ran[3] == BEST and len(runner.ran) == 6
    assert finished.reason == "two_misses" and finished.best_config == BEST.model_dump()
    runs = [e for e in runner.events if isinstance(e, SessionStepRun)]
    assert [r.step for r in runs] == list(range(6))


async def test_below_the_gain_gate_two_misses_end_the_session_as_before() -> None:
    runner = Scripted(predicted_gain=0.02)  # predicted 2 % faster: under the 5 % gate
    finished = await drive(runner)
    assert not any(isinstance(e, SessionMoveDecided) and e.move == PICK for e in runner.events)
    assert finished.reason == "two_misses" and finished.best_config == START.model_dump()
    assert len(runner.ran) == 3
