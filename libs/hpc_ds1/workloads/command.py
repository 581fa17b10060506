"""A job given as an external command template, timed by the command itself.

Placeholders: {ranks} {threads} {tile} {size}, plus {python} and {mpiexec} (this environment's).
Output convention: the command prints a line `runtime_s=<seconds>` (the last one counts); it may
also print `check=ok` or `check=failed` and `check_error=<float>`. Exit status 0 means it ran."""

from __future__ import annotations

import re
import shlex
import string
from dataclasses import dataclass
from typing import Any

from hpc_ds1.workloads.base import CheckResult, RankContext, Work, Workload

PLACEHOLDERS = ("ranks", "threads", "tile", "size", "python", "mpiexec")
_RUNTIME = re.compile(r"^\s*runtime_s\s*=\s*([-+0-9.eE]+|nan|inf)\s*$", re.MULTILINE)
_CHECK = re.compile(r"^\s*check\s*=\s*(ok|failed|fail|wrong)\s*$", re.MULTILINE)
_CHECK_ERROR = re.compile(r"^\s*check_error\s*=\s*([-+0-9.eE]+)\s*$", re.MULTILINE)


class CommandOutputError(ValueError):
    """The command's output did not follow the convention."""


def _no_prepare(ctx: RankContext, size: int, tile: int) -> Any:
    raise RuntimeError("a command workload runs its own command; it has no rank program")


def _no_work(size: int) -> Work:
    return Work(flops=0.0, bytes_moved=0.0, memory_bytes=0, items=float(size))


def _no_memory(size: int, ranks: int) -> int:
    return 0


@dataclass(frozen=True)
class CommandWorkload(Workload):
    template: str = ""

    def placeholders(self) -> set[str]:
        return {field for _, field, _, _ in string.Formatter().parse(self.template) if field}

    def argv(self, values: dict[str, object]) -> list[str]:
        return shlex.split(self.template.format(**values))


def check_template(template: str) -> None:
    """Raise ValueError if the template is empty, malformed or uses an unknown placeholder."""
    if not template.strip():
        raise ValueError("the command template is empty")
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as error:
        raise ValueError(f"malformed command template {template!r}: {error}") from None
    unknown = sorted(f for f in fields if f not in PLACEHOLDERS)
    if unknown or "" in fields:
        raise ValueError(
            f"command template uses unknown placeholder(s) {unknown or ['{}']}; "
            f"accepted: {', '.join('{' + p + '}' for p in PLACEHOLDERS)}"
        )


def command_workload(
    name: str,
    template: str,
    *,
    tiles: tuple[int, ...] = (1,),
    sizes: tuple[int, ...] = (1,),
    work: Any = None,
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
