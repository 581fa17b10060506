"""A user's application as a workload, declared in a TOML file (docs/plugins.md):

    [workload]
    name = "heat"
    command = "./heat --n {size} --block {block}"
    launcher = "mpi"                        # mpiexec -n {ranks} <command>; "none": its own
    env = { OMP_NUM_THREADS = "{threads}" } # the default
    sizes = [256, 512, 1024]
    held_out = [384, 768]
    [knobs.block]                           # any number of knobs (hpc_ds1.knobs)
    values = [16, 32, 64]
    default = 32
    [check]                                 # exit_code = true | regex = "..." | command = "..."
    regex = "residual=([0-9.eE+-]+)"
    max_error = 1e-6
    [runtime]                               # one of wall = true (the default) | regex = "..."
    regex = "time=([0-9.eE+-]+)"

`timeout` (seconds, or "10m") and `repeats` in [workload] are its runs' own (runner.run_timeout,
run_repeats). A knob's table may give it a role: `launcher = "bind"` (the launcher's rank
binding) or `env = "OMP_PROC_BIND"` (the variable it sets).

A file may declare any number of knobs: integer lists or ranges (`range = [1, 64], scale =
"pow2"`), ordered values, categories and booleans, and `constraints` between them, ranks and
threads in [workload] (`constraints = ["p * q == ranks"]`, Kernel Tuner's `restrictions`; the
constants cpus, gpus and workers may be read). Each knob is a placeholder of the command and
env, and a configuration's `knobs`. One integer knob without constraints is, as before knobs
were a workload's own, the space's tile dimension under the knob's name (TILE_UP/TILE_DOWN).

Every error names the file, the field, what was wrong and what is accepted."""

from __future__ import annotations

import itertools
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpc_ds1.knobs import SPEC_KEYS, Knob, KnobError, parse_knobs
from hpc_ds1.requests import WORKLOAD_NAME_PATTERN
from hpc_ds1.workloads.base import Work, check_knobs
from hpc_ds1.workloads.command import (
    DEFAULT_ENV,
    CheckSpec,
    CommandWorkload,
    RuntimeSpec,
    _no_memory,
    _no_prepare,
    check_template,
    template_fields,
)
from hpc_ds1.workloads.recorded import RecordedWorkload, recorded_workload
from hpc_ds1.workloads.recorded_space import RecordedError

NAME = re.compile(WORKLOAD_NAME_PATTERN)  # as requests.WorkloadName accepts
KNOB_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
BASE_PLACEHOLDERS = ("ranks", "threads", "size", "python", "mpiexec")
CHECK_PLACEHOLDERS = ("output",)  # the check command's: a file holding the run's output
SECTIONS = {"workload": True, "knobs": False, "check": True, "runtime": False, "work": False}
WORKLOAD_KEYS = (
    "name", "description", "command", "launcher", "env", "sizes", "held_out", "warmup", "workdir",
    "constraints", "inputs", "output", "package", "timeout", "repeats",
)  # fmt: skip
LAUNCHERS = ("mpi", "openmpi", "none")
# A knob's role beyond a placeholder (issue 44, item 3), a key of its table:
#   launcher = "bind"   the launcher's rank binding: Open MPI's --bind-to, MPICH Hydra's
#                       -bind-to, srun's --cpu-bind (runner/launch.py binding_words)
#   env = "VAR"         sets the variable VAR of the run's environment (OMP_PROC_BIND,
#                       OMP_PLACES, ...), as env = { VAR = "{knob}" } would
# A knob named bind_to is the launcher's binding without saying so (as it was first written).
BIND_KNOB = "bind_to"
ROLE_KEYS = ("launcher", "env")
LAUNCHER_ROLES = ("bind",)
BIND_VALUES = ("none", "core", "socket", "hwthread", "numa")  # every launcher's words for them
FILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")  # an input or output file
RECORDED_KEYS = ("name", "description", "recorded", "kernel")
# `timeout`: seconds, or a duration with its unit ("90s", "10m", "1.5h"); at most a week, as
# HPC_DS1_MAX_RUN_S. `repeats`: at most 50, as a run request's.
DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*(s|m|min|h)\s*$")
DURATION_UNITS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
MAX_TIMEOUT_S = 7 * 86400.0
MAX_REPEATS = 50


class WorkloadFileError(ValueError):
    """A workload file that cannot be used; the message names the file and the field."""


class _Where:
    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, field: str, problem: str) -> WorkloadFileError:
        return WorkloadFileError(f"{self.path}: {field}: {problem}")


