// Tune a job on this machine: a form to start a tuning session (engineer), the sessions, and
// the steps of the one chosen (the newest at first), live, with a plot of the runtime of each
// step: the baseline, kept moves and reverted ones marked. Live on session.* events. A run
// in flight shows what runs, for how long and against which timeout (its run.heartbeat events,
// the time ticking between them); an engineer cancels a session that has not finished (its run
// killed, the whole process group), and who cancelled it is shown.
import {
  api,
  canAct,
  el,
  fmtConfig,
  fmtSeconds,
  fmtTime,
  offersWorkload,
  onEvent,
  onReconnect,
  refresher,
  whoami,
} from "../console.js";

const SESSIONS_SHOWN = 50;

const STATUS_CLASS = { running: "ok", paused: "warn", finished: "" };
const FINISH = {
  stop: "the model said stop",
  two_misses: "two misses in a row",
  rejected: "a move was rejected",
  no_moves: "no move left to try",
  failed: "failed",
  interrupted: "interrupted",
};

/** The run in flight (a run.heartbeat's data, `at`: when it came, ms) as a line and a bar:
 *  what runs, for how long, the share of its timeout gone. */
export function runningNow(beat, now = Date.now()) {
  const elapsed = beat.elapsed_s + Math.max(0, (now - beat.at) / 1000);
  const limit = typeof beat.timeout_s === "number" ? beat.timeout_s : null;
  const text =
    `Running now: ${fmtConfig(beat.config)} for ${fmtSeconds(elapsed)}` +
    (limit ? ` of its ${fmtSeconds(limit)} timeout` : "") +
    (beat.total ? ` (run ${beat.done + 1} of ${beat.total})` : "");
  return { elapsed, limit, text };
}

/** Which heartbeat to show: the one GET /v1/sessions/{id} read from the projection (`running`,
 *  null: none since the last step ran), unless the live one already shown is of the same run
 *  and newer (the projection folds a little behind the live stream). */
export function fresher(shown, running, sessionId) {
  if (!running) return null;
  const sameRun = shown && shown.session_id === sessionId && JSON.stringify(shown.config) === JSON.stringify(running.config);
  if (sameRun && shown.beat >= running.beat) return shown;
  return { ...running, at: Date.now() };
}

/** The session's steps from its events: step 0 is the baseline run; each later step is a move
 *  decided, maybe waiting for an engineer, run, then kept or reverted. */
export function steps(events) {
  const byStep = new Map();
  const at = (n) => {
    if (!byStep.has(n)) byStep.set(n, { step: n });
    return byStep.get(n);
  };
  const approvals = new Map(); // approval id -> step
  let finished = null;
  for (const e of events) {
    const d = e.data || {};
    switch (e.type) {
      case "session.step_run":
        Object.assign(at(d.step), { move: d.move ?? at(d.step).move, config: d.config, status: d.status, runtime_s: d.runtime_s, ran_at: e.time });
        break;
      case "session.move_decided":
        Object.assign(at(d.step), { move: d.move, confidence: d.confidence, mode: d.mode, reasons: d.reasons || [], from: d.config });
        break;
      case "session.move_resolved":
        Object.assign(at(d.step), { kept: d.kept, config: d.config, runtime_s: d.runtime_s ?? at(d.step).runtime_s, best_before: d.best_runtime_s });
        break;
      case "session.paused":
        Object.assign(at(d.step), { waiting: true, approval_id: d.approval_id });
        approvals.set(d.approval_id, d.step);
        break;
      case "session.resumed": {
        const n = approvals.get(d.approval_id);
        if (n !== undefined) Object.assign(at(n), { waiting: false, approved: d.approved });
        break;
      }
      case "session.finished":
        finished = d;
        break;
      default:
    }
  }
  const list = [...byStep.values()].sort((a, b) => a.step - b.step);
  for (const s of list) {
    if (s.step === 0) s.outcome = "baseline";
    else if (s.kept === true) s.outcome = "kept";
    else if (s.kept === false) s.outcome = "reverted";
    else if (s.approved === false) s.outcome = "rejected";
    else if (s.waiting) s.outcome = "waiting for an engineer";
    else if (s.status && s.status !== "ok") s.outcome = "failed";
    else if (s.runtime_s === undefined && finished) s.outcome = s.move === "STOP" ? "stop" : "not run";
    else if (s.runtime_s === undefined) s.outcome = "running…";
    else s.outcome = "measured";
  }
  return { list, finished };
}

