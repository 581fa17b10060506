// The playground ("State" / "Questions"): a job as JSON on the left, POST /v1/decide on Run or
// Ctrl+Enter, and everything the answer holds on the right: the next move, its confidence and
// mode, the reasons, every alternative's probability and expected runtime, the System 1
// configuration and the familiarity guard's distance. Without telemetry the job runs for real
// first, which needs an engineer: a viewer sees Run disabled, with why, until the job has
// telemetry. The model line follows model.published.
import {
  api,
  canAct,
  el,
  fmtConfig,
  fmtSeconds,
  MODE_CLASS,
  onEvent,
  onReconnect,
  whoami,
} from "../console.js";

const MODE_WORDS = {
  auto: "runs automatically",
  confirm: "an engineer confirms it",
  escalate: "an engineer decides",
};

function num(value, digits = 2) {
  return typeof value === "number" && Number.isFinite(value) ? value.toFixed(digits) : "—";
}

/** The job in the editor: {job} or {error} in words. */
export function parseJob(text) {
  let job;
  try {
    job = JSON.parse(text);
  } catch (error) {
    return { error: `The job is not valid JSON: ${error.message}` };
  }
  if (!job || typeof job !== "object" || Array.isArray(job)) {
    return { error: "The job must be a JSON object: {\"workload\": …, \"size\": …, \"config\": {…}}" };
  }
  for (const key of ["workload", "size", "config"]) {
    if (!(key in job)) return { error: `The job has no "${key}" (see the key below the editor).` };
  }
  return { job };
}

function figure(label, value, attrs = {}) {
  return el("div", { class: "playground-figure", ...attrs }, el("span", { class: "label" }, label), el("span", { class: "value" }, value));
}

function alternativesTable(d) {
  const runtimes = d.predicted_runtimes_s || {};
  const rows = Object.entries(d.alternatives || {})
    .map(([move, p]) => ({ move, p, runtime: runtimes[move] }))
    .sort((a, b) => b.p - a.p);
  const body = el(
    "tbody",
    {},
    rows.map((r) =>
      el(
        "tr",
        { class: r.move === d.choice ? "chosen" : null },
        el("th", { scope: "row" }, el("code", {}, r.move), r.move === d.choice ? el("span", { class: "badge" }, "chosen") : null),
        el(
          "td",
          { class: "num" },
          num(r.p, 3),
          el("span", { class: "playground-bar", "aria-hidden": "true" }, el("span", { style: `width:${Math.round(Math.max(0, Math.min(1, r.p)) * 100)}%` }))
        ),
        el("td", { class: "num" }, fmtSeconds(r.runtime))
      )
    )
  );
  return el(
    "div",
    { class: "table-wrap" },
    el(
      "table",
      { class: "data playground-alternatives" },
      el("caption", {}, "Every alternative: its probability of being the best next move, and the expected runtime after it (STOP: the job as it is)"),
      el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "Move"), el("th", { scope: "col", class: "num" }, "Probability"), el("th", { scope: "col", class: "num" }, "Expected runtime"))),
      body
    )
  );
}

function system1Block(s1) {
  if (!s1) {
    return el("p", { class: "muted" }, "No System 1 configuration: this workload is not in the registry, so there is no space to score.");
  }
  return el(
    "div",
    { class: "playground-system1" },
    el(
      "p",
      {},
      el("code", {}, fmtConfig(s1.config)),
      ` — expected ${fmtSeconds(s1.predicted_runtime_s)}; confidence ${num(s1.confidence)} that it is the fastest; `,
      el("span", { class: `badge ${MODE_CLASS[s1.mode] || ""}` }, s1.mode)
    ),
    s1.reasons && s1.reasons.length ? el("ul", { class: "reasons" }, s1.reasons.map((r) => el("li", {}, r))) : null
  );
}

function familiarityBlock(f) {
  if (!f || typeof f.distance !== "number") return el("p", { class: "muted" }, "The model gave no distance.");
  return el(
    "p",
    {},
    el("span", { class: `badge ${f.familiar ? "ok" : "bad"}` }, f.familiar ? "familiar" : "unfamiliar"),
    ` distance ${num(f.distance)} from the training data, threshold ${num(f.threshold)} (standardized feature space)`
  );
}

