"""The console in a real browser (Debian's chromium through Playwright) against a real `hpc-ds1
serve` with real events (conftest.py): sign-in through the one-time URL; every section renders
what the API says; the join token only for a browser on the coordinator itself; a viewer sees
the queue but cannot approve; approving from the page moves the session on; Ctrl+Enter runs
the playground; every control is labelled and reachable with Tab, with a visible focus. A
full-page screenshot of each section is saved under SCREENS (`make test` names the folder).

The tests run in this file's order: the render test sees the state the fixture made, before
the approval and the playground add to it."""

from __future__ import annotations

import json
import re
import ssl
from collections.abc import Iterator
from math import floor
from pathlib import Path
from typing import Any

import httpx
import pytest

from hpc_ds1.infra.tls import HomeTLS
from hpc_ds1.security.credentials import owner_name
from hpc_ds1.space import ALL_ACTIONS
from tests.support.waiting import wait_for

from .served import WORKLOAD, Console, bearer, non_loopback_ipv4

SECTIONS = (
    "facility",
    "playground",
    "fleet",
    "approvals",
    "sessions",
    "decisions",
    "machine",
    "evaluation",
    "snippets",
)
READY_MS = 30_000
VIEWPORT = {"width": 1440, "height": 1000}
SCRIPT_ERRORS: list[str] = []  # uncaught exceptions in the pages of signed-in admins


def ready(page: Any, *sections: str) -> None:
    """Wait until every section ran its init; fail naming those of `sections` (default: all)
    that could not load, with the error each shows."""
    page.wait_for_selector("body[data-ready='true']", timeout=READY_MS)
    broken = page.evaluate(
        """(wanted) => [...document.querySelectorAll('main > section')]
              .filter(s => (!wanted.length || wanted.includes(s.id)) && s.dataset.ready !== 'true')
              .map(s => `${s.id}: ${s.dataset.ready || 'no init'}: ` +
                        (s.querySelector('.section-error')?.textContent || ''))""",
        list(sections),
    )
    assert not broken, "sections that did not load:\n" + "\n".join(broken)


def login(browser: Any, console: Console, host: str = "127.0.0.1", scheme: str = "http") -> Any:
    """A fresh browser context signed in through a one-time login URL on `host`. Over https
    (serve's own CA, which this browser does not hold) the certificate is not what is tested."""
    context = browser.new_context(viewport=VIEWPORT, ignore_https_errors=scheme == "https")
    page = context.new_page()
    page.on("pageerror", lambda error: SCRIPT_ERRORS.append(f"{page.url}: {error}"))
    page.goto(f"{scheme}://{host}:{console.port}/?token={console.login_token()}")
    assert page.url.rstrip("/") == f"{scheme}://{host}:{console.port}", page.url
    page.wait_for_selector("body[data-ready='true']", timeout=READY_MS)
    return page


def text_of(page: Any, selector: str) -> str:
    return " ".join(page.locator(selector).inner_text().split())


@pytest.fixture(scope="module")
def admin(browser: Any, console: Console) -> Iterator[Any]:
    page = login(browser, console)
    yield page
    page.context.close()


def test_sign_in_goes_through_the_one_time_url(browser: Any, console: Console) -> None:
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    try:
        page.goto(console.base + "/")
        assert page.locator("#facility").count() == 0, "the console shows without a credential"
        assert "token login" in page.inner_text("body")
        token = console.login_token()
        page.goto(f"{console.base}/?token={token}")
        page.wait_for_selector("body[data-ready='true']", timeout=READY_MS)
        assert text_of(page, "#whoami").startswith(owner_name())
        cookies = {c["name"]: c for c in context.cookies()}
        assert cookies["hpc_ds1_session"]["httpOnly"]
        assert cookies["hpc_ds1_session"]["sameSite"] == "Strict"
        again = httpx.get(f"{console.base}/?token={token}", timeout=30)
        assert again.status_code == 401, "a one-time login URL worked twice"
    finally:
        context.close()


def test_the_sections_in_the_seed_order(admin: Any, screens: Path) -> None:
    ids = admin.evaluate("() => [...document.querySelectorAll('main > section')].map(s => s.id)")
    assert tuple(ids) == SECTIONS
    admin.screenshot(path=str(screens / "00_console.png"), full_page=True)
    # Each section cut from a full-page capture (an element screenshot scrolls, and the sticky
    # header would cover the top of a long section).
    admin.evaluate("() => window.scrollTo(0, 0)")
    for n, name in enumerate(SECTIONS, 1):
        box = admin.locator(f"#{name}").bounding_box()
        assert box and box["height"] > 0, f"#{name} is not displayed"
        admin.screenshot(path=str(screens / f"{n:02d}_{name}.png"), full_page=True, clip=box)


