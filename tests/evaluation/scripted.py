"""Scripted stand-ins for a session over the bowl (tests/evaluation/landscapes.py): deciders
that always propose the same moves (Scripted, and Walker with a recommendation), and a run
function that answers every run from the bowl (Runs). Shared by the evaluation tests and
tests/benchmarks."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hpc_ds1.model.schema import Thresholds
from hpc_ds1.runner.result import RunResult, Status
from hpc_ds1.space import STOP, Config, ConfigSpace, neighbours
from tests.evaluation.landscapes import BEST, SPACE, runtime


class Scripted:
    """A decider that always proposes the same moves, in the same order of likelihood."""

    device_id = "d"

    def __init__(self, alternatives: dict[str, float]) -> None:
        self.alternatives = alternatives

    def decide(self, state: Any, *, space: ConfigSpace, thresholds: Thresholds) -> Any:
        moves = {STOP, *neighbours(state.config, space)}
        feasible = {m: p for m, p in self.alternatives.items() if m in moves}
        choice = max(feasible, key=lambda m: feasible[m])
        return SimpleNamespace(choice=choice, alternatives=feasible, mode="auto")


class Runs:
    """A run function over the bowl: every call is a run, answered with `factor` x runtime."""

    def __init__(self, factor: dict[Config, list[float]] | None = None, fail: Config | None = None):
        self.calls: list[Config] = []
        self.factor = factor or {}
        self.fail = fail

    def __call__(self, workload: str, size: int, config: Config) -> RunResult:
        self.calls.append(config)
        if config == self.fail:
            return RunResult(workload=workload, size=size, config=config, status=Status.FAILED)
        scale = self.factor.get(config, [1.0])
        t = runtime(config) * scale[min(self.calls.count(config), len(scale)) - 1]
        return RunResult(
            workload=workload,
            size=size,
            config=config,
            status=Status.OK,
            runtime_s=t,
            runtimes_s=(t, t, t),
            spread=0.01,
            repeats=3,
        )


class Walker(Scripted):
    """Scripted moves, a recommendation, and the states it was asked from."""

    def __init__(self, alternatives: dict[str, float], recommended: Config = BEST) -> None:
        super().__init__(alternatives)
        self.recommended = recommended
        self.asked: list[Any] = []

    def decide(self, state: Any, *, space: ConfigSpace, thresholds: Thresholds) -> Any:
        self.asked.append(state)
        return super().decide(state, space=space, thresholds=thresholds)

    def space_for(self, workload: str) -> ConfigSpace:
        return SPACE

    def recommend(self, workload: str, size: int, **_: Any) -> Any:
        alternatives = {c.label(): runtime(c) for c in SPACE.configs()}
        return SimpleNamespace(
            config=self.recommended, confidence=0.9, mode="auto", alternatives=alternatives
        )
