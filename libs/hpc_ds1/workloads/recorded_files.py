"""Reading brute-forced tuning caches (pure parsing; `recorded` turns them into a device).

Two formats, plain or gzipped (`.gz`), as the FAIR auto-tuning benchmark hub
(github.com/AutoTuningAssociation/benchmark_hub) holds them:
- Kernel Tuner's cache file: `tune_params_keys` (knob order), `tune_params` (each knob's
  values, in order), optional `restrictions` (strings), `device_name`, `objective` (default
  "time"), and `cache` mapping "v1,v2,..." to records whose `time` is the mean in milliseconds
  and `times` the recorded repeats in milliseconds, or whose `time` is a failure marker
  ("InvalidConfig", "CompilationFailedConfig", "RuntimeFailedConfig").
- T4 (the FAIR vision paper's output format): `metadata.timeunit`, `schema_version` and
  `results`, each with `configuration` {name: value}, `times.runtimes` (the repeats) and
  `invalidity` ("correct", "compile", "runtime", "correctness", "timeout", "constraints"). T4
  carries no knob values: it needs the kernel's T1 file.
A T1 kernel file (the hub's `kernels/<name>.json`) gives the constraints
(`ConfigurationSpace.Conditions[].Expression`) and the knobs' defaults, and the knobs
themselves (`TuningParameters[].Values`) for T4.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import orjson

from hpc_ds1.knobs import Knob, KnobConfig, KnobKind, check_name

FAILURES = ("invalid", "compile", "runtime", "correctness", "timeout")
KERNEL_TUNER_FAILURES = {
    "InvalidConfig": "invalid",
    "CompilationFailedConfig": "compile",
    "RuntimeFailedConfig": "runtime",
}
T4_INVALIDITY = {
    "constraints": "invalid",
    "compile": "compile",
    "runtime": "runtime",
    "correctness": "correctness",
    "timeout": "timeout",
}
TIME_UNITS = {  # seconds per unit
    "seconds": 1.0,
    "s": 1.0,
    "milliseconds": 1e-3,
    "miliseconds": 1e-3,  # as the hub's T4 files spell it
    "ms": 1e-3,
    "microseconds": 1e-6,
    "us": 1e-6,
}
KERNEL_TUNER_MS = 1e-3  # Kernel Tuner records times in milliseconds

Record = tuple[float, ...] | str  # the repeats in seconds, or the failure kind


class RecordedError(ValueError):
    """A recorded file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class Parsed:
    knobs: tuple[Knob, ...]
    constraints: tuple[str, ...]
    device: str
    objective: str
    records: dict[KnobConfig, Record]
    format: str  # "kernel_tuner" or "t4"


def _refuse(path: Path | str, field: str, problem: str) -> NoReturn:
    raise RecordedError(f"{path}: {field}: {problem}")


def read_json(path: Path) -> Any:
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
    except (OSError, EOFError) as error:
        _refuse(path, "file", f"cannot be read: {error}")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass  # NaN or Infinity, which only the standard library reads
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as error:
        _refuse(path, "file", f"is not JSON: {error}")


def _knob(path: Path, field: str, name: Any, values: Any, default: Any = None) -> Knob:
    try:
        check_name(name, str(path), field, ())
    except ValueError as error:
        raise RecordedError(str(error)) from None
    if not isinstance(values, list) or not values:
        _refuse(path, field, f"{name}'s values must be a non-empty list, not {values!r}")
    if not all(isinstance(v, int | float | str) for v in values):
        _refuse(path, field, f"{name}'s values must be numbers, strings or booleans: {values!r}")
    kind: KnobKind
    if all(type(v) is bool for v in values):
        kind = "bool" if values == [False, True] else "category"
    elif all(type(v) is int for v in values):
        kind = "int" if values == sorted(values) else "ordered"
    elif all(isinstance(v, int | float) and type(v) is not bool for v in values):
        kind = "ordered"
    else:
        kind = "category"
    default = default if default in values else values[0]
    try:
        return Knob(name, kind, tuple(values), default)
    except ValueError as error:
        _refuse(path, field, str(error))


def read_kernel(path: Path) -> tuple[tuple[Knob, ...], tuple[str, ...]]:
    """The knobs and constraints of a T1 kernel file (`kernels/<name>.json`)."""
    space = read_json(path)
    space = space.get("ConfigurationSpace") if isinstance(space, dict) else None
    if not isinstance(space, dict):
        _refuse(path, "ConfigurationSpace", "missing; a T1 kernel file has one")
    params, conditions = space.get("TuningParameters"), space.get("Conditions", [])
    if not isinstance(params, list) or not isinstance(conditions, list):
        _refuse(path, "ConfigurationSpace", "needs lists TuningParameters and Conditions")
    knobs = []
    for i, p in enumerate(params):
        field = f"ConfigurationSpace.TuningParameters[{i}]"
        values = p.get("Values") if isinstance(p, dict) else None
        try:
            values = json.loads(values) if isinstance(values, str) else values
        except ValueError:
            _refuse(path, f"{field}.Values", f"{values!r} is not a JSON list")
        knobs.append(_knob(path, field, p.get("Name"), values, p.get("Default")))
    texts = []
    for i, c in enumerate(conditions):
        text = c.get("Expression") if isinstance(c, dict) else None
        if not isinstance(text, str):
            _refuse(path, f"ConfigurationSpace.Conditions[{i}].Expression", "must be a string")
        texts.append(text)
    return tuple(knobs), tuple(texts)