def check_facility(page: Any, console: Console) -> None:
    stats = console.get("/v1/stats")
    facility = text_of(page, "#facility")
    assert stats["devices_online"] >= 1 and stats["moves_waiting"] >= 1, stats
    running = stats["sessions_running"] + (stats["tasks_running"] or 0)
    share = stats["auto_share"]
    # A share on a half percent may be rounded either way (server template or client).
    shares = {"—"} if share is None else {f"{share * 100:.0f} %", f"{floor(share * 100 + 0.5)} %"}
    expected = {
        "devices online": {str(stats["devices_online"])},
        "tasks and sessions running": {str(running)},
        "moves waiting for approval": {str(stats["moves_waiting"])},
        "of logged decisions ran automatically": shares,
    }
    for label, figures in expected.items():
        found = re.search(rf"(\S+(?: %)?)\s+{re.escape(label)}", facility)
        assert found and found.group(1) in figures, (label, figures, facility)
    assert page.locator("#facility a[href='#approvals']").count() >= 1
    assert page.locator("#facility a[href='#decisions']").count() >= 1


def check_playground(page: Any, console: Console) -> None:
    playground = text_of(page, "#playground")
    machine = console.get("/v1/model")
    assert machine["name"] in playground, playground
    limits = machine["thresholds"]
    shown = f"auto ≥ {limits['auto']:g} · escalate < {limits['escalate']:g}"
    assert shown in playground, (shown, playground)
    assert page.locator("#playground textarea, #playground input").count() >= 1


def check_fleet(page: Any, console: Console) -> None:
    device = next(d for d in console.get("/v1/devices")["devices"] if d["local"])
    devices = text_of(page, "#fleet [data-part='devices']")
    assert device["hostname"] in devices or device["device_id"][:8] in devices, devices
    assert WORKLOAD in devices, f"measured kernels not shown: {devices}"
    task = console.get(f"/v1/tasks/{console.task_id}")
    tasks = text_of(page, "#fleet [data-part='tasks']")
    assert console.task_id[:8] in tasks and "finished" in tasks.lower(), tasks
    assert f"{task['size']:,}" in tasks or str(task["size"]) in tasks, tasks


def check_approvals(page: Any, console: Console) -> None:
    approval = next(
        a
        for a in console.get("/v1/approvals")["approvals"]
        if a["session_id"] == console.session_id
    )
    waiting = text_of(page, "#approvals [data-part='waiting']")
    assert approval["move"] in waiting and f"{approval['confidence']:.2f}" in waiting, waiting
    assert "outside the measured range" in waiting, f"the guard's reason not shown: {waiting}"


def check_sessions(page: Any, console: Console) -> None:
    sessions = text_of(page, "#sessions table.sessions-list")
    assert console.session_id[:8] in sessions and WORKLOAD in sessions, sessions


def check_decisions(page: Any, console: Console) -> None:
    audit = console.get("/v1/audit")["decisions"]
    assert audit, "no decision logged"
    rows = page.locator("#decisions table tbody tr:not(.empty)")
    assert rows.count() >= len(audit[:10]), rows.count()
    decisions = text_of(page, "#decisions table tbody")
    assert str(audit[0]["seq"]) in decisions and audit[0]["choice"] in decisions, decisions


def check_machine(page: Any, console: Console) -> None:
    model = console.get("/v1/model")["model"]
    assert model, "the fixture's setup published no model"
    machine = text_of(page, "#machine")
    assert model["version"] in machine, (model["version"], machine)
    assert WORKLOAD in machine and ("200,000" in machine or "200000" in machine), machine


