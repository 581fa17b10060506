// Devices and task placement: how to connect a device (the join command only for an admin on
// the coordinator itself), the devices, a task form, the tasks and where each went and why, and
// a timeline of the tasks per device. Live on task.*, device.*, model.* and measurement.*.
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

const TASKS_SHOWN = 100;
const REFRESH_S = 15; // heartbeats are not events: the devices' liveness is read this often

const STATUS_CLASS = {
  online: "ok",
  busy: "ok",
  offline: "bad",
  draining: "warn",
  left: "",
  submitted: "",
  waiting: "warn",
  placed: "",
  running: "ok",
  finished: "ok",
  failed: "bad",
};

const badge = (status) => el("span", { class: `badge ${STATUS_CLASS[status] || ""}` }, status);
const shortId = (id) => (id && id.length > 12 ? `${id.slice(0, 12)}…` : id);

function hardware(h) {
  const parts = [];
  if (h.cpu_model) parts.push(h.cpu_model);
  const cores = [];
  if (h.cores) cores.push(`${h.cores} cores`);
  if (h.logical_cpus) cores.push(`${h.logical_cpus} threads`);
  if (cores.length) parts.push(cores.join(" / "));
  if (h.memory_gib !== null && h.memory_gib !== undefined) parts.push(`${h.memory_gib} GiB`);
  if (h.gpus && h.gpus.length) parts.push(`GPU: ${h.gpus.join(", ")}`);
  return parts.length ? parts.join(" · ") : "—";
}

function kernels(measured) {
  if (!measured.length) return el("span", { class: "muted" }, "none yet");
  return el(
    "ul",
    { class: "plain" },
    measured.map((k) =>
      el(
        "li",
        { title: `sizes ${k.sizes.join(", ")}` },
        el("strong", {}, k.workload),
        ` ${k.sizes.length} size${k.sizes.length === 1 ? "" : "s"}, ${k.correct_runs}/${k.runs} correct`
      )
    )
  );
}

function deviceRow(d) {
  const model = d.model
    ? [
        `${d.model.trained_on} runs`,
        el("br"),
        el("span", { class: "muted" }, `${d.model.model_version} · ${fmtTime(d.model.published_at)}`),
      ]
    : el("span", { class: "muted" }, "no model yet");
  let working = "—";
  if (d.working_on) {
    const w = d.working_on;
    working = [w.workload ? `${w.workload} ${w.size ?? ""}`.trim() : "a task", " ", el("code", { title: w.task_id }, shortId(w.task_id))];
  }
  if (d.queued) working = [working, el("br"), el("span", { class: "muted" }, `${d.queued} queued`)];
  const heard =
    d.last_heartbeat_s !== null && d.last_heartbeat_s !== undefined && d.status !== "offline"
      ? el("span", { class: "muted" }, ` heard ${fmtSeconds(d.last_heartbeat_s)} ago`)
      : null;
  return el(
    "tr",
    { dataset: { device: d.device_id } },
    el(
      "td",
      {},
      el("strong", {}, d.hostname),
      d.local ? el("span", { class: "muted" }, " (this coordinator)") : null,
      el("br"),
      el("code", { class: "muted" }, d.device_id)
    ),
    el(
      "td",
      {},
      badge(d.status),
      d.status_reason ? el("div", { class: "muted" }, d.status_reason) : heard,
      d.off_estimates
        ? el(
            "div",
            { class: "error", title: d.off_estimate || "" },
            `${d.off_estimates} result${d.off_estimates === 1 ? "" : "s"} far from its own estimate`
          )
        : null
    ),
    el("td", {}, hardware(d.hardware)),
    el("td", {}, kernels(d.measured)),
    el("td", {}, model),
    el("td", {}, working)
  );
}

function placedCell(t) {
  if (t.placement) {
    const p = t.placement;
    return [
      el("strong", {}, p.device_id),
      p.config ? el("span", { class: "muted" }, ` · ${fmtConfig(p.config)}`) : null,
      el("div", { class: "why" }, p.reason || "—"),
      p.runner_up ? el("div", { class: "muted" }, `runner-up: ${p.runner_up}`) : null,
    ];
  }
  if (t.waiting_for) return el("span", { class: "muted" }, `waiting: ${t.waiting_for}`);
  return el("span", { class: "muted" }, "not placed yet");
}

function resultCell(t) {
  if (t.result) {
    const r = t.result;
    const vs = r.expected_s ? ` (expected ${fmtSeconds(r.expected_s)})` : "";
    const off = r.off_estimate ? el("div", { class: "error" }, `flagged: ${r.off_estimate}`) : null;
    return [el("strong", {}, fmtSeconds(r.runtime_s)), vs, off];
  }
  if (t.status === "failed" && t.failures.length) {
    return el("span", { class: "error" }, t.failures[t.failures.length - 1]);
  }
  if (t.failures.length) {
    return el("span", { class: "muted" }, `earlier attempt: ${t.failures[t.failures.length - 1]}`);
  }
  return "—";
}