/** The answer of POST /v1/decide, rendered. */
export function renderAnswer(d) {
  const telemetry = d.telemetry || {};
  return el(
    "div",
    { class: "playground-answer", "data-decision": d.decision_id },
    el(
      "div",
      { class: "playground-figures" },
      figure("Next move", el("code", { "data-part": "choice" }, d.choice)),
      figure("Confidence", num(d.confidence)),
      figure("Mode", el("span", { class: `badge ${MODE_CLASS[d.mode] || ""}`, "data-part": "mode" }, d.mode), { title: MODE_WORDS[d.mode] || "" })
    ),
    el(
      "p",
      { class: "muted" },
      d.ran
        ? `Ran for real on this machine: ${fmtSeconds(telemetry.runtime_s)}` +
            (typeof telemetry.throughput === "number" ? `, throughput ${num(telemetry.throughput)}` : "") +
            `; then one forward pass. `
        : "One forward pass, nothing ran. ",
      `${fmtConfig(d.config)} · expected after the move: ${fmtSeconds(d.predicted_runtime_s)}.`
    ),
    el("h4", {}, "Reasons"),
    d.reasons && d.reasons.length
      ? el("ul", { class: "reasons" }, d.reasons.map((r) => el("li", {}, r)))
      : el("p", { class: "muted" }, "None: confident enough and familiar."),
    el("h4", {}, "Alternatives"),
    alternativesTable(d),
    el("h4", {}, "System 1: the whole configuration before anything runs"),
    system1Block(d.system1),
    el("h4", {}, "Familiarity"),
    familiarityBlock(d.familiarity),
    el(
      "p",
      { class: "muted playground-ids" },
      `Decision ${d.decision_id} · model ${d.model_version || "—"} · device ${d.device_id} · asked by ${d.actor} · in the `,
      el("a", { href: "#decisions" }, "audit log"),
      "."
    )
  );
}

export async function init(root) {
  const part = (name) => root.querySelector(`[data-part="${name}"]`);
  const editor = part("job");
  const run = part("run");
  const why = part("run-why");
  const answer = part("answer");
  const user = await whoami();
  const engineer = canAct(user.role);
  let busy = false;
  let edited = false;

  function refreshButton() {
    const parsed = parseJob(editor.value);
    const needsRun = parsed.job && (parsed.job.telemetry === undefined || parsed.job.telemetry === null);
    if (busy) {
      run.disabled = true;
      return;
    }
    if (needsRun && !engineer) {
      run.disabled = true;
      why.textContent = `Without telemetry the job runs for real, which needs an engineer; ${user.name} holds a ${user.role} token. Add "telemetry": {"runtime_s": …} to ask without running.`;
    } else {
      run.disabled = false;
      why.textContent = needsRun ? "Without telemetry the job runs once, for real, on this machine." : "";
    }
  }

  function showError(message) {
    answer.replaceChildren(el("p", { class: "section-error", role: "alert" }, message));
  }

  async function ask() {
    if (busy || run.disabled) return;
    const parsed = parseJob(editor.value);
    if (parsed.error) {
      showError(parsed.error);
      return;
    }
    busy = true;
    refreshButton();
    const running = parsed.job.telemetry === undefined || parsed.job.telemetry === null;
    answer.setAttribute("aria-busy", "true");
    answer.replaceChildren(
      el("p", { class: "muted" }, running ? "Running the job for real on this machine, then deciding…" : "Deciding…")
    );
    try {
      const decision = await api("/v1/decide", { method: "POST", body: parsed.job });
      answer.replaceChildren(renderAnswer(decision));
    } catch (error) {
      showError(`No decision: ${error.message}`);
    } finally {
      busy = false;
      answer.removeAttribute("aria-busy");
      refreshButton();
    }
  }

  async function loadModel() {
    try {
      const m = await api("/v1/model");
      part("model-name").textContent = m.name;
      part("thresholds").textContent = `auto ≥ ${m.thresholds.auto} · escalate < ${m.thresholds.escalate}`;
      part("model-version").textContent = m.model ? `version ${m.model.version}` : m.missing || "";
    } catch (error) {
      part("model-version").textContent = error.message;
    }
  }

  async function defaultJob() {
    // A job this machine knows: the first kernel with a guard range, at its smallest size.
    try {
      const [summary, workloads] = await Promise.all([
        api("/v1/measurements/summary").catch(() => null),
        api("/v1/workloads").catch(() => null),
      ]);
      const names = (workloads && (workloads.workloads || workloads)) || [];
      if (Array.isArray(names) && names.length) {
        part("workloads").textContent = names.map((w) => (typeof w === "string" ? w : w.name)).join(", ");
      }
      const known = summary && summary.kernels.find((k) => k.guard_range);
      if (known && !edited) {
        editor.value = JSON.stringify(
          { workload: known.kernel, size: known.guard_range[0], config: { ranks: 1, threads: 1 } },
          null,
          2
        );
      }
    } catch (error) {
      console.error("playground: no default job", error);
    }
  }

  editor.addEventListener("input", () => {
    edited = true;
    refreshButton();
  });
  editor.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      ask();
    }
  });
  run.addEventListener("click", ask);
  onEvent("model.published", loadModel);
  onReconnect(loadModel);
  refreshButton();
  await Promise.all([loadModel(), defaultJob()]);
  refreshButton();
}