def check_evaluation(page: Any, console: Console) -> None:
    reply = console.api("GET", "/v1/evaluation")
    text = text_of(page, "#evaluation")
    if reply.status_code == 404:  # none run on this home: an empty state that says what to run
        assert "hpc-ds1 evaluate" in text, text
    else:
        assert reply.status_code == 200, reply.text
        assert page.locator("#evaluation table tbody tr").count() >= 3, text
    # issue 43's reliability diagram and selective-risk curve: drawn when the latest evaluation
    # has them (test_sections_live.py seeds one that has), else an empty state that says so
    trust = page.locator("#evaluation .evaluation-trust")
    found = reply.json() if reply.status_code == 200 else {}
    calibration = (found.get("results") or {}).get("calibration") or {}
    plots = trust.locator(":is(.evaluation-reliability-unattended, .evaluation-selective-risk)")
    if reply.status_code == 404:
        assert trust.count() == 0, text
    elif (calibration.get("discrimination") or {}).get("decisions"):
        assert plots.locator("canvas").count() == 2, trust.inner_text()
    else:
        assert plots.count() == 0 and "hpc-ds1 evaluate" in trust.inner_text(), text
    # the yardstick the fixture ran on a recorded space: its plot and its table, per policy
    yardstick = console.api("GET", "/v1/evaluation/yardstick")
    assert yardstick.status_code == 200, yardstick.text
    part = page.locator("#evaluation .yardstick")
    assert part.locator("canvas").count() >= 1, text
    rows = part.locator("table.evaluation-table tbody tr")  # not the plot's legend
    assert rows.count() == 3, part.inner_text()
    assert "hpcds1" in part.inner_text() and "5 runs" in part.inner_text()


def check_snippets(page: Any, console: Console) -> None:
    snippets = text_of(page, "#snippets")
    for shown in ("import hpc_ds1", "hpc-ds1 decide", "/v1/decide", "from hpc_ds1.fleet import"):
        assert shown in snippets, (shown, snippets)


CHECKS = {name: globals()[f"check_{name}"] for name in SECTIONS}


@pytest.mark.parametrize("name", SECTIONS)
def test_the_section_renders_real_data(admin: Any, console: Console, name: str) -> None:
    ready(admin, name)
    assert "Loading…" not in text_of(admin, f"#{name}"), text_of(admin, f"#{name}")
    CHECKS[name](admin, console)


def test_the_join_token_only_for_a_browser_on_the_coordinator(
    admin: Any, browser: Any, console: Console
) -> None:
    ready(admin, "fleet")
    # The admin on 127.0.0.1: the join command carries the token.
    assert console.join_token in text_of(admin, "#fleet")
    ip = non_loopback_ipv4()
    if ip is None:
        pytest.skip("this machine has no non-loopback IPv4 address to browse from")
    # The same admin on the machine's own network address: the peer is not loopback. Off
    # loopback `serve` speaks HTTPS with its home's own CA (issue 45, item 1) when it made one.
    tls = HomeTLS.of(console.settings.home)
    scheme = "https" if tls.ca_cert.exists() else "http"
    verify: Any = ssl.create_default_context(cafile=str(tls.ca_cert)) if scheme == "https" else True
    refused = httpx.get(
        f"{scheme}://{ip}:{console.port}/v1/fleet/join-token",
        headers=bearer(console.admin),
        timeout=30,
        verify=verify,
    )
    assert refused.status_code == 403, refused.text
    page = login(browser, console, host=ip, scheme=scheme)
    try:
        assert text_of(page, "#whoami").startswith(owner_name())
        assert console.join_token not in page.content()
        assert "--token …" in text_of(page, "#fleet")
    finally:
        page.context.close()


def test_a_viewer_sees_the_queue_but_cannot_approve(browser: Any, console: Console) -> None:
    context = browser.new_context(viewport=VIEWPORT, extra_http_headers=bearer(console.viewer))
    page = context.new_page()
    try:
        page.goto(console.base + "/")
        ready(page, "approvals")
        assert "viewer" in text_of(page, "#whoami")
        waiting = console.get("/v1/approvals")["approvals"]
        assert waiting, "nothing waits for an engineer"
        assert waiting[0]["move"] in text_of(page, "#approvals [data-part='waiting']")
        controls = page.locator("#approvals").get_by_role(
            "button", name=re.compile(r"approve|reject", re.I)
        )
        for i in range(controls.count()):
            assert controls.nth(i).is_disabled(), controls.nth(i).evaluate("e => e.outerHTML")
        assert console.join_token not in page.content()
        # The page's own call is refused too.
        status = page.evaluate(
            """async (id) => (await fetch(`/v1/approvals/${id}`, {
                 method: 'POST', credentials: 'same-origin',
                 headers: {'Content-Type': 'application/json',
                           'X-Requested-With': 'hpc-ds1-console'},
                 body: JSON.stringify({decision: 'approve', note: 'viewer'})})).status""",
            waiting[0]["approval_id"],
        )
        assert status == 403
        still = [a["approval_id"] for a in console.get("/v1/approvals")["approvals"]]
        assert waiting[0]["approval_id"] in still
    finally:
        context.close()


