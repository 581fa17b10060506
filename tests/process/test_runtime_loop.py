"""The services' event loop follows HPC_DS1_EVENT_LOOP: uvloop (a dependency) under auto."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from hpc_ds1.process.runtime import run_loop
from hpc_ds1.settings import Settings


async def _loop_type() -> type:
    return type(asyncio.get_running_loop())


@pytest.mark.parametrize(
    ("choice", "expected"),
    [("auto", uvloop.Loop), ("uvloop", uvloop.Loop), ("asyncio", asyncio.BaseEventLoop)],
)
def test_run_loop_follows_the_setting(
    choice: str, expected: type, tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPC_DS1_HOME", str(tmp_path))
    monkeypatch.setenv("HPC_DS1_EVENT_LOOP", choice)
    loop_type = run_loop(_loop_type(), Settings())
    assert issubclass(loop_type, expected)
    if choice == "asyncio":
        assert not issubclass(loop_type, uvloop.Loop)