def _table(where: _Where, data: Mapping[str, Any], key: str, accepted: tuple[str, ...]) -> Any:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise where.fail(f"[{key}]", f"must be a table, not {type(value).__name__}")
    unknown = sorted(set(value) - set(accepted))
    if unknown:
        raise where.fail(f"[{key}]", f"unknown key(s) {unknown}; accepted: {', '.join(accepted)}")
    return value


def _string(where: _Where, table: Mapping[str, Any], field: str, key: str, default: Any) -> Any:
    value = table.get(key, default)
    if value is not default and not isinstance(value, str):
        raise where.fail(f"{field}.{key}", f"must be a string, not {value!r}")
    return value


def _sizes(where: _Where, field: str, value: Any, required: bool) -> tuple[int, ...]:
    if value is None and not required:
        return ()
    if (
        not isinstance(value, list)
        or (required and not value)
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        need = "a non-empty" if required else "a"
        raise where.fail(field, f"must be {need} list of positive integers, not {value!r}")
    if any(b <= a for a, b in itertools.pairwise(value)):
        raise where.fail(field, f"sizes must be strictly increasing, not {value}")
    return tuple(value)


def _knobs(
    where: _Where, data: Mapping[str, Any], constraints: Any
) -> tuple[tuple[Knob, ...], tuple[str, ...]]:
    """The workload's own knobs and constraints (hpc_ds1.knobs), checked together."""
    table = data.get("knobs", {})
    if not isinstance(table, dict):
        raise where.fail("[knobs]", "must be a table of knobs, e.g. [knobs.block]")
    if constraints is None:
        constraints = []
    if not isinstance(constraints, list) or not all(isinstance(c, str) for c in constraints):
        raise where.fail(
            "[workload] constraints",
            f'must be a list of expressions, e.g. ["p * q == ranks"], not {constraints!r}',
        )
    if constraints and not table:
        raise where.fail("[workload] constraints", "constrain knobs: declare them under [knobs]")
    reserved = (*BASE_PLACEHOLDERS, *CHECK_PLACEHOLDERS, "tile", "gpu")
    # the roles are this file's, not the knob's kind: taken off before the knobs are parsed
    for name, spec in table.items():
        unknown = sorted(set(spec) - {*SPEC_KEYS, *ROLE_KEYS}) if isinstance(spec, dict) else []
        if unknown:
            raise where.fail(
                f"[knobs.{name}]",
                f"unknown key(s) {unknown}; accepted: {', '.join((*SPEC_KEYS, *ROLE_KEYS))}",
            )
    table = {
        name: {k: v for k, v in spec.items() if k not in ROLE_KEYS}
        if isinstance(spec, dict)
        else spec
        for name, spec in table.items()
    }
    try:
        knobs = tuple(parse_knobs(table, str(where.path), reserved))
        check_knobs(knobs, tuple(constraints), str(where.path))
    except KnobError as error:
        raise WorkloadFileError(_in_workload_words(str(error))) from None
    return knobs, tuple(constraints)


def _in_workload_words(message: str) -> str:
    """A knob error in this file's field names: `[knobs.x]` and `[workload] constraints[i]`."""
    message = re.sub(r": knobs\.([A-Za-z0-9_]+)\.?", r": [knobs.\1] ", message, count=1)
    message = message.replace("] : ", "]: ")
    return re.sub(r": constraints\[", ": [workload] constraints[", message, count=1)


def _roles(
    where: _Where,
    data: Mapping[str, Any],
    knobs: tuple[Knob, ...],
    launcher: str,
    env: tuple[tuple[str, str], ...],
) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The knob that is the launcher's rank binding ("" if none) and the env entries the knobs
    set (`env = "VAR"`), checked: the binding only under a launcher that binds ("mpi",
    "openmpi"), with values it accepts; a variable set once."""
    table = data.get("knobs", {})
    by_name = {k.name: k for k in knobs}
    bind = ""
    out: list[tuple[str, str]] = []
    given = {name for name, _ in env}
    for name, spec in table.items():
        if not isinstance(spec, dict):
            continue
        field = f"[knobs.{name}]"
        role = spec.get("launcher")
        if role is not None:
            if role not in LAUNCHER_ROLES:
                raise where.fail(
                    f"{field} launcher",
                    f'{role!r}; accepted: "bind" (the knob is the launcher\'s rank binding: '
                    "Open MPI's --bind-to, MPICH's -bind-to, srun's --cpu-bind)",
                )
            if bind:
                raise where.fail(
                    f"{field} launcher",
                    f"[knobs.{bind}] is the launcher's binding already; one knob may be",
                )
            bind = name
        variable = spec.get("env")
        if variable is not None:
            if (
                not isinstance(variable, str)
                or not ENV_NAME.match(variable)
                or (variable.upper().startswith("HPC_DS1_"))
            ):
                raise where.fail(
                    f"{field} env",
                    f"{variable!r}; accepted: the name of the variable this knob sets, e.g. "
                    "\"OMP_PROC_BIND\" (letters, digits and '_', not HPC_DS1_*)",
                )
            if variable in given:
                raise where.fail(
                    f"{field} env",
                    f"{variable} is set already (by [workload] env or another knob): set it once",
                )
            given.add(variable)
            out.append((variable, "{" + name + "}"))
    if not bind and BIND_KNOB in by_name and launcher in ("mpi", "openmpi"):
        bind = BIND_KNOB
    if bind:
        if launcher not in ("mpi", "openmpi"):
            raise where.fail(
                f"[knobs.{bind}] launcher",
                f'launcher "{launcher}" binds no ranks: the command launches itself, so '
                f'use {{{bind}}} in it instead; accepted with launcher "mpi" or "openmpi"',
            )
        knob = by_name[bind]
        wrong = [v for v in knob.values if v not in BIND_VALUES]
        if wrong:
            raise where.fail(
                f"[knobs.{bind}] values",
                f"{wrong} cannot be a rank binding; accepted: "
                + ", ".join(f'"{v}"' for v in BIND_VALUES),
            )
    return bind, tuple(out)


def _as_tile(knobs: tuple[Knob, ...], constraints: tuple[str, ...]) -> Knob | None:
    """The one knob a file gave before workloads had knobs of their own: one int knob of
    positive values, no constraints. It stays the space's tile dimension (TILE_UP/TILE_DOWN),
    so a home's records and models of it keep their meaning."""
    if len(knobs) != 1 or constraints:
        return None
    (knob,) = knobs
    ok = knob.kind == "int" and all(int(v) > 0 for v in knob.values)  # type: ignore[arg-type]
    return knob if ok else None


def _regex(where: _Where, field: str, pattern: Any, groups: tuple[int, ...]) -> str:
    if not isinstance(pattern, str) or not pattern:
        raise where.fail(field, f"must be a non-empty regular expression string, not {pattern!r}")
    try:
        compiled = re.compile(pattern)
    except re.error as error:
        raise where.fail(field, f"{pattern!r} is not a valid regular expression: {error}") from None
    if compiled.groups not in groups:
        accepted = " or ".join(str(g) for g in groups)
        raise where.fail(
            field, f"{pattern!r} has {compiled.groups} capture group(s); accepted: {accepted}"
        )
    return pattern


def _one_of(where: _Where, section: str, table: Mapping[str, Any], kinds: tuple[str, ...]) -> str:
    given = [k for k in kinds if k in table]
    if len(given) != 1:
        raise where.fail(
            f"[{section}]",
            f"give exactly one of {' | '.join(kinds)}"
            + (f"; it gives {', '.join(given)}" if given else ""),
        )
    return given[0]


def _check(where: _Where, data: Mapping[str, Any], placeholders: tuple[str, ...]) -> CheckSpec:
    if "check" not in data:
        raise where.fail(
            "[check]",
            'missing: say how a run\'s answer is checked: exit_code = true, regex = "..." '
            '(optionally with max_error), or command = "..."',
        )
    table = _table(where, data, "check", ("exit_code", "regex", "max_error", "command"))
    kind = _one_of(where, "check", table, ("exit_code", "regex", "command"))
    if "max_error" in table and kind != "regex":
        raise where.fail("[check] max_error", "is accepted only with regex")
    if kind == "exit_code":
        if table["exit_code"] is not True:
            raise where.fail("[check] exit_code", "accepted: true (a non-zero exit always fails)")
        return CheckSpec("exit_code")
    if kind == "command":
        command = _string(where, table, "[check]", "command", None)
        accepted = (*placeholders, *CHECK_PLACEHOLDERS)
        try:
            check_template(command, accepted)
        except ValueError as error:
            raise where.fail("[check] command", str(error)) from None
        return CheckSpec("command", command=command)
    pattern = _regex(where, "[check] regex", table["regex"], (0, 1))
    limit = table.get("max_error")
    if re.compile(pattern).groups == 1:
        if isinstance(limit, bool) or not isinstance(limit, int | float) or not limit >= 0:
            raise where.fail(
                "[check] max_error",
                f"a regex with a capture group reads an error: give max_error, a number >= 0 "
                f"(every match must be at most it), not {limit!r}",
            )
        return CheckSpec("regex", pattern=pattern, max_error=float(limit))
    if limit is not None:
        raise where.fail(
            "[check] max_error", "needs a regex with one capture group (the error to compare)"
        )
    return CheckSpec("regex", pattern=pattern)


def _runtime(where: _Where, data: Mapping[str, Any]) -> RuntimeSpec:
    if "runtime" not in data:
        return RuntimeSpec("wall")
    table = _table(where, data, "runtime", ("wall", "regex", "combine"))
    kind = _one_of(where, "runtime", table, ("wall", "regex"))
    combine = table.get("combine", "max")
    if combine not in ("max", "last"):
        raise where.fail(
            "[runtime] combine", f"{combine!r}; accepted: max (the slowest rank's), last"
        )
    if kind == "wall":
        if table["wall"] is not True:
            raise where.fail("[runtime] wall", "accepted: true")
        if "combine" in table:
            raise where.fail("[runtime] combine", "is accepted only with regex")
        return RuntimeSpec("wall")
    return RuntimeSpec("regex", _regex(where, "[runtime] regex", table["regex"], (1,)), combine)


def _power_law(where: _Where, field: str, value: Any) -> tuple[float, float]:
    if (
        not isinstance(value, dict)
        or set(value) != {"scale", "power"}
        or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value.values())
        or value["scale"] < 0
    ):
        raise where.fail(
            field,
            f"must be {{ scale = <number >= 0>, power = <number> }} (scale x size^power), "
            f"not {value!r}",
        )
    return float(value["scale"]), float(value["power"])


