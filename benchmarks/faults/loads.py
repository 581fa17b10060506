"""How much work each scenario does: FULL for the benchmark, SMALL for CI."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Load:
    nats_events: int = 3000  # published per repetition while nats-server is killed
    backlog: int = 10_000  # events waiting when the projector starts
    live: int = 1000  # events published while Postgres or the projector is down
    montecarlo_size: int = 20_000_000  # the agent's job: seconds of real work under 2 ranks
    orphan_grace_s: float = 5.0  # how long a killed agent's job may take to disappear
    session_size: int = 288  # gemm size of the coordinator's tuning sessions
    # The coordinator's model: a tiny real setup at these sizes, then the trainer.
    train_sizes: tuple[tuple[str, tuple[int, ...]], ...] = (
        ("gemm", (192, 288, 384)),
        ("montecarlo", (200_000, 400_000)),
    )
    train_repeats: int = 2
    cut_events: int = 2000
    cut_down_s: float = 3.0


FULL = Load()
SMALL = Load(
    nats_events=600,
    backlog=4000,
    live=400,
    montecarlo_size=8_000_000,
    train_sizes=(("gemm", (288,)),),
    train_repeats=1,
    cut_events=400,
    cut_down_s=2.0,
)
