"""The rebuild-phases benchmark's small mode (issue 46): a small generated year through the real
bus on a NATS and Postgres of its own, each phase timed once, then `rebuild()` whole. The
figures are the benchmark's to print (`python benchmarks/bench_rebuild_phases.py`)."""

from __future__ import annotations

import re

import pytest

from benchmarks.bench_rebuild_phases import main

PHASES = re.compile(
    r"^([\d,]+) events: read ([\d.]+) s, fold ([\d.]+) s, write ([\d.]+) s, sum ([\d.]+) s$"
)
REBUILD = re.compile(r"^  rebuild\(\) ([\d.]+) s, ([\d,]+) events/s$")


def test_each_phase_and_the_whole_rebuild_are_timed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--events", "2000", "--devices", "10", "--repeat", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    phases = [m for line in lines if (m := PHASES.match(line))]
    rebuilds = [m for line in lines if (m := REBUILD.match(line))]
    assert len(phases) == len(rebuilds) == 1, lines
    events = int(phases[0].group(1).replace(",", ""))
    read, fold, write, total = (float(phases[0].group(i)) for i in range(2, 6))
    assert events >= 2000
    assert total == pytest.approx(read + fold + write, abs=0.21)  # four values rounded to 0.1 s
    assert int(rebuilds[0].group(2).replace(",", "")) > 0
