"""A job given as an external command template: `run --command`, or a TOML workload file.

Placeholders of `run --command`: {ranks} {threads} {tile} {size}, plus {python} and {mpiexec}
(this environment's). Its output convention: the command prints a line `runtime_s=<seconds>`
(the last one counts); it may also print `check=ok` or `check=failed` and
`check_error=<float>`. Exit status 0 means it ran.

A TOML workload (tomlfile.py) declares instead its launcher, its environment template, its knob
(the space's tile dimension, under its own placeholder name), where its runtime comes from and
how its answer is checked (outcome.py)."""

from __future__ import annotations

import re
import shlex
import string
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from hpc_ds1.workloads.base import CheckResult, RankContext, Work, Workload

if TYPE_CHECKING:  # not at run time: the rank program imports this package, and fast
    from hpc_ds1.space import Config

PLACEHOLDERS = ("ranks", "threads", "tile", "size", "python", "mpiexec")
# A command decides its own threads through this template (the runner pins none for it).
DEFAULT_ENV: tuple[tuple[str, str], ...] = (("OMP_NUM_THREADS", "{threads}"),)
# "mpi": the runner's launcher (our mpiexec, or srun); "openmpi": Open MPI's own mpirun
# (runner/mpienv.py), for an application built against it; "none": the command launches itself.
Launcher = Literal["none", "mpi", "openmpi"]
_RUNTIME = re.compile(r"^\s*runtime_s\s*=\s*([-+0-9.eE]+|nan|inf)\s*$", re.MULTILINE)
_CHECK = re.compile(r"^\s*check\s*=\s*(ok|failed|fail|wrong)\s*$", re.MULTILINE)
_CHECK_ERROR = re.compile(r"^\s*check_error\s*=\s*([-+0-9.eE]+)\s*$", re.MULTILINE)


class CommandOutputError(ValueError):
    """The command's output did not follow the convention."""


@dataclass(frozen=True)
class RuntimeSpec:
    """Where a run's runtime comes from: the `runtime_s=` convention, the wall clock of the
    command, or a regex with one group. Several matches (one per rank under the MPI launcher)
    are combined by `combine`: max, the slowest rank, as the built-ins time a run; or last."""

    kind: Literal["convention", "wall", "regex"] = "convention"
    pattern: str = ""
    combine: Literal["max", "last"] = "max"


@dataclass(frozen=True)
class CheckSpec:
    """How a run's answer is checked: the convention's `check=` lines, the exit status alone, a
    regex on the output (with one group: the error, at most `max_error` on every match), or a
    check command (exit status 0: correct) run once after the timed runs."""

    kind: Literal["convention", "exit_code", "regex", "command"] = "convention"
    pattern: str = ""
    max_error: float | None = None
    command: str = ""


def _no_prepare(ctx: RankContext, size: int, tile: int) -> Any:
    raise RuntimeError("a command workload runs its own command; it has no rank program")


def _no_work(size: int) -> Work:
    return Work(flops=0.0, bytes_moved=0.0, memory_bytes=0, items=float(size))


def _no_memory(size: int, ranks: int) -> int:
    return 0


def template_fields(template: str) -> list[tuple[str, str, str | None]]:
    """(field, format spec, conversion) of every placeholder; ValueError when malformed."""
    out = []
    for _, name, spec, conversion in string.Formatter().parse(template):
        if name is not None:
            out.append((name, spec or "", conversion))
    return out


def fill(template: str, values: dict[str, str], *, quote: bool) -> str:
    """The template with every placeholder replaced (shell-quoted when `quote`)."""
    pieces = []
    for literal, name, _, _ in string.Formatter().parse(template):
        pieces.append(literal)
        if name is not None:
            value = values[name]
            pieces.append(shlex.quote(value) if quote else value)
    return "".join(pieces)