function taskRow(t) {
  return el(
    "tr",
    { dataset: { task: t.task_id } },
    el(
      "td",
      {},
      el("code", { title: t.task_id }, shortId(t.task_id)),
      el("div", { class: "muted" }, `${fmtTime(t.submitted_at)} · ${t.submitted_by}`)
    ),
    el("td", {}, `${t.workload} · ${t.size}`),
    el("td", {}, placedCell(t)),
    el("td", {}, badge(t.status), t.attempt > 1 ? el("div", { class: "muted" }, `attempt ${t.attempt}`) : null),
    el("td", {}, resultCell(t))
  );
}

// --- timeline ----------------------------------------------------------------------------

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined) node.setAttribute(k, String(v));
  for (const c of children) node.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
  return node;
}

const ms = (iso) => (iso ? new Date(iso).getTime() : null);

/** Lanes of tasks per device from their placed/started/finished times; the SVG is drawn to the
 *  width of its box. Tasks never placed are not on it (the table says what they wait for). */
function timeline(box, devices, tasks) {
  const now = Date.now();
  const bars = [];
  for (const t of tasks) {
    if (!t.placement || !t.placed_at) continue;
    const placed = ms(t.placed_at);
    const started = ms(t.started_at);
    let end = now;
    if (t.status === "finished") end = ms(t.finished_at) ?? ms(t.updated_at);
    else if (t.status === "failed") end = ms(t.updated_at);
    bars.push({ t, device: t.placement.device_id, placed, started, end });
  }
  box.replaceChildren();
  if (!bars.length) {
    box.appendChild(el("p", { class: "muted" }, "No task has been placed yet."));
    return;
  }
  const lanes = devices.map((d) => d.device_id);
  for (const b of bars) if (!lanes.includes(b.device)) lanes.push(b.device);
  const used = lanes.filter((id) => bars.some((b) => b.device === id));
  const start = Math.min(...bars.map((b) => b.placed));
  const stop = Math.max(start + 1000, ...bars.map((b) => b.end));
  const labelW = 170;
  const width = Math.max(480, box.clientWidth || 900);
  const laneH = 26;
  const top = 6;
  const axisH = 22;
  const height = top + used.length * laneH + axisH;
  const x = (t) => labelW + ((t - start) / (stop - start)) * (width - labelW - 10);
  const summary = `${bars.length} tasks on ${used.length} devices, from ${fmtTime(new Date(start))} to ${fmtTime(new Date(stop))} UTC`;
  const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": summary, class: "fleet-lanes" });
  root.appendChild(svg("title", {}, summary));
  used.forEach((id, i) => {
    const y = top + i * laneH;
    root.appendChild(svg("rect", { x: 0, y, width, height: laneH, class: i % 2 ? "lane odd" : "lane" }));
    root.appendChild(svg("text", { x: 6, y: y + laneH / 2 + 4, class: "lane-label" }, id.length > 22 ? `${id.slice(0, 21)}…` : id));
    for (const b of bars.filter((bar) => bar.device === id)) {
      const runFrom = b.started ?? b.end;
      const what = `${b.t.workload} ${b.t.size} · ${b.t.status} · placed ${fmtTime(new Date(b.placed))}` +
        (b.started ? `, started ${fmtTime(new Date(b.started))}` : "") +
        (b.t.status === "finished" || b.t.status === "failed" ? `, ended ${fmtTime(new Date(b.end))}` : "") +
        (b.t.result ? ` · ${fmtSeconds(b.t.result.runtime_s)}` : "");
      const g = svg("g", { class: `bar ${b.t.status}` }, svg("title", {}, what));
      const wait = Math.max(1, x(runFrom) - x(b.placed));
      g.appendChild(svg("rect", { x: x(b.placed), y: y + 7, width: wait, height: laneH - 14, class: "queued" }));
      if (b.started) {
        g.appendChild(svg("rect", { x: x(b.started), y: y + 4, width: Math.max(2, x(b.end) - x(b.started)), height: laneH - 8, class: "run" }));
      }
      root.appendChild(g);
    }
  });
  const axisY = top + used.length * laneH;
  root.appendChild(svg("line", { x1: labelW, x2: width - 10, y1: axisY, y2: axisY, class: "axis" }));
  for (let k = 0; k <= 4; k += 1) {
    const t = start + ((stop - start) * k) / 4;
    root.appendChild(svg("text", { x: x(t), y: axisY + 15, class: "tick", "text-anchor": k === 0 ? "start" : k === 4 ? "end" : "middle" }, fmtTime(new Date(t)).slice(11)));
  }
  box.appendChild(root);
}

// --- the section -------------------------------------------------------------------------

