// This machine: the model decisions use here (GET /v1/model), what was measured here and the
// guard's allowed size range per kernel (GET /v1/measurements/summary), and a setup's progress
// while one runs. Live: measurement.recorded and model.published refresh it (a setup records a
// measurement every few seconds: at most one read per second, one request in flight).
import { api, el, fmtTime, onEvent, onReconnect } from "../console.js";

function sizes(list) {
  return list.map((s) => s.toLocaleString("en-US")).join(", ");
}

function value(v) {
  if (typeof v === "number") return Number.isInteger(v) ? v.toLocaleString("en-US") : String(Math.round(v * 1e4) / 1e4);
  return String(v);
}

export function renderModel(m) {
  const rows = [
    ["Name", m.name],
    ["Thresholds", `auto ≥ ${m.thresholds.auto} · escalate < ${m.thresholds.escalate}`],
    ["Device", `${m.hostname} (${m.device_id})`],
  ];
  if (!m.model) {
    return el(
      "div",
      {},
      el("dl", { class: "machine-facts" }, rows.map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)])),
      el("p", { class: "section-error", role: "note" }, m.missing || "No model yet.")
    );
  }
  const model = m.model;
  const kernels = Object.entries(model.workloads || {})
    .map(([w, n]) => `${w} (${n} size${n === 1 ? "" : "s"})`)
    .join(", ");
  rows.push(
    ["Version", el("code", { "data-part": "version" }, model.version)],
    ["Trained", fmtTime(model.published_at) + " UTC"],
    ["Trained on", `${model.trained_on.toLocaleString("en-US")} measurements${kernels ? ` of ${kernels}` : ""}`],
    ["Models published here", String(m.models_published)]
  );
  return el(
    "div",
    {},
    el("dl", { class: "machine-facts" }, rows.map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)])),
    model.summary.length
      ? el(
          "div",
          { class: "table-wrap" },
          el(
            "table",
            { class: "data machine-metrics" },
            el("caption", {}, "Its metrics (from training; leave-one-size-out cross-validation unless said)"),
            el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "Metric"), el("th", { scope: "col", class: "num" }, "Value"))),
            el(
              "tbody",
              {},
              model.summary.map((s) => el("tr", { dataset: { metric: s.key } }, el("td", {}, s.label), el("td", { class: "num" }, value(s.value))))
            )
          )
        )
      : el("p", { class: "muted" }, "The model carries no metrics.")
  );
}

export function measuredRows(summary) {
  if (!summary.kernels.length) {
    return [el("tr", { class: "empty" }, el("td", { colspan: 4 }, "Nothing measured here yet: run hpc-ds1 setup --quick."))];
  }
  return summary.kernels.map((k) =>
    el(
      "tr",
      { dataset: { kernel: k.kernel } },
      el("td", {}, el("code", {}, k.kernel)),
      el(
        "td",
        {},
        k.sizes.length ? sizes(k.sizes) : "—",
        k.held_out_sizes.length ? el("span", { class: "muted" }, ` · held out for evaluation: ${sizes(k.held_out_sizes)}`) : null
      ),
      el("td", { class: "num" }, `${k.correct_runs.toLocaleString("en-US")} of ${k.runs.toLocaleString("en-US")}`),
      el(
        "td",
        {},
        k.guard_range
          ? `${k.guard_range[0].toLocaleString("en-US")} – ${k.guard_range[1].toLocaleString("en-US")}`
          : el("span", { class: "muted" }, summary.model_version ? "not trained on: escalated" : "no model yet")
      )
    )
  );
}

export function renderSetup(setup) {
  if (!setup) return [];
  const planned = setup.planned || {};
  const goal = planned.quick && setup.measured <= planned.quick ? planned.quick : planned.full;
  const kernels = Object.entries(setup.by_kernel)
    .map(([k, n]) => `${k} ${n}`)
    .join(" · ");
  const title = setup.running ? "A setup is running" : "Measured since the last model";
  const plan = [];
  if (planned.quick) plan.push(`setup --quick plans ${planned.quick}`);
  if (planned.full) plan.push(`setup plans ${planned.full}`);
  return [
    el("h3", { id: "machine-progress-title" }, title),
    goal
      ? el(
          "p",
          {},
          el("label", { for: "machine-progress" }, `${setup.measured} run${setup.measured === 1 ? "" : "s"} measured`),
          " ",
          el("progress", { id: "machine-progress", max: goal, value: Math.min(setup.measured, goal), "aria-describedby": "machine-progress-detail" }),
          ` ${Math.min(100, Math.round((100 * setup.measured) / goal))} % of ${goal}`
        )
      : el("p", {}, `${setup.measured} run${setup.measured === 1 ? "" : "s"} measured`),
    el(
      "p",
      { id: "machine-progress-detail", class: "muted" },
      `${setup.correct} correct; ${kernels}. ${plan.join(", ")}${plan.length ? " on this machine. " : ""}` +
        `Last at ${fmtTime(setup.last_at)} UTC` +
        (setup.since_model ? ` (since model ${setup.since_model}).` : " (no model yet).") +
        (setup.running ? "" : " No training has followed them yet.")
    ),
  ];
}

export async function init(root) {
  const part = (name) => root.querySelector(`[data-part="${name}"]`);

  async function loadModel() {
    try {
      part("model").replaceChildren(renderModel(await api("/v1/model")));
    } catch (error) {
      part("model").replaceChildren(el("p", { class: "section-error" }, error.message));
    }
  }

  async function loadSummary() {
    try {
      const summary = await api("/v1/measurements/summary");
      part("measured").replaceChildren(...measuredRows(summary));
      part("setup").replaceChildren(...renderSetup(summary.setup));
    } catch (error) {
      part("measured").replaceChildren(el("tr", { class: "empty" }, el("td", { colspan: 4 }, error.message)));
      part("setup").replaceChildren();
    }
    root.dataset.updated = String(Date.now());
  }

  // One read at a time; events during a read ask for one more after it, at most once a second.
  let inFlight = false;
  let again = false;
  async function refresh() {
    if (inFlight) {
      again = true;
      return;
    }
    inFlight = true;
    try {
      do {
        again = false;
        await loadSummary();
      } while (again);
    } finally {
      inFlight = false;
    }
  }
  // The projection may apply an event a moment after the stream shows it: a read soon after a
  // burst, and one a little later.
  const timers = new Map();
  function soon() {
    for (const delay of [1000, 3000]) {
      if (timers.has(delay)) continue;
      timers.set(delay, setTimeout(() => { timers.delete(delay); refresh(); }, delay));
    }
  }
  function modelSoon() {
    setTimeout(loadModel, 300);
    setTimeout(loadModel, 2000);
  }

  onEvent("measurement.recorded", soon);
  onEvent("model.published", () => {
    modelSoon();
    soon();
  });
  onReconnect(() => {
    loadModel();
    refresh();
  });
  await Promise.all([loadModel(), refresh()]);
}