@dataclass(frozen=True)
class CommandWorkload(Workload):
    template: str = ""
    launcher: Launcher = "none"
    env: tuple[tuple[str, str], ...] = DEFAULT_ENV
    knob: str = "tile"  # the placeholder that carries the config's tile
    runtime: RuntimeSpec = field(default_factory=RuntimeSpec)
    check: CheckSpec = field(default_factory=CheckSpec)
    warmup: bool = True  # one untimed run before the timed ones
    workdir: str = ""  # where the command runs ("": the caller's directory)
    source: str = ""  # the file that declared it
    # Files written, from these templates, into a fresh folder for each run (the command then
    # runs there): (name in the folder, template text). hpcc's hpccinf.txt.
    inputs: tuple[tuple[str, str], ...] = ()
    output: str = ""  # a file the command writes in its folder: the runtime and check read it
    package: str = ""  # what to install when its program is missing (`workloads --check`)
    # The knob that is the launcher's rank binding ("": none; the launcher's default, and
    # Open MPI's launch --bind-to none): runner/launch.py binding_words
    bind_knob: str = ""

    @property
    def fresh_folder(self) -> bool:
        """Each run in a fresh folder of its own (it has input files or an output file)."""
        return bool(self.inputs or self.output)

    def placeholders(self) -> set[str]:
        return {name for name, _, _ in template_fields(self.template)}

    def values(self, config: Config, size: int, mpiexec: str = "mpiexec") -> dict[str, str]:
        """Every placeholder's text for `config` at `size`: the machine's, the tile under the
        file's knob name (one knob, no constraints) or the workload's own knobs (a bool as
        true/false, as TOML writes it)."""
        own = {name: "true" if v is True else "false" if v is False else str(v)
               for name, v in config.knobs}  # fmt: skip
        return {
            "ranks": str(config.ranks),
            "threads": str(config.threads),
            "size": str(size),
            **({} if self.knobs else {self.knob: str(config.tile)}),
            **own,
            "python": sys.executable,
            "mpiexec": mpiexec,
        }

    def argv(self, values: dict[str, Any]) -> list[str]:
        """The command's words; under the MPI launcher, without the launcher's own words."""
        return shlex.split(fill(self.template, {k: str(v) for k, v in values.items()}, quote=True))

    def environment(self, values: dict[str, str]) -> dict[str, str]:
        return {name: fill(value, values, quote=False) for name, value in self.env}

    def input_files(self, values: dict[str, str]) -> dict[str, str]:
        """Each input file's text for one run (its placeholders filled, unquoted)."""
        return {name: fill(text, values, quote=False) for name, text in self.inputs}


def check_template(template: str, accepted: tuple[str, ...] = PLACEHOLDERS) -> None:
    """Raise ValueError if the template is empty, malformed or uses an unknown placeholder."""
    if not template.strip():
        raise ValueError("the command template is empty")
    try:
        found = template_fields(template)
    except ValueError as error:
        raise ValueError(f"malformed command template {template!r}: {error}") from None
    fields = {name for name, _, _ in found}
    unknown = sorted(f for f in fields if f not in accepted)
    if unknown or "" in fields:
        raise ValueError(
            f"command template uses unknown placeholder(s) {unknown or ['{}']}; "
            f"accepted: {', '.join('{' + p + '}' for p in accepted)}"
        )
    styled = sorted({"{" + n + (f"!{c}" if c else "") + (f":{s}" if s else "") + "}"
                     for n, s, c in found if s or c})  # fmt: skip
    if styled:
        raise ValueError(
            f"command template formats a placeholder ({', '.join(styled)}); write the bare "
            "placeholder, e.g. {size}"
        )


def command_workload(
    name: str,
    template: str,
    *,
    tiles: tuple[int, ...] = (1,),
    sizes: tuple[int, ...] = (1,),
    work: Callable[[int], Work] | None = None,
    description: str = "",
) -> CommandWorkload:
    """Build (not register) a workload that runs `template` and reads `runtime_s=` from it."""
    check_template(template)
    return CommandWorkload(
        name=name,
        description=description or f"external command: {template}",
        prepare=_no_prepare,
        work=work or _no_work,
        memory=_no_memory,
        sizes=sizes,
        held_out=(),
        tiles=tiles,
        default_tile=tiles[0],
        min_size_per_rank=0,
        module=__name__,
        template=template,
    )


def parse_output(text: str) -> tuple[float, CheckResult | None]:
    """The runtime and optional check a command printed, per the convention above."""
    found = _RUNTIME.findall(text)
    if not found:
        raise CommandOutputError(
            "the command printed no runtime (expected a line 'runtime_s=<seconds>')"
        )
    runtime = float(found[-1])
    if not runtime > 0 or runtime == float("inf"):
        raise CommandOutputError(f"the command printed an invalid runtime: runtime_s={found[-1]}")
    verdicts = _CHECK.findall(text)
    errors = _CHECK_ERROR.findall(text)
    if not verdicts and not errors:
        return runtime, None
    error = float(errors[-1]) if errors else 0.0
    ok = (verdicts[-1] == "ok") if verdicts else True
    return runtime, CheckResult(ok, error, "reported by the command")
