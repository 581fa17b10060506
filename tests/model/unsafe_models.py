"""Model files an attacker holding a device credential could upload (issue 41) and ways to see
what checking them costs: the builders and the file watch live in benchmarks/unsafe_models.py
(benchmarks/probe_devices.py sends them to a running serve); here, this process's peak memory.
Shared by tests/model/test_vetting.py and tests/services/gateway/agents/test_routes.py."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks.unsafe_models import (
    BOMB_ELEMENTS,
    Watch,
    bomb_in,
    constant_of_shape_bomb,
    external_in,
    grafted,
    heavy_in,
    open_watch,
    parsed,
    with_op,
)

__all__ = [
    "BOMB_ELEMENTS",
    "Growth",
    "Watch",
    "bomb_in",
    "constant_of_shape_bomb",
    "external_in",
    "grafted",
    "heavy_in",
    "open_watch",
    "parsed",
    "peak_rss_growth",
    "with_op",
]


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise LookupError(field)


@dataclass
class Growth:
    mb: float = 0.0


@contextmanager
def peak_rss_growth() -> Iterator[Growth]:
    """How far this process's resident memory rose above its start within the block, in MB:
    the kernel's peak (VmHWM) is reset at the start (/proc/self/clear_refs: 5), so the peak of
    an earlier test does not hide this one's."""
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kb("VmRSS")
    growth = Growth()
    try:
        yield growth
    finally:
        growth.mb = (_status_kb("VmHWM") - before) / 1024