export async function init(root) {
  const part = (name) => root.querySelector(`[data-part="${name}"]`);
  const me = await whoami();
  const state = { devices: [], tasks: [] };

  const loadDevices = async () => {
    try {
      const { devices } = await api("/v1/devices");
      state.devices = devices;
      const body = part("devices");
      body.replaceChildren(
        ...(devices.length
          ? devices.map(deviceRow)
          : [el("tr", { class: "empty" }, el("td", { colspan: 6 }, "No device yet: run `hpc-ds1 setup --quick` here, or connect one as above."))])
      );
      timeline(part("timeline"), state.devices, state.tasks);
    } catch (error) {
      part("devices").replaceChildren(el("tr", {}, el("td", { colspan: 6, class: "error" }, error.message)));
    }
  };

  const loadTasks = async () => {
    try {
      const { tasks } = await api(`/v1/tasks?limit=${TASKS_SHOWN}`);
      state.tasks = tasks;
      part("tasks").replaceChildren(
        ...(tasks.length
          ? tasks.map(taskRow)
          : [el("tr", { class: "empty" }, el("td", { colspan: 5 }, "No task yet."))])
      );
      timeline(part("timeline"), state.devices, state.tasks);
    } catch (error) {
      part("tasks").replaceChildren(el("tr", {}, el("td", { colspan: 5, class: "error" }, error.message)));
    }
  };

  // The join command: only an admin's browser on the coordinator gets it (the server checks).
  if (me && me.role === "admin") {
    try {
      const join = await api("/v1/fleet/join-token");
      part("join-actions").hidden = false;
      if (join.problem) {
        // Expired or used up: no dead command to copy, but how to make a new one.
        part("join-copy").hidden = true;
        part("join-copied").textContent = join.problem;
      } else {
        const limits = [
          join.expires_at ? `Expires ${fmtTime(join.expires_at)}` : "",
          join.uses_left != null ? `${join.uses_left} of ${join.max_uses} uses left` : "",
        ]
          .filter(Boolean)
          .join(" · ");
        part("join-command").textContent = join.command;
        part("join-copied").textContent = limits;
        part("join-copy").addEventListener("click", async () => {
          try {
            await navigator.clipboard.writeText(join.command);
            part("join-copied").textContent = `Copied. ${limits}`;
          } catch {
            part("join-copied").textContent = "Select the command and copy it.";
          }
        });
      }
    } catch {
      // Not on this machine (or no join token yet): the placeholder and the sentence stay.
    }
  }

  // The task form.
  const form = part("submit");
  const select = form.querySelector("select[name=workload]");
  const size = form.querySelector("input[name=size]");
  const help = part("size-help");
  const said = part("submit-status");
  let bounds = {};
  try {
    const { workloads } = await api("/v1/workloads");
    bounds = Object.fromEntries(workloads.map((w) => [w.name, w]));
    select.replaceChildren(...workloads.map((w) => el("option", { value: w.name }, w.name)));
    // The job measured on this machine (the page's example), so the form runs as it is.
    if (form.dataset.workload && offersWorkload(workloads, form.dataset.workload)) {
      select.value = form.dataset.workload;
      if (form.dataset.size) size.value = form.dataset.size;
    }
  } catch (error) {
    said.textContent = `The workloads could not be read: ${error.message}`;
  }
  const showBounds = () => {
    const w = bounds[select.value];
    if (!w) return;
    size.min = String(w.min_size);
    size.max = String(w.max_size);
    help.textContent = `Sizes ${w.min_size} to ${w.max_size}. The coordinator places it on the device expected to finish it first.`;
  };
  select.addEventListener("change", showBounds);
  showBounds();
  if (!canAct(me && me.role)) {
    for (const control of form.querySelectorAll("select, input, button")) control.disabled = true;
    said.textContent = `Submitting a task needs an engineer token; you are signed in as ${me ? me.role : "nobody"}.`;
  }
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = form.querySelector("button[type=submit]");
    button.disabled = true;
    said.textContent = "Submitting…";
    said.className = "";
    try {
      const task = await api("/v1/tasks", {
        method: "POST",
        body: { workload: select.value, size: Number(size.value) },
      });
      said.textContent = `Task ${task.task_id} submitted: ${task.workload} · ${task.size} (${task.status}).`;
      loadTasks();
    } catch (error) {
      said.textContent = error.message;
      said.className = "error";
    } finally {
      button.disabled = false;
    }
  });

  await Promise.all([loadDevices(), loadTasks()]);

  const devicesSoon = refresher(loadDevices);
  const tasksSoon = refresher(loadTasks);
  onEvent("task.", () => {
    tasksSoon();
    devicesSoon(); // what a device works on and its queue
  });
  for (const prefix of ["device.", "model.", "measurement."]) onEvent(prefix, devicesSoon);
  onReconnect(() => {
    loadDevices();
    loadTasks();
  });
  setInterval(() => {
    if (!document.hidden) loadDevices();
  }, REFRESH_S * 1000);
  let width = part("timeline").clientWidth;
  window.addEventListener("resize", () => {
    const now = part("timeline").clientWidth;
    if (now !== width) {
      width = now;
      timeline(part("timeline"), state.devices, state.tasks);
    }
  });
}