def test_approving_from_the_page_moves_the_session_on(admin: Any, console: Console) -> None:
    page = admin
    ready(page, "approvals")
    before = console.get(f"/v1/sessions/{console.session_id}")
    pending = [
        a
        for a in console.get("/v1/approvals")["approvals"]
        if a["session_id"] == console.session_id
    ]
    assert pending, "the session has no waiting move"
    approval = pending[0]
    row = (
        page.locator("#approvals [data-part='waiting'] tr")
        .filter(has=page.get_by_role("button", name=re.compile("approve", re.I)))
        .first
    )
    note = row.get_by_role("textbox", name=re.compile("note", re.I))
    assert note.count() == 1, "no note field by the approve button"
    note.fill("checked in the browser test")
    row.get_by_role("button", name=re.compile("approve", re.I)).click()

    def decided() -> dict[str, Any] | None:
        rows = console.get("/v1/approvals?status=decided")["approvals"]
        return next((a for a in rows if a["approval_id"] == approval["approval_id"]), None)

    done = wait_for("the approval recorded", decided, 30)
    assert done["status"] == "approved" and done["decided_by"] == owner_name(), done
    assert done["note"] == "checked in the browser test", done

    # The session goes on: the approved move runs, then it pauses on its next move (every move
    # of a size never measured waits for an engineer) or ends; the later tests see it still.
    def moved_on() -> dict[str, Any] | None:
        now = console.get(f"/v1/sessions/{console.session_id}")
        grown = len(now["events"]) > len(before["events"]) + 1
        return now if grown and now["status"] in ("paused", "finished") else None

    after = wait_for("the session moved on and settled", moved_on, 90)
    steps = [e for e in after["events"] if e["seq"] > before["events"][-1]["seq"]]
    types = [e["type"] for e in steps]
    assert "session.resumed" in types, types
    assert "session.step_run" in types or "session.finished" in types, types
    # The page follows without a reload: the approved move leaves the queue.
    wait_for(
        "the approved move left the page's queue",
        lambda: (
            page.locator(
                f"#approvals [data-part='waiting'] [data-approval-id='{approval['approval_id']}']"
            ).count()
            == 0
        ),
        30,
    )
    decided_rows = text_of(page, "#approvals [data-part='decided']")
    assert owner_name() in decided_rows and approval["move"] in decided_rows, decided_rows


def test_ctrl_enter_runs_the_playground(admin: Any, console: Console, screens: Path) -> None:
    page = admin
    ready(page, "playground")
    editor = page.locator("#playground textarea").first
    job = {  # with telemetry: one forward pass, nothing runs
        "workload": WORKLOAD,
        "size": 300_000,
        "config": {"ranks": 1, "threads": 1},
        "telemetry": {"runtime_s": 0.05},
    }
    editor.fill(json.dumps(job, indent=2))
    try:
        with page.expect_response(lambda r: r.url.endswith("/v1/decide"), timeout=30_000) as sent:
            editor.press("Control+Enter")
    except Exception as error:
        shows = text_of(page, "#playground")
        raise AssertionError(
            f"Ctrl+Enter asked nothing ({error}); the playground: {shows}"
        ) from None
    reply = sent.value
    assert reply.ok, reply.text()
    assert reply.request.post_data_json == job
    d = reply.json()
    assert d["choice"] in ALL_ACTIONS
    answer = page.locator(f"#playground [data-decision='{d['decision_id']}']")
    answer.wait_for(timeout=30_000)
    shown = " ".join(answer.inner_text().split())
    assert answer.locator("[data-part='choice']").inner_text() == d["choice"]
    assert answer.locator("[data-part='mode']").inner_text() == d["mode"]
    assert f"{d['confidence']:.2f}" in shown, shown
    assert "nothing ran" in shown, shown
    for reason in d["reasons"]:
        assert " ".join(reason.split()) in shown, reason
    for move in d["alternatives"]:  # every alternative's probability
        assert move in shown, (move, shown)
    assert "System 1" in shown and "distance" in shown, shown
    admin.evaluate("() => window.scrollTo(0, 0)")
    box = page.locator("#playground").bounding_box()
    page.screenshot(path=str(screens / "02_playground_answer.png"), full_page=True, clip=box)
    logged = {row["decision_id"] for row in console.get("/v1/audit")["decisions"]}
    assert d["decision_id"] in logged, "the playground's decision is not in the audit log"


