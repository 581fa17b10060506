"""A stopped service process that a blocked worker thread would hold past its stop grace."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={"PYTHONPATH": f"{ROOT / 'libs'}:{ROOT}", "PATH": "/usr/bin:/bin"},
    )


def test_a_thread_blocked_in_an_abandoned_call_no_longer_holds_the_process() -> None:
    """Without the watchdog this process never ends: the interpreter joins the blocked thread."""
    done = run(
        """
        import threading
        from hpc_ds1.process.stuck_exit import exit_if_stuck

        never = threading.Event()
        threading.Thread(target=never.wait, name="blocked-db-connect").start()
        exit_if_stuck(0.5, 3)
        """
    )
    out = done.stdout + done.stderr
    assert done.returncode == 3, out
    assert "process_outlived_its_services" in out and "blocked-db-connect" in out
    assert "in wait" in out  # where each thread was: the blocked one in Event.wait
    assert "in _shutdown" in out  # and the main thread joining it on the way out


def test_a_process_that_ends_in_time_keeps_its_own_exit() -> None:
    done = run(
        """
        import sys
        from hpc_ds1.process.stuck_exit import exit_if_stuck

        exit_if_stuck(60.0, 3)
        sys.exit(0)
        """
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "process_outlived_its_services" not in done.stdout + done.stderr


def test_a_call_left_in_the_event_loops_executor_no_longer_holds_the_process() -> None:
    """As `hpc-ds1 service` runs: the loop's teardown joins its default executor, where a call
    nobody awaits any more is blocked; the watchdog started as the service stopped ends it."""
    done = run(
        """
        import asyncio, threading
        from hpc_ds1.process.stuck_exit import exit_if_stuck

        never = threading.Event()

        async def service():
            try:
                asyncio.get_running_loop().run_in_executor(None, never.wait)
                await asyncio.sleep(0.1)
            finally:
                exit_if_stuck(0.5, 0)

        asyncio.run(service())
        """
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "process_outlived_its_services" in out and "in wait" in out