def _repeats(path: Path, field: str, times: Any, scale: float) -> tuple[float, ...]:
    if (
        not isinstance(times, list)
        or not times
        or not all(isinstance(t, int | float) and type(t) is not bool and t > 0 for t in times)
    ):
        _refuse(path, field, f"must be a non-empty list of positive times, not {times!r:.80}")
    return tuple(t * scale for t in times)


def _device(path: Path, name: Any) -> str:
    """The recorded device name, else the file's name (the hub's MI250X files record '')."""
    if isinstance(name, str) and name.strip():
        return name.strip()
    stem = path.name.removesuffix(".gz").removesuffix(".json")
    return stem.removesuffix("_T4")


def read_kernel_tuner(path: Path, data: Mapping[str, Any]) -> Parsed:
    keys, params = data.get("tune_params_keys"), data.get("tune_params")
    if not isinstance(params, dict) or not params:
        _refuse(path, "tune_params", "missing; a Kernel Tuner cache maps each knob to its values")
    if keys is None:
        keys = list(params)
    if not isinstance(keys, list) or sorted(map(str, keys)) != sorted(params):
        _refuse(path, "tune_params_keys", f"{keys!r} must name the tune_params {list(params)}")
    knobs = tuple(_knob(path, f"tune_params.{k}", k, params[k]) for k in keys)
    restrictions = data.get("restrictions") or []
    if not isinstance(restrictions, list) or not all(isinstance(r, str) for r in restrictions):
        _refuse(path, "restrictions", "only a list of strings is accepted (not functions)")
    objective = data.get("objective", "time")
    if objective != "time":
        _refuse(path, "objective", f"{objective!r}; accepted: 'time' (the repeats are times)")
    cache = data.get("cache")
    if not isinstance(cache, dict):
        _refuse(path, "cache", "missing; it maps 'v1,v2,...' to recorded results")
    parse = [{str(v): v for v in k.values} for k in knobs]
    records: dict[KnobConfig, Record] = {}
    for key, record in cache.items():
        parts = key.split(",")
        try:
            config = tuple(p[s] for p, s in zip(parse, parts, strict=True))
        except (KeyError, ValueError):
            _refuse(path, f"cache[{key!r}]", f"is not one value of each of {list(keys)}")
        time = record.get("time") if isinstance(record, dict) else None
        if isinstance(time, str):
            if time not in KERNEL_TUNER_FAILURES:
                _refuse(
                    path,
                    f"cache[{key!r}].time",
                    f"{time!r}; accepted: a time or one of {list(KERNEL_TUNER_FAILURES)}",
                )
            records[config] = KERNEL_TUNER_FAILURES[time]
        else:
            times = record.get("times", [time]) if isinstance(record, dict) else None
            records[config] = _repeats(path, f"cache[{key!r}].times", times, KERNEL_TUNER_MS)
    device = _device(path, data.get("device_name"))
    return Parsed(knobs, tuple(restrictions), device, objective, records, "kernel_tuner")


def read_t4(path: Path, data: Mapping[str, Any], knobs: Sequence[Knob]) -> Parsed:
    unit = (data.get("metadata") or {}).get("timeunit", "milliseconds")
    if unit not in TIME_UNITS:
        _refuse(path, "metadata.timeunit", f"{unit!r}; accepted: {', '.join(TIME_UNITS)}")
    results = data.get("results")
    if not isinstance(results, list):
        _refuse(path, "results", "missing; a T4 file lists its results")
    names = [k.name for k in knobs]
    records: dict[KnobConfig, Record] = {}
    for i, r in enumerate(results):
        field = f"results[{i}]"
        config = r.get("configuration") if isinstance(r, dict) else None
        if not isinstance(config, dict) or sorted(config) != sorted(names):
            _refuse(path, f"{field}.configuration", f"must give exactly the knobs {names}")
        invalidity = r.get("invalidity")
        if invalidity != "correct" and invalidity not in T4_INVALIDITY:
            accepted = ["correct", *T4_INVALIDITY]
            _refuse(path, f"{field}.invalidity", f"{invalidity!r}; accepted: {accepted}")
        runtimes = (r.get("times") or {}).get("runtimes")
        records[tuple(config[n] for n in names)] = (
            _repeats(path, f"{field}.times.runtimes", runtimes, TIME_UNITS[unit])
            if invalidity == "correct"
            else T4_INVALIDITY[invalidity]
        )
    return Parsed(tuple(knobs), (), _device(path, None), "time", records, "t4")


def hub_kernel_for(path: Path) -> Path | None:
    """The benchmark hub's T1 kernel file for its `cachefiles/<name>/<GPU>.json(.gz)`
    (`kernels/<name>.json` beside `cachefiles/`), if it is there."""
    candidate = path.parent.parent.parent / "kernels" / f"{path.parent.name}.json"
    return candidate if candidate.is_file() else None
