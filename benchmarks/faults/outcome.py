"""What one scenario found over its repetitions, and how the benchmark prints it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Outcome:
    name: str
    what: str
    repeats: int = 0
    kills: int = 0
    survived: int = 0
    acked: int | None = None  # None: the scenario does not publish events of its own
    found: int | None = None
    lost: int = 0
    duplicates: int = 0
    gaps: int = 0
    orphans: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add_events(self, acked: int, found: int) -> None:
        self.acked = (self.acked or 0) + acked
        self.found = (self.found or 0) + found

    def fail(self, rep: int, message: str) -> None:
        self.failures.append(f"repetition {rep + 1}: {message}")

    @property
    def ok(self) -> bool:
        return (
            not self.failures
            and self.kills >= self.repeats
            and self.survived == self.kills
            and self.lost == 0
            and self.duplicates == 0
            and self.gaps == 0
            and self.orphans == 0
        )


HEADER = (
    f"{'scenario':<12} {'kills':>5} {'survived':>8} {'acked':>7} {'found':>7} {'lost':>5} "
    f"{'dup':>4} {'gaps':>4} {'orphans':>7} {'s':>6}  result"
)


def _n(value: int | None) -> str:
    return "-" if value is None else str(value)


def row(o: Outcome) -> str:
    return (
        f"{o.name:<12} {o.kills:>5} {o.survived:>8} {_n(o.acked):>7} {_n(o.found):>7} "
        f"{o.lost:>5} {o.duplicates:>4} {o.gaps:>4} {o.orphans:>7} {o.seconds:>6.0f}  "
        f"{'ok' if o.ok else 'FAILED'}"
    )


def report(outcomes: list[Outcome]) -> str:
    lines = [HEADER, "-" * len(HEADER)]
    lines += [row(o) for o in outcomes]
    kills = sum(o.kills for o in outcomes)
    survived = sum(o.survived for o in outcomes)
    acked = sum(o.acked or 0 for o in outcomes)
    lost = sum(o.lost for o in outcomes)
    dups = sum(o.duplicates for o in outcomes)
    gaps = sum(o.gaps for o in outcomes)
    orphans = sum(o.orphans for o in outcomes)
    bad = [o.name for o in outcomes if not o.ok]
    lines.append("-" * len(HEADER))
    lines.append(
        f"summary: {kills} faults injected, {survived} survived; {acked} events acknowledged, "
        f"{lost} lost, {dups} duplicated, {gaps} gaps, {orphans} orphan processes; "
        + ("all scenarios ok" if not bad else f"FAILED: {', '.join(bad)}")
    )
    for o in outcomes:
        for note in o.notes:
            lines.append(f"  {o.name}: {note}")
        for failure in o.failures:
            lines.append(f"  {o.name} FAILED {failure}")
    return "\n".join(lines)