def _work(where: _Where, data: Mapping[str, Any]) -> tuple[Callable[[int], Work], str]:
    table = _table(where, data, "work", ("flops", "bytes", "memory"))
    laws = {k: _power_law(where, f"[work] {k}", v) for k, v in table.items()}

    def amount(key: str, size: int) -> float:
        scale, power = laws.get(key, (0.0, 0.0))
        return scale * float(size) ** power

    def work(size: int) -> Work:
        return Work(
            flops=amount("flops", size),
            bytes_moved=amount("bytes", size),
            memory_bytes=int(amount("memory", size)),
            items=float(size),
        )

    unit = "GB/s" if "bytes" in laws and "flops" not in laws else "GFLOP/s"
    return work, unit


def _timeout(where: _Where, value: Any) -> float | None:
    """The longest one run of the command may take (seconds), or None when not declared."""
    if value is None:
        return None
    seconds: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (found := DURATION.match(value)):
        seconds = float(found.group(1)) * DURATION_UNITS[found.group(2)]
    if seconds is None or not 0 < seconds <= MAX_TIMEOUT_S:
        raise where.fail(
            "[workload] timeout",
            f"{value!r}; accepted: the longest one run may take, in seconds (e.g. 600) or with "
            f'a unit ("90s", "10m", "1.5h"), more than 0 and at most {MAX_TIMEOUT_S:g} s (a week)',
        )
    return seconds