const OUTCOME_CLASS = { kept: "ok", reverted: "bad", rejected: "bad", failed: "bad", "waiting for an engineer": "warn" };

// --- the plot ----------------------------------------------------------------------------

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined) node.setAttribute(k, String(v));
  for (const c of children) node.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
  return node;
}

/** Runtime per step: the baseline, each kept move (filled) and each reverted one (a cross),
 *  with the best runtime so far as a step line. */
function plot(list) {
  const points = list.filter((s) => typeof s.runtime_s === "number" && Number.isFinite(s.runtime_s));
  if (!points.length) return el("p", { class: "muted" }, "No step has run yet.");
  const width = 560;
  const height = 220;
  const left = 64;
  const right = 14;
  const top = 12;
  const bottom = 34;
  const maxStep = Math.max(1, ...list.map((s) => s.step));
  const ys = points.map((s) => s.runtime_s);
  let lo = Math.min(...ys);
  let hi = Math.max(...ys);
  if (hi === lo) {
    hi *= 1.1;
    lo *= 0.9;
  }
  const pad = (hi - lo) * 0.08;
  lo = Math.max(0, lo - pad);
  hi += pad;
  const x = (step) => left + (step / maxStep) * (width - left - right);
  const y = (v) => top + (1 - (v - lo) / (hi - lo)) * (height - top - bottom);
  const kept = points.filter((s) => s.outcome === "kept").length;
  const reverted = points.filter((s) => s.outcome === "reverted").length;
  const summary =
    `Runtime per step: baseline ${fmtSeconds(points[0].runtime_s)}, ${kept} moves kept, ` +
    `${reverted} reverted, best ${fmtSeconds(Math.min(...points.filter((s) => s.outcome !== "reverted").map((s) => s.runtime_s)))}`;
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-label": summary, class: "session-plot" });
  root.appendChild(svg("title", {}, summary));
  // axes and ticks
  root.appendChild(svg("line", { x1: left, x2: width - right, y1: height - bottom, y2: height - bottom, class: "axis" }));
  root.appendChild(svg("line", { x1: left, x2: left, y1: top, y2: height - bottom, class: "axis" }));
  for (let k = 0; k <= 3; k += 1) {
    const v = lo + ((hi - lo) * k) / 3;
    root.appendChild(svg("line", { x1: left, x2: width - right, y1: y(v), y2: y(v), class: "grid" }));
    root.appendChild(svg("text", { x: left - 6, y: y(v) + 4, "text-anchor": "end", class: "tick" }, fmtSeconds(v)));
  }
  const every = Math.ceil((maxStep + 1) / 12);
  for (let step = 0; step <= maxStep; step += every) {
    root.appendChild(svg("text", { x: x(step), y: height - bottom + 15, "text-anchor": "middle", class: "tick" }, String(step)));
  }
  root.appendChild(svg("text", { x: (left + width - right) / 2, y: height - 4, "text-anchor": "middle", class: "tick" }, "step"));
  // best so far
  let best = null;
  const path = [];
  for (const s of points) {
    if (s.outcome === "reverted" || s.outcome === "failed") continue;
    if (best === null || s.runtime_s < best) {
      if (best !== null) path.push(`L${x(s.step)},${y(best)}`);
      best = s.runtime_s;
      path.push(`${path.length ? "L" : "M"}${x(s.step)},${y(best)}`);
    }
  }
  if (best !== null) {
    path.push(`L${x(maxStep)},${y(best)}`);
    root.appendChild(svg("path", { d: path.join(" "), class: "best" }));
  }
  for (const s of points) {
    const cx = x(s.step);
    const cy = y(s.runtime_s);
    const label = `step ${s.step}${s.move ? ` ${s.move}` : ""}: ${fmtSeconds(s.runtime_s)}, ${s.outcome}`;
    let mark;
    if (s.outcome === "reverted" || s.outcome === "failed") {
      mark = svg("path", { d: `M${cx - 5},${cy - 5} L${cx + 5},${cy + 5} M${cx - 5},${cy + 5} L${cx + 5},${cy - 5}`, class: "mark reverted" });
    } else {
      mark = svg("circle", { cx, cy, r: 5, class: `mark ${s.outcome === "baseline" ? "baseline" : "kept"}` });
    }
    root.appendChild(svg("g", {}, svg("title", {}, label), mark));
  }
  return root;
}

