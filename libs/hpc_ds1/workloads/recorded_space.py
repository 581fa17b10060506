"""Recorded landscapes as devices: a brute-forced tuning cache replayed like a machine.

`RecordedSpace.load(path, kernel=None)` reads a Kernel Tuner cache or a T4 file (plain or
`.gz`; `recorded_files` says the fields) into a `KnobSpace` (knobs in the file's order, values
in its order; constraints from the cache's string `restrictions` and, given `kernel`, the T1
kernel file's `Conditions`, all through `knobs.parse_constraint`), the device name, the
objective and, per recorded configuration, its repeats in seconds (Kernel Tuner records
milliseconds; T4 states its `timeunit`) or its failure kind (`recorded_files.FAILURES`).
`RecordedDevice(space, seed).run(config)` draws one of the recorded repeats uniformly with its
own `random.Random(seed)`, so the noise is the real noise; a recorded failure fails the same
way; a configuration that was not recorded raises `NotRecorded`. Nothing is interpolated.

Load time (the hub's dedispersion_milo/A100.json.gz, 3.1 MB gzipped, 11,130 configurations
of 8 knobs with 32 repeats each; `time.process_time` around `RecordedSpace.load`, best of 3,
on the 2-CPU development machine beside a CI run, Python 3.11): 0.23 s of CPU time (0.23-0.26 s
over 3 loads; its T4 twin 0.26-0.28 s); then `outside()` and `unrecorded()`, which enumerate
the constrained space, 0.045 s together. All 24 hub files of the two kernels load in at most
0.3 s each, and their constraints give exactly the recorded set.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from pathlib import Path

from hpc_ds1.knobs import Knob, KnobConfig, KnobError, KnobSpace, Value

from .recorded_files import (
    FAILURES,
    Parsed,
    Record,
    RecordedError,
    read_json,
    read_kernel,
    read_kernel_tuner,
    read_t4,
)

__all__ = [
    "FAILURES",
    "NotRecorded",
    "Recorded",
    "RecordedDevice",
    "RecordedError",
    "RecordedSpace",
]


class NotRecorded(KeyError):
    """A configuration the file does not hold: a replay never makes a result up."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Recorded:
    """One replayed run: `seconds` (one recorded repeat) or `failure` (its kind)."""

    config: KnobConfig
    seconds: float | None
    failure: str | None = None
    repeat: int | None = None  # which recorded repeat was drawn

    @property
    def ok(self) -> bool:
        return self.failure is None


