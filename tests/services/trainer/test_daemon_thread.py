"""A training runs on a daemon thread: its result and its error come back to the awaiting
coroutine, and a training still running when the service stops does not hold the process (the
compose stop killed a trainer held past its grace period by asyncio's default executor)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading

import pytest

from hpc_ds1.services.trainer.training import in_daemon_thread


def _square_on_daemon(x: int) -> tuple[int, bool]:
    return x * x, threading.current_thread().daemon


def _fail() -> None:
    raise ValueError("no measurements")


def test_the_result_comes_back_from_a_daemon_thread() -> None:
    assert asyncio.run(in_daemon_thread(_square_on_daemon, 7)) == (49, True)


def test_the_error_comes_back_as_raised() -> None:
    with pytest.raises(ValueError, match="no measurements"):
        asyncio.run(in_daemon_thread(_fail))


def test_a_training_still_running_does_not_hold_the_process() -> None:
    # The child awaits a 10-minute "training", is cancelled as a stop would, and returns.
    # With asyncio.to_thread the interpreter would join the thread and take the full 600 s.
    script = textwrap.dedent(
        """
        import asyncio, time
        from hpc_ds1.services.trainer.training import in_daemon_thread

        async def main():
            task = asyncio.create_task(in_daemon_thread(time.sleep, 600))
            await asyncio.sleep(0.2)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

        asyncio.run(main())
        print("stopped")
        """
    )
    # a joined thread would hold the child for 600 s: the timeout fails the test first
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped"
