"""What a command workload's run produced: its runtime and its check verdict, from its output.

Under the MPI launcher every rank prints, so a pattern may match once per rank: the runtime is
combined as the RuntimeSpec says (the slowest rank's by default) and a check regex must hold on
every match."""

from __future__ import annotations

import math
import re

from hpc_ds1.workloads.base import CheckResult
from hpc_ds1.workloads.command import CheckSpec, CommandOutputError, RuntimeSpec, parse_output


def _numbers(pattern: str, text: str, what: str) -> list[float]:
    found = re.findall(pattern, text, re.MULTILINE)
    out = []
    for value in found:
        try:
            out.append(float(value))
        except ValueError:
            raise CommandOutputError(
                f"the {what} regex {pattern!r} captured {value!r}, which is not a number"
            ) from None
    return out


def read_runtime(spec: RuntimeSpec, text: str, wall_s: float) -> float:
    """The run's runtime in seconds, or CommandOutputError saying what was missing."""
    if spec.kind == "wall":
        return wall_s
    if spec.kind == "convention":
        return parse_output(text)[0]
    values = _numbers(spec.pattern, text, "runtime")
    if not values:
        raise CommandOutputError(
            f"no line of the output matched the runtime regex {spec.pattern!r}"
        )
    runtime = max(values) if spec.combine == "max" else values[-1]
    if not runtime > 0 or math.isinf(runtime):
        raise CommandOutputError(f"the runtime regex {spec.pattern!r} read an invalid {runtime}")
    return runtime


def read_check(spec: CheckSpec, text: str) -> CheckResult | None:
    """The verdict the output carries (None: the convention's command printed none). A check
    command's verdict is the runner's to take: it runs the command."""
    if spec.kind == "convention":
        return parse_output(text)[1]
    if spec.kind == "exit_code":
        return CheckResult(True, 0.0, "exit status 0")
    if spec.kind != "regex":
        raise ValueError(f"a {spec.kind} check is not read from the output")
    if re.compile(spec.pattern).groups == 0:
        matched = re.search(spec.pattern, text, re.MULTILINE) is not None
        detail = f"output {'matched' if matched else 'did not match'} {spec.pattern!r}"
        return CheckResult(matched, 0.0 if matched else 1.0, detail)
    errors = [abs(v) for v in _numbers(spec.pattern, text, "check")]
    if not errors:
        return CheckResult(False, 1.0, f"no line of the output matched {spec.pattern!r}")
    if not all(math.isfinite(e) for e in errors):
        return CheckResult(False, 1.0, f"{spec.pattern!r} read a value that is not finite")
    worst = max(errors)
    limit = spec.max_error if spec.max_error is not None else 0.0
    ok = worst <= limit
    detail = f"largest of {len(errors)} value(s) matched by {spec.pattern!r}, limit {limit:g}"
    return CheckResult(ok, worst, detail)