def _repeats(where: _Where, value: Any) -> int | None:
    """The timed runs of a measurement, or None when not declared."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REPEATS:
        raise where.fail(
            "[workload] repeats",
            f"{value!r}; accepted: a whole number of timed runs per measurement, 1 to "
            f"{MAX_REPEATS} (1 for a run of minutes)",
        )
    return value


def _env(where: _Where, table: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    env = table.get("env")
    if env is None:
        return DEFAULT_ENV
    if not isinstance(env, dict):
        raise where.fail("[workload] env", f"must be a table of strings, not {env!r}")
    out = []
    for name, value in env.items():
        if not ENV_NAME.match(name) or name.upper().startswith("HPC_DS1_"):
            raise where.fail(
                f"[workload] env.{name}",
                "a variable name is letters, digits and '_', not starting with a digit, and "
                "not HPC_DS1_* (this service's own settings)",
            )
        if not isinstance(value, str | int) or isinstance(value, bool):
            raise where.fail(f"[workload] env.{name}", f"must be a string, not {value!r}")
        out.append((name, str(value)))
    return tuple(out)


def _templates(
    where: _Where, command: str, env: tuple[tuple[str, str], ...], accepted: tuple[str, ...]
) -> set[str]:
    """Every placeholder the command and env use (ValueError on an unknown one)."""
    try:
        check_template(command, accepted)
    except ValueError as error:
        raise where.fail("[workload] command", str(error)) from None
    used = {name for name, _, _ in template_fields(command)}
    for name, value in env:
        try:
            fields = template_fields(value)
        except ValueError as error:
            raise where.fail(f"[workload] env.{name}", f"malformed template: {error}") from None
        unknown = sorted({f for f, _, _ in fields} - set(accepted))
        if unknown or any(s or c for _, s, c in fields):
            raise where.fail(
                f"[workload] env.{name}",
                f"{value!r}: unknown or formatted placeholder(s) {unknown}; accepted: "
                + ", ".join("{" + p + "}" for p in accepted),
            )
        used |= {f for f, _, _ in fields}
    return used


def _inputs(
    where: _Where, value: Any, path: Path, accepted: tuple[str, ...]
) -> tuple[tuple[str, str], ...]:
    """The input files: a table of a name in the run's folder to a template file, relative to
    this file, whose placeholders are the command's."""
    if value is None:
        return ()
    if not isinstance(value, dict) or not value:
        raise where.fail(
            "[workload] inputs",
            f'must be a table of file name = template file, e.g. {{ "hpccinf.txt" = '
            f'"hpcc/hpccinf.txt" }}, not {value!r}',
        )
    out = []
    for name, template in value.items():
        field = f"[workload] inputs.{name}"
        if not FILE_NAME.match(name):
            raise where.fail(field, "a file name in the run's folder: letters, digits, _ . -")
        if not isinstance(template, str) or not template:
            raise where.fail(field, f"must be the template file's path, not {template!r}")
        found = (path.parent / template).expanduser()
        try:
            text = found.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise where.fail(field, f"cannot read the template {found}: {error}") from None
        try:
            check_template(text, accepted)
        except ValueError as error:
            raise where.fail(field, f"{found}: {error}") from None
        out.append((name, text))
    return tuple(out)