@dataclass(frozen=True)
class RecordedSpace:
    """A recorded landscape: its space, device, objective and records (see the module)."""

    path: str
    space: KnobSpace
    device: str
    objective: str
    format: str
    records: dict[KnobConfig, Record]

    @classmethod
    def load(cls, path: str | Path, kernel: str | Path | None = None) -> RecordedSpace:
        path = Path(path)
        data = read_json(path)
        if not isinstance(data, dict):
            raise RecordedError(f"{path}: file: a JSON object is accepted, not {type(data)}")
        conditions: tuple[str, ...] = ()
        kernel_knobs: tuple[Knob, ...] = ()
        if kernel is not None:
            kernel_knobs, conditions = read_kernel(Path(kernel))
        if "cache" in data:
            parsed = read_kernel_tuner(path, data)
        elif "results" in data:
            if kernel is None:
                raise RecordedError(f"{path}: kernel: a T4 file needs its T1 kernel file")
            parsed = read_t4(path, data, kernel_knobs)
        else:
            raise RecordedError(
                f"{path}: cache/results: neither found; accepted: a Kernel Tuner cache "
                "(with 'cache') or a T4 file (with 'results')"
            )
        if kernel is not None and parsed.format == "kernel_tuner":
            parsed = _with_defaults(parsed, kernel_knobs)
        try:
            space = KnobSpace(
                parsed.knobs, (*parsed.constraints, *conditions), source=str(kernel or path)
            )
        except KnobError as error:
            raise RecordedError(str(error)) from None
        _check_values(path, parsed)
        return cls(str(path), space, parsed.device, parsed.objective, parsed.format, parsed.records)

    @property
    def count(self) -> int:
        """Recorded configurations, failures included."""
        return len(self.records)

    def configs(self) -> tuple[KnobConfig, ...]:
        """The recorded configurations, in the file's order."""
        return tuple(self.records)

    def failures(self) -> dict[KnobConfig, str]:
        return {c: r for c, r in self.records.items() if isinstance(r, str)}

    def outside(self) -> tuple[KnobConfig, ...]:
        """Recorded configurations that ran (not recorded invalid) but the constraints refuse:
        empty when the constraints describe what was measured."""
        return tuple(
            c for c, r in self.records.items() if r != "invalid" and not self.space.contains(c)
        )

    def unrecorded(self) -> tuple[KnobConfig, ...]:
        """Valid configurations of the space the file does not hold."""
        return tuple(c for c in self.space.configs() if c not in self.records)

    def mean(self, config: KnobConfig) -> float | None:
        record = self.records[config]
        return None if isinstance(record, str) else statistics.fmean(record)

    def optimum(self) -> tuple[KnobConfig, float]:
        """The configuration with the lowest mean over its repeats, and that mean (seconds).
        The mean, because it is what a draw gives in expectation and what Kernel Tuner
        records as `time` and scores in its simulation mode (the yardstick's reference)."""
        best = min(
            ((statistics.fmean(r), c) for c, r in self.records.items() if not isinstance(r, str)),
            default=None,
        )
        if best is None:
            raise RecordedError(f"{self.path}: cache: every recorded configuration failed")
        return best[1], best[0]

    def label(self, config: KnobConfig) -> str:
        try:
            return self.space.label(config)
        except ValueError:
            return repr(config)


def _with_defaults(parsed: Parsed, kernel_knobs: tuple[Knob, ...]) -> Parsed:
    """The cache's knobs with the T1 file's defaults where they are among the cache's values."""
    defaults = {k.name: k.default for k in kernel_knobs}
    knobs = tuple(
        Knob(k.name, k.kind, k.values, defaults[k.name])
        if k.name in defaults and defaults[k.name] in k.values
        else k
        for k in parsed.knobs
    )
    return Parsed(
        knobs, parsed.constraints, parsed.device, parsed.objective, parsed.records, parsed.format
    )


def _check_values(path: Path, parsed: Parsed) -> None:
    accepted = [{(type(v) is bool, v) for v in k.values} for k in parsed.knobs]
    for config in parsed.records:
        for knob, keys, value in zip(parsed.knobs, accepted, config, strict=True):
            if (type(value) is bool, value) not in keys:
                raise RecordedError(
                    f"{path}: configuration {config!r}: {knob.name}={value!r} is not one of "
                    f"{list(knob.values)}"
                )


class RecordedDevice:
    """A recorded GPU replayed as a machine (see the module): `run` draws a recorded repeat."""

    def __init__(self, recorded: RecordedSpace, seed: int = 0) -> None:
        self.recorded, self.random = recorded, random.Random(seed)

    @property
    def device(self) -> str:
        return self.recorded.device

    def run(self, config: KnobConfig | dict[str, Value]) -> Recorded:
        if isinstance(config, dict):
            config = self.recorded.space.config(config)
        record = self.recorded.records.get(config)
        if record is None:
            valid = self.recorded.space.contains(config)
            raise NotRecorded(
                f"{self.recorded.path}: {self.recorded.label(config)} was not recorded"
                + ("" if valid else f" ({self.recorded.space.problem(config)})")
                + "; a replay runs only recorded configurations"
            )
        if isinstance(record, str):
            return Recorded(config, None, record)
        i = self.random.randrange(len(record))
        return Recorded(config, record[i], None, i)