CONTROLS_JS = """() => {
  const sel = 'a[href], button, input, select, textarea, summary, [tabindex]:not([tabindex="-1"])';
  const all = [...document.querySelectorAll(sel)].filter(e =>
      e.getClientRects().length > 0 && getComputedStyle(e).visibility !== 'hidden' &&
      !(e.tagName === 'INPUT' && e.type === 'hidden') && !e.closest('[inert]'));
  return all.map((e, i) => {
    e.dataset.c4 = String(i);
    return {i, tag: e.tagName.toLowerCase(), type: e.type || '',
            name: e.getAttribute('name') || '', id: e.id,
            tabbable: !e.disabled && e.tabIndex >= 0,
            html: e.outerHTML.slice(0, 160)};
  });
}"""

FOCUS_JS = """() => {
  const e = document.activeElement;
  if (!e || e === document.body) return null;
  const s = getComputedStyle(e);
  const visible = (s.outlineStyle !== 'none' && parseFloat(s.outlineWidth) > 0) ||
                  (s.boxShadow && s.boxShadow !== 'none');
  return {i: e.dataset.c4 ?? null, visible, html: e.outerHTML.slice(0, 160)};
}"""


def accessible_name(page: Any, i: int) -> tuple[str, str | None]:
    """The role and accessible name chromium's accessibility tree gives control `i`."""
    snapshot = page.locator(f"[data-c4='{i}']").aria_snapshot()
    first = snapshot.strip().splitlines()[0] if snapshot.strip() else ""
    found = re.match(r'^- ([\w-]+)(?: "((?:[^"\\]|\\.)*)")?', first)
    if not found:
        return first, None
    return found.group(1), found.group(2)


def test_every_control_is_labelled_and_reachable_by_keyboard(
    browser: Any, console: Console
) -> None:
    page = login(browser, console)
    try:
        ready(page)
        controls = page.evaluate(CONTROLS_JS)
        assert len(controls) > 20, f"only {len(controls)} controls on the page"
        unlabelled = []
        for c in controls:
            role, name = accessible_name(page, c["i"])
            if not (name or "").strip():
                unlabelled.append(f"{role or '?'}: {c['html']}")
        tabbable = {c["i"]: c for c in controls if c["tabbable"]}
        page.locator("body").focus()
        reached: set[int] = set()
        invisible_focus: list[str] = []
        first: Any = None
        for _ in range(len(controls) * 2 + 20):
            page.keyboard.press("Tab")
            at = page.evaluate(FOCUS_JS)
            if at is None or at["i"] is None:
                continue
            i = int(at["i"])
            if i == first:
                break  # round the page once
            first = i if first is None else first
            reached.add(i)
            if not at["visible"]:
                invisible_focus.append(at["html"])
        groups = {c["name"] for c in controls if c["type"] == "radio" and c["i"] in reached}
        # A control drawn again by a live update during the walk is a new element: only those
        # still on the page count.
        still = set(
            page.evaluate(
                "() => [...document.querySelectorAll('[data-c4]')].map(e => +e.dataset.c4)"
            )
        )
        missed = [
            c["html"]
            for i, c in tabbable.items()
            if i in still
            and i not in reached
            and not (c["type"] == "radio" and c["name"] in groups)
        ]
        assert len(reached) >= 20, f"Tab reached only {len(reached)} controls"
        problems = {
            "without an accessible name": unlabelled,
            "not reached with Tab": missed,
            "focused without a visible focus": invisible_focus,
        }
        assert not any(problems.values()), json.dumps(problems, indent=1, ensure_ascii=False)
    finally:
        page.context.close()


def test_no_uncaught_script_error_in_the_pages(console: Console) -> None:
    assert not SCRIPT_ERRORS, "\n".join(SCRIPT_ERRORS)


def test_the_api_docs_render_under_the_csp(browser: Any, console: Console) -> None:
    """/docs (Swagger UI, vendored, started by static/docs.js) renders under the same CSP as
    every page: no inline script, nothing from elsewhere, no violation reported."""
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    try:
        reply = page.goto(console.base + "/docs")
        assert (
            reply is not None
            and "frame-ancestors 'none'" in reply.headers["content-security-policy"]
        )
        page.wait_for_selector(".swagger-ui .opblock", timeout=READY_MS)
        assert page.locator(".swagger-ui .opblock").count() > 10
        assert "/v1/decide" in page.inner_text(".swagger-ui")
        assert not problems, problems
    finally:
        context.close()
