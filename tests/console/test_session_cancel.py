"""A long run in the console's session view, and its cancel (issue 44, item 4), in a real browser
(Debian's chromium through Playwright's async API) against the gateway on a loopback socket, with
a real stack (projector, agent, coordinator) running a real session: its first step is a sleeper
of two real MPI ranks. The view shows the run in flight from its run.heartbeat events (what runs,
for how long, against which timeout, a bar of the timeout gone), live; a viewer sees the cancel
disabled and why; an engineer cancels with a reason, every rank and launcher proxy dies (read
from /proc) and the view says the session was interrupted and who cancelled it."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from hpc_ds1.settings import Settings
from hpc_ds1.stack import Stack, open_stack
from hpc_ds1.workloads import register, unregister
from tests.support.gateway import gateway_served, grant
from tests.support.sleeper import alive, rank_pids, sleeper
from tests.support.waiting import until

BROWSER = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(
    not BROWSER.exists(), reason=f"{BROWSER} is missing: deploy/install-browser.sh installs it"
)
WAIT_MS = 20_000


@pytest.fixture
async def served(
    tmp_path: Path, settings: Settings
) -> AsyncIterator[tuple[Stack, str, dict[str, str], Path, str]]:
    """The stack with heartbeats every 0.5 s, the gateway on a loopback socket, an engineer's
    and a viewer's tokens, and a sleeper workload of 2 real MPI ranks (its pids in a folder)."""
    fast = settings.model_copy(update={"run_heartbeat_s": 0.5})
    pids = tmp_path / "pids"
    pids.mkdir()
    wl = sleeper(tmp_path, pids, 'repeats = 1\ntimeout = "10m"')
    register(wl, replace=True)
    try:
        async with open_stack(fast, ("projector", "agent", "coordinator"), "test-console") as stack:
            await stack.local_device()
            tokens = {r: await grant(stack, r, f"{r}-erin") for r in ("engineer", "viewer")}
            await stack.caught_up()
            async with gateway_served(fast, stack) as base:
                yield stack, base, tokens, pids, wl.name
    finally:
        unregister(wl.name)


async def test_a_long_run_shows_live_and_an_engineer_cancels_it_from_the_console(
    served: tuple[Stack, str, dict[str, str], Path, str],
) -> None:
    from playwright.async_api import async_playwright

    stack, base, tokens, pids, workload = served
    async with async_playwright() as p:
        chromium = await p.chromium.launch(executable_path=str(BROWSER), args=["--no-sandbox"])
        try:
            pages: dict[str, Any] = {}
            errors: list[str] = []
            for role in ("viewer", "engineer"):
                context = await chromium.new_context(
                    viewport={"width": 1400, "height": 1000},
                    extra_http_headers={"Authorization": f"Bearer {tokens[role]}"},
                )
                page = await context.new_page()
                page.on("pageerror", lambda error: errors.append(str(error)))
                await page.goto(base + "/")
                await page.wait_for_selector("body[data-ready='true']", timeout=WAIT_MS)
                pages[role] = page
            engineer, viewer = pages["engineer"], pages["viewer"]

            # The engineer starts a session from the console's form: its first step sleeps.
            form = engineer.locator("#sessions form[data-part=start]")
            await form.locator("select[name=workload]").select_option(workload)
            await form.locator("input[name=size]").fill("600")
            await form.locator("input[name=ranks]").fill("2")
            await form.locator("input[name=threads]").fill("1")
            await form.locator("button[type=submit]").click()
            said = engineer.locator("#sessions [data-part=start-status]")
            await said.filter(has_text="started").wait_for(timeout=WAIT_MS)
            found = re.search(r"Session (\S+) started", await said.inner_text())
            assert found, await said.inner_text()
            session_id = found.group(1)
            every = await asyncio.to_thread(rank_pids, pids, 2)
            assert all(alive(pid) for pid in every)

            # Both see the run in flight, live: what runs, for how long, against its timeout.
            for page in (engineer, viewer):
                running = page.locator("#sessions [data-part=running]")
                await running.filter(has_text="Running now").wait_for(timeout=WAIT_MS)
                text = await running.inner_text()
                assert "ranks=2 threads=1" in text and "of its 10 min 00 s timeout" in text, text
                bar = running.locator("progress")
                assert await bar.get_attribute("max") == "600"
                first = float(await bar.evaluate("b => b.value"))
                await page.wait_for_function(
                    "v => document.querySelector('#sessions [data-part=running] progress')"
                    ".value > v + 1",
                    arg=first,
                    timeout=WAIT_MS,
                )  # the time in flight goes on between heartbeats and with them

            # A viewer may not cancel, and is told why.
            cancel = viewer.locator("#sessions form[data-part=cancel]")
            assert await cancel.locator("button").is_disabled()
            assert "needs an engineer token" in await cancel.inner_text()
            assert all(alive(pid) for pid in every)

            # The engineer cancels, with a reason: the ranks die, the view says who.
            cancel = engineer.locator("#sessions form[data-part=cancel]")
            await cancel.locator("input[name=reason]").fill("too long for today")
            await cancel.locator("button").click()
            await until("the ranks killed", lambda: not any(alive(pid) for pid in every), 20)
            for page in (engineer, viewer):
                detail = page.locator("#sessions [data-part=detail]")
                await detail.filter(has_text="Finished: interrupted").wait_for(timeout=WAIT_MS)
                text = await detail.inner_text()
                assert "cancelled by engineer-erin (engineer): too long for today" in text, text
                assert "Cancelled by engineer-erin (engineer)" in text, text
                assert await page.locator("#sessions [data-part=running]").is_hidden()
                assert await page.locator("#sessions form[data-part=cancel]").count() == 0
            # Who cancelled is in the log: the console's engineer, as the event's actor.
            history = await stack.bus.history("cancel", session_id)
            assert [(env.actor, env.data["reason"]) for _, env in history] == [
                ("engineer-erin", "too long for today")
            ]
            assert not errors, errors
        finally:
            await chromium.close()