// --- the section -------------------------------------------------------------------------

export async function init(root) {
  const part = (name) => root.querySelector(`[data-part="${name}"]`);
  const me = await whoami();
  let selected = null;
  let sessions = [];
  let beat = null; // the selected session's run in flight: its last heartbeat, and when it came

  function drawRunning() {
    const box = root.querySelector("[data-part=running]");
    if (!box) return;
    if (!beat) {
      box.hidden = true;
      return;
    }
    const { elapsed, limit, text } = runningNow(beat);
    box.hidden = false;
    box.querySelector(".running-text").textContent = text;
    const bar = box.querySelector("progress");
    if (limit) {
      bar.hidden = false;
      bar.max = limit;
      bar.value = Math.min(elapsed, limit);
    } else bar.hidden = true;
  }
  setInterval(drawRunning, 1000); // the time in flight ticks between heartbeats

  function cancelForm(session) {
    const reasonId = `session-cancel-reason-${session.session_id}`;
    const reason = el("input", { id: reasonId, name: "reason", type: "text", maxlength: "2000", class: "session-cancel-reason", placeholder: "reason (optional)" });
    const button = el("button", { type: "submit", class: "secondary" }, "Cancel session");
    const said = el("span", { "data-part": "cancel-status", role: "status" });
    const form = el(
      "form",
      { class: "session-cancel form-row", "data-part": "cancel", "aria-label": `Cancel session ${session.session_id}` },
      el("label", { for: reasonId, class: "visually-hidden" }, `Why cancel session ${session.session_id}`),
      reason,
      button,
      said
    );
    if (!canAct(me && me.role)) {
      reason.disabled = true;
      button.disabled = true;
      said.textContent = `Cancelling a session needs an engineer token; you are signed in as ${me ? me.role : "nobody"}.`;
    }
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      button.disabled = true;
      said.className = "";
      said.textContent = "Cancelling…";
      try {
        const asked = await api(`/v1/sessions/${encodeURIComponent(session.session_id)}/cancel`, { method: "POST", body: { reason: reason.value } });
        said.textContent = `Cancelled by ${asked.by}: its run is being killed.`;
      } catch (error) {
        said.className = "error";
        said.textContent = error.message;
        button.disabled = false;
      }
    });
    return form;
  }

  function sessionRow(s) {
    const chosen = s.session_id === selected;
    const open = el(
      "button",
      { type: "button", class: "link", "aria-pressed": chosen ? "true" : "false", "aria-label": `Show the steps of session ${s.session_id}` },
      s.session_id
    );
    open.addEventListener("click", () => choose(s.session_id));
    let result = "—";
    if (typeof s.best_runtime_s === "number") {
      result = [
        el("strong", {}, fmtSeconds(s.best_runtime_s)),
        typeof s.start_runtime_s === "number" ? ` from ${fmtSeconds(s.start_runtime_s)}` : "",
        typeof s.speedup === "number" ? ` (×${s.speedup.toFixed(2)})` : "",
        el("div", { class: "muted" }, `${fmtConfig(s.best_config)} · ${s.real_runs} real runs`),
      ];
    } else if (s.real_runs) result = `${s.real_runs} real runs`;
    const tr = el(
      "tr",
      { class: chosen ? "selected" : null, dataset: { session: s.session_id } },
      el("td", {}, open),
      el("td", {}, `${s.workload} · ${s.size}`, el("div", { class: "muted" }, `from ${fmtConfig(s.start)} on ${s.device_id}`)),
      el(
        "td",
        {},
        el("span", { class: `badge ${STATUS_CLASS[s.status] ?? ""}` }, s.status),
        s.finish_reason ? el("div", { class: "muted" }, FINISH[s.finish_reason] || s.finish_reason) : null
      ),
      el("td", {}, result),
      el("td", {}, fmtTime(s.started_at), el("div", { class: "muted" }, s.owner))
    );
    tr.addEventListener("click", (event) => {
      if (event.target.closest("button, a, input, select")) return;
      choose(s.session_id);
    });
    return tr;
  }

  async function loadList() {
    const body = part("sessions");
    try {
      ({ sessions } = await api(`/v1/sessions?limit=${SESSIONS_SHOWN}`));
      if (!selected && sessions.length) {
        const live = sessions.find((s) => s.status !== "finished");
        selected = (live || sessions[0]).session_id;
        loadDetail();
      }
      body.replaceChildren(
        ...(sessions.length
          ? sessions.map(sessionRow)
          : [el("tr", { class: "empty" }, el("td", { colspan: 5 }, "No session yet."))])
      );
    } catch (error) {
      body.replaceChildren(el("tr", {}, el("td", { colspan: 5, class: "error" }, error.message)));
    }
  }

  async function loadDetail() {
    const box = part("detail");
    if (!selected) return;
    const id = selected;
    try {
      const session = await api(`/v1/sessions/${encodeURIComponent(id)}`);
      if (id !== selected) return; // another was chosen meanwhile
      const { list, finished } = steps(session.events || []);
      beat = fresher(beat, finished || session.status === "finished" ? null : session.running, id);
      const rows = list.map((s) =>
        el(
          "tr",
          { dataset: { step: s.step } },
          el("td", { class: "num" }, String(s.step)),
          el("td", {}, s.step === 0 ? "— (start)" : s.move || "—",
            typeof s.confidence === "number" ? el("span", { class: "muted" }, ` ${s.confidence.toFixed(2)} ${s.mode}`) : null),
          el("td", {}, fmtConfig(s.config || s.from)),
          el("td", { class: "num" }, typeof s.runtime_s === "number" ? fmtSeconds(s.runtime_s) : "—"),
          el("td", {}, el("span", { class: `badge ${OUTCOME_CLASS[s.outcome] || ""}` }, s.outcome),
            typeof s.approved === "boolean" ? el("span", { class: "muted" }, s.approved ? " (approved by an engineer)" : " (rejected by an engineer)") : null)
        )
      );
      const end = finished
        ? el("p", {}, `Finished: ${FINISH[finished.reason] || finished.reason}${finished.detail ? ` — ${finished.detail}` : ""}.`,
            typeof finished.speedup === "number" ? ` Best ${fmtSeconds(finished.best_runtime_s)} (×${finished.speedup.toFixed(2)}) with ${fmtConfig(finished.best_config)}.` : "")
        : el("p", { class: "muted" }, session.status === "paused" ? "Paused: a move waits for an engineer (above)." : "Running: steps appear as they run.");
      const typed = box.querySelector("input.session-cancel-reason");
      const cancelled = session.cancel
        ? el("p", { class: "session-cancelled", "data-part": "cancelled" },
            `Cancelled by ${session.cancel.by} (${session.cancel.role}) at ${fmtTime(session.cancel.time)}`,
            session.cancel.reason ? `: ${session.cancel.reason}` : "", ".")
        : null;
      const cancel = !finished && session.status !== "finished" && !session.cancel ? cancelForm(session) : null;
      if (cancel && typed && typed.value) cancel.querySelector("input.session-cancel-reason").value = typed.value;
      box.replaceChildren(
        el("h3", { id: "session-steps-title" }, `Session ${id}: ${session.workload} · ${session.size}`),
        end,
        cancelled,
        el("div", { class: "session-running", "data-part": "running", role: "status", hidden: true },
          el("span", { class: "running-text" }),
          el("progress", { "aria-label": "Share of the run's timeout gone", hidden: true })),
        cancel,
        el("figure", { class: "session-figure" }, plot(list),
          el("figcaption", { class: "muted" }, "Runtime of each step: ● baseline and kept moves, ✕ reverted; the line is the best so far.")),
        el("div", { class: "table-wrap" },
          el("table", { class: "data session-steps", "aria-labelledby": "session-steps-title" },
            el("thead", {}, el("tr", {}, ["Step", "Move", "Configuration", "Runtime", "Outcome"].map((h, i) => el("th", { scope: "col", class: i === 0 || i === 3 ? "num" : null }, h)))),
            el("tbody", {}, rows.length ? rows : el("tr", { class: "empty" }, el("td", { colspan: 5 }, "No step yet.")))))
      );
      drawRunning();
    } catch (error) {
      box.replaceChildren(el("p", { class: "error" }, `Session ${id}: ${error.message}`));
    }
  }

  function choose(id) {
    selected = id;
    beat = null;
    for (const tr of part("sessions").querySelectorAll("tr[data-session]")) {
      const on = tr.dataset.session === id;
      tr.classList.toggle("selected", on);
      tr.querySelector("button")?.setAttribute("aria-pressed", on ? "true" : "false");
    }
    loadDetail();
  }

  // The start form.
  const form = part("start");
  const said = part("start-status");
  const select = form.querySelector("select[name=workload]");
  const size = form.querySelector("input[name=size]");
  try {
    const { workloads } = await api("/v1/workloads");
    select.replaceChildren(...workloads.map((w) => el("option", { value: w.name }, w.name)));
    // The job measured on this machine (the page's example), so the form runs as it is.
    if (form.dataset.workload && offersWorkload(workloads, form.dataset.workload)) {
      select.value = form.dataset.workload;
      if (form.dataset.size) size.value = form.dataset.size;
    }
    const bounds = Object.fromEntries(workloads.map((w) => [w.name, w]));
    const show = () => {
      const w = bounds[select.value];
      if (w) size.min = String(w.min_size);
    };
    select.addEventListener("change", show);
    show();
  } catch (error) {
    said.textContent = `The workloads could not be read: ${error.message}`;
  }
  if (!canAct(me && me.role)) {
    for (const control of form.querySelectorAll("select, input, button")) control.disabled = true;
    said.textContent = `Starting a session needs an engineer token; you are signed in as ${me ? me.role : "nobody"}.`;
  }
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const body = { workload: data.get("workload"), size: Number(data.get("size")) };
    const ranks = data.get("ranks");
    const threads = data.get("threads");
    const tile = data.get("tile");
    const gpu = data.get("gpu") === "on";
    said.className = "";
    if (ranks || threads || tile || gpu) {
      if (!ranks || !threads) {
        said.className = "error";
        said.textContent = "A start configuration needs ranks and threads (or leave it all empty for the default).";
        return;
      }
      body.start = { ranks: Number(ranks), threads: Number(threads), gpu };
      if (tile) body.start.tile = Number(tile);
    }
    const button = form.querySelector("button[type=submit]");
    button.disabled = true;
    said.textContent = "Starting…";
    try {
      const started = await api("/v1/sessions", { method: "POST", body });
      said.textContent = `Session ${started.session_id} started on ${started.device_id} from ${fmtConfig(started.start)}.`;
      selected = started.session_id;
      await loadList();
      loadDetail();
    } catch (error) {
      said.className = "error";
      said.textContent = error.message;
    } finally {
      button.disabled = false;
    }
  });

  await loadList();
  const listSoon = refresher(loadList);
  const detailSoon = refresher(loadDetail);
  onEvent("session.", (envelope) => {
    listSoon();
    if (envelope.data && envelope.data.session_id === selected) detailSoon();
  });
  // A step's run in flight (run.heartbeat, every HPC_DS1_RUN_HEARTBEAT_S while it lasts).
  onEvent("run.heartbeat", (envelope) => {
    const d = envelope.data || {};
    if (!d.session_id || d.session_id !== selected) return;
    beat = { ...d, at: Date.now() };
    drawRunning();
  });
  // A cancel (who cancelled) shows in the session's view.
  onEvent("cancel.", (envelope) => {
    if (envelope.data && envelope.data.session_id === selected) detailSoon();
  });
  onReconnect(() => {
    loadList();
    loadDetail();
  });
}