def parse_workload(data: Mapping[str, Any], path: Path) -> CommandWorkload | RecordedWorkload:
    """The workload a parsed TOML document declares (WorkloadFileError if it is not valid)."""
    where = _Where(path)
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise where.fail(
            "file",
            f"unknown section(s) {unknown}; accepted: {', '.join(f'[{s}]' for s in SECTIONS)}",
        )
    if "workload" not in data:
        raise where.fail("[workload]", "missing: the file must declare [workload] with a name")
    if isinstance(data["workload"], dict) and "recorded" in data["workload"]:
        return _recorded(where, data, path)
    table = _table(where, data, "workload", WORKLOAD_KEYS)
    name = _name(where, table)
    command = _string(where, table, "[workload]", "command", None)
    if command is None:
        raise where.fail("[workload] command", "missing: the command line to run, a template")
    launcher = table.get("launcher", "mpi")
    if launcher not in LAUNCHERS:
        raise where.fail(
            "[workload] launcher",
            f'{launcher!r}; accepted: "mpi" (run under mpiexec -n {{ranks}}), "openmpi" (Open '
            "MPI's own mpirun -np {ranks}, for an application built against Open MPI) or "
            '"none" (the command launches itself, using {ranks})',
        )
    knobs, constraints = _knobs(where, data, table.get("constraints"))
    tile = _as_tile(knobs, constraints)
    tiles: tuple[int, ...] = (1,)
    default_tile = 1
    if tile is not None:
        tiles = tuple(map(int, tile.values))
        given = data["knobs"][tile.name]
        # as before knobs were a workload's own: without a default, the middle value
        has_default = isinstance(given, dict) and "default" in given
        default_tile = int(tile.default) if has_default else tiles[(len(tiles) - 1) // 2]
        knobs = ()
    names = tuple(k.name for k in knobs) or ((tile.name,) if tile else ())
    accepted = (*BASE_PLACEHOLDERS, *names)
    env = _env(where, table)
    bind, knob_env = _roles(where, data, knobs or ((tile,) if tile else ()), launcher, env)
    env = (*env, *knob_env)
    used = _templates(where, command, env, accepted)
    inputs = _inputs(where, table.get("inputs"), path, accepted)
    for _, text in inputs:
        used |= {name for name, _, _ in template_fields(text)}
    if bind:
        used.add(bind)
    unused = [p for p in ("threads", *names) if p not in used]
    if launcher == "none" and "ranks" not in used:
        unused.insert(0, "ranks")
    if unused:
        raise where.fail(
            "[workload] command",
            f"neither the command nor env uses {', '.join('{' + p + '}' for p in unused)}: its "
            'moves would change nothing (launcher "mpi" supplies the ranks; env '
            'OMP_NUM_THREADS = "{threads}" the threads)',
        )
    sizes = _sizes(where, "[workload] sizes", table.get("sizes"), required=True)
    held_out = _sizes(where, "[workload] held_out", table.get("held_out"), required=False)
    both = sorted(set(sizes) & set(held_out))
    if both:
        raise where.fail(
            "[workload] held_out",
            f"{both} are training sizes too; held-out sizes are never trained on",
        )
    warmup = table.get("warmup", True)
    if not isinstance(warmup, bool):
        raise where.fail("[workload] warmup", f"accepted: true or false, not {warmup!r}")
    description = _string(where, table, "[workload]", "description", "")
    workdir = _string(where, table, "[workload]", "workdir", "")
    output = _string(where, table, "[workload]", "output", "")
    if output and not FILE_NAME.match(output):
        raise where.fail(
            "[workload] output", f"{output!r}: a file name in the run's folder, e.g. out.txt"
        )
    if workdir and (inputs or output):
        raise where.fail(
            "[workload] workdir",
            "a workload with inputs or an output file runs each run in a fresh folder of its "
            "own: leave workdir out",
        )
    package = _string(where, table, "[workload]", "package", "")
    base = path.parent.resolve()
    folder = (base / workdir).resolve() if workdir else base
    if not folder.is_dir():
        raise where.fail("[workload] workdir", f"{folder} is not a directory")
    work, unit = _work(where, data)
    return CommandWorkload(
        name=name,
        description=description or f"{command} (from {path.name})",
        prepare=_no_prepare,
        work=work,
        memory=_no_memory,
        sizes=sizes,
        held_out=held_out,
        tiles=tiles,
        default_tile=default_tile,
        throughput_unit=unit,  # type: ignore[arg-type]
        item_name="size units",
        min_size_per_rank=0,
        module="hpc_ds1.workloads.command",
        template=command,
        launcher=launcher,
        env=env,
        knob=tile.name if tile else "tile",
        knobs=knobs,
        constraints=constraints,
        runtime=_runtime(where, data),
        check=_check(where, data, accepted),
        warmup=warmup,
        workdir=str(folder),
        source=str(path),
        inputs=inputs,
        output=output,
        package=package,
        bind_knob=bind,
        timeout_s=_timeout(where, table.get("timeout")),
        repeats=_repeats(where, table.get("repeats")),
    )


def _name(where: _Where, table: Mapping[str, Any]) -> str:
    name = table.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise where.fail(
            "[workload] name", f"{name!r}; accepted: 1-64 letters, digits, '_', '-' or '.'"
        )
    return name


def _recorded(where: _Where, data: Mapping[str, Any], path: Path) -> RecordedWorkload:
    """A recorded landscape replayed as a workload (workloads.recorded): its name, the
    recorded file and, for a T4 file or a cache whose constraints live there, its T1 kernel
    file, both relative to this file."""
    extra = sorted(set(data) - {"workload"})
    if extra:
        raise where.fail(
            "file",
            f"a recorded workload has only [workload]; {', '.join(extra)} come from its file",
        )
    table = _table(where, data, "workload", RECORDED_KEYS)
    name = _name(where, table)
    files = {}
    for key in ("recorded", "kernel"):
        given = _string(where, table, "[workload]", key, None)
        if given is None:
            if key == "recorded":
                raise where.fail("[workload] recorded", "missing: the recorded file")
            continue
        found = (path.parent / given).expanduser().resolve()
        if not found.is_file():
            raise where.fail(f"[workload] {key}", f"{found} is not a file")
        files[key] = found
    try:
        wl = recorded_workload(name, files["recorded"], files.get("kernel"), source=str(path))
    except RecordedError as error:
        raise where.fail("[workload] recorded", str(error)) from None
    description = _string(where, table, "[workload]", "description", "")
    return replace(wl, description=description) if description else wl


def load_workload_file(path: str | Path) -> CommandWorkload | RecordedWorkload:
    """Read and validate one workload file (WorkloadFileError saying what is wrong)."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise WorkloadFileError(f"{path}: cannot read the workload file: {error}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise WorkloadFileError(f"{path}: not valid TOML: {error}") from None
    return parse_workload(data, path.resolve())
