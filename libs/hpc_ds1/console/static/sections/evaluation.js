// How good it is, measured: the latest evaluation (GET /v1/evaluation) as the seed's three
// tables (tuning sessions on held-out sizes, System 1, the familiarity guard on never-seen
// kernels), each with a plot drawn here with uPlot (static/vendor/uplot.esm.js) from the same
// numbers, plus the reliability of the stated confidence and (issue 43) whether it can run moves
// unattended: a reliability diagram on "right unattended" and a selective-risk curve (the share
// >= 5 % worse among the decisions taken, most confident first); the evaluation's own PNG plots
// (GET /v1/evaluation/plots/{name}) follow when this server has them, and the yardstick on
// recorded GPU spaces (GET /v1/evaluation/yardstick: fraction of the optimum against the budget
// of runs, per policy) when the home has one. Without an evaluation it
// says to run `hpc-ds1 evaluate`. Live on evaluation.published (and model.published: the
// evaluation may then be of an older model, which it says).
import { api, el, fmtPercent, fmtTime, onEvent, onReconnect } from "../console.js";
import uPlot from "../vendor/uplot.esm.js";

const POLICY = {
  model: "HPC-DS1 model",
  model_recommend: "HPC-DS1 model from its recommendation (as tune starts)",
  model_transfer: "HPC-DS1 model from the interpolated-transfer pick",
  model_live: "HPC-DS1 model, run for real from seeded starts (evaluate --live)",
  model_recommend_live: "HPC-DS1 model, run for real from its recommendation",
  greedy: "greedy (every neighbour, best kept)",
  random: "random search (same budget)",
  optuna_tpe: "Optuna TPE (same budget)",
  exhaustive: "exhaustive search",
  model_engineer: "HPC-DS1 model, an engineer who knows the landscape answering",
  always_stop: "always STOP (keep the start)",
  lookup: "the setup's best, no run (lookup)",
  start_then_lookup: "the start, then the lookup, the faster kept",
  optuna_tpe_warm: "Optuna TPE warm-started with the setup's runs (same budget)",
};
const COLOURS = ["#0b5cad", "#ff7f0e", "#2ca02c", "#9467bd", "#7f7f7f"];

function loadCss() {
  if (document.querySelector('link[data-vendor="uplot"]')) return;
  document.head.appendChild(
    el("link", { rel: "stylesheet", href: "/static/vendor/uplot.min.css", "data-vendor": "uplot" })
  );
}

function n(value, digits = 1) {
  return typeof value === "number" && Number.isFinite(value) ? value.toFixed(digits) : "—";
}

function bar(pct) {
  const width = typeof pct === "number" ? Math.max(0, Math.min(100, pct)) : 0;
  return el("span", { class: "evaluation-bar", "aria-hidden": "true" }, el("span", { style: `width:${width}%` }));
}

function dataTable(caption, headers, rows) {
  return el(
    "div",
    { class: "table-wrap" },
    el(
      "table",
      { class: "data evaluation-table" },
      caption ? el("caption", { class: "visually-hidden" }, caption) : null,
      el("thead", {}, el("tr", {}, headers.map((h) => el("th", { scope: "col", class: h.num ? "num" : null }, h.label ?? h)))),
      el(
        "tbody",
        {},
        rows.length
          ? rows.map((cells) => el("tr", {}, cells.map((c, i) => el("td", { class: headers[i].num ? "num" : null }, c ?? "—"))))
          : el("tr", { class: "empty" }, el("td", { colspan: headers.length }, "No rows in this evaluation."))
      )
    )
  );
}

/** A figure holding a uPlot chart; `describe` is the text a screen reader gets for it. */
function chart(container, describe, build) {
  const holder = el("div", { class: "evaluation-plot", role: "img", "aria-label": describe });
  const fig = el("figure", { class: "evaluation-figure" }, holder, el("figcaption", { class: "muted" }, describe));
  container.appendChild(fig);
  const width = Math.max(320, Math.min(560, (container.clientWidth || 560) - 8));
  try {
    build(holder, width);
  } catch (error) {
    holder.replaceChildren(el("p", { class: "muted" }, `The plot could not be drawn: ${error.message}`));
  }
  return fig;
}

function categoryAxis(names) {
  return {
    splits: () => names.map((_, i) => i),
    values: (_u, splits) => splits.map((i) => names[i] ?? ""),
    grid: { show: false },
    size: 48,
  };
}

function barsPlot(holder, width, names, values, label, extra) {
  const xs = names.map((_, i) => i);
  const series = [
    {},
    {
      label,
      scale: "%",
      fill: "rgba(11, 92, 173, 0.55)",
      stroke: "#0b5cad",
      paths: uPlot.paths.bars({ size: [0.6, 80] }),
      points: { show: false },
      value: (_u, v) => (v == null ? "—" : `${n(v)} %`),
    },
  ];
  const data = [xs, values];
  const axes = [categoryAxis(names), { scale: "%", label: "% of best", size: 56 }];
  const scales = { x: { time: false, range: [-0.5, names.length - 0.5] }, "%": { range: [0, 100] } };
  if (extra) {
    series.push({
      label: extra.label,
      scale: "runs",
      stroke: "#cf222e",
      width: 0,
      paths: () => null,
      points: { show: true, size: 9, fill: "#cf222e" },
    });
    data.push(extra.values);
    axes.push({ scale: "runs", side: 1, label: extra.label, grid: { show: false }, size: 56 });
    scales.runs = { range: (_u, _min, max) => [0, Math.max(1, Math.ceil(max * 1.15))] };
  }
  return new uPlot({ width, height: 260, scales, axes, series, legend: { live: false } }, data, holder);
}

function reliabilityPlot(holder, width, rows) {
  const pts = rows
    .filter((r) => typeof r.mean_confidence === "number" && typeof r.accuracy === "number")
    .sort((a, b) => a.mean_confidence - b.mean_confidence);
  const xs = [0, ...pts.map((r) => r.mean_confidence), 1];
  const observed = [null, ...pts.map((r) => r.accuracy), null];
  return new uPlot(
    {
      width,
      height: 260,
      scales: { x: { time: false, range: [0, 1] }, y: { range: [0, 1.02] } },
      axes: [{ label: "stated confidence" }, { label: "observed accuracy", size: 56 }],
      series: [
        {},
        { label: "perfectly calibrated", stroke: "#8c959f", dash: [6, 4], points: { show: false } },
        { label: "model", stroke: "#0b5cad", width: 2, points: { show: true, size: 7 }, spanGaps: false },
      ],
      legend: { live: false },
    },
    [xs, xs, observed],
    holder
  );
}

function sessionsPart(s) {
  const rows = s.table || [];
  const part = el("div", { class: "evaluation-part" });
  part.append(
    el("h3", { id: "evaluation-sessions-title" }, "Tuning sessions on held-out sizes"),
    el(
      "p",
      { class: "muted" },
      `${s.sessions_per_policy} sessions per policy, one from every configuration that ran; budget ${s.budget} real runs for random search and TPE (the model's mean, re-runs counted); the replayed engineer ${s.replayed_engineer}.`
    ),
    dataTable(
      "Tuning sessions on held-out sizes",
      ["Policy", { label: "% of best config reached", num: true }, "", { label: "Real runs per session", num: true }],
      rows.map((r) => [
        POLICY[r.policy] || r.policy,
        `${n(r.pct_median)} % median · ${n(r.pct_p10)} % p10`,
        bar(r.pct_median),
        `${r.runs_mean === undefined ? "" : `${n(r.runs_mean, 1)} mean · `}${n(r.runs_median, 1)} median · ${r.runs_max} max`,
      ])
    )
  );
  const model = rows.find((r) => r.policy === "model");
  if (model && model.engineer_moves_per_session !== undefined) {
    part.append(el("p", { class: "muted" }, `The model: ${n(model.engineer_moves_per_session, 2)} proposals per session would have waited for an engineer.`));
  }
  if (rows.length) {
    const names = rows.map((r) => r.policy);
    chart(
      part,
      `Median % of the best configuration reached (bars) and median real runs per session (dots), per policy: ${rows
        .map((r) => `${r.policy} ${n(r.pct_median)} % in ${n(r.runs_median, 1)} runs`)
        .join("; ")}.`,
      (holder, width) =>
        barsPlot(holder, width, names, rows.map((r) => r.pct_median), "median % of best", {
          label: "median real runs",
          values: rows.map((r) => r.runs_median),
        })
    );
  }
  return part;
}

function system1Part(s1) {
  const rows = s1.table || [];
  const part = el("div", { class: "evaluation-part" });
  const modes = Object.entries(s1.model_modes || {})
    .map(([m, k]) => `${m} ${k}`)
    .join(" · ");
  part.append(
    el("h3", { id: "evaluation-system1-title" }, "System 1: the whole configuration before anything runs"),
    dataTable(
      "System 1",
      ["Approach (held-out test sizes)", { label: "% of best config reached", num: true }, "", { label: "Real runs", num: true }],
      rows.map((r) => [r.approach, `${n(r.median)} % median · ${n(r.p10)} % p10`, bar(r.median), String(r.real_runs)])
    ),
    modes ? el("p", { class: "muted" }, `The model's recommendations by mode: ${modes}.`) : null
  );
  if (rows.length) {
    chart(
      part,
      `Median % of the best configuration reached before anything runs, per approach: ${rows
        .map((r) => `${r.key} ${n(r.median)} %`)
        .join("; ")}.`,
      (holder, width) => barsPlot(holder, width, rows.map((r) => r.key), rows.map((r) => r.median), "median % of best")
    );
  }
  return part;
}

function guardPart(g, calibration) {
  const kernels = g.kernels || [];
  const part = el("div", { class: "evaluation-part" });
  const ff = g.false_flags || {};
  part.append(
    el("h3", { id: "evaluation-guard-title" }, "Familiarity guard on never-seen kernels"),
    el("p", { class: "muted" }, "Each kernel is held out of training in turn (the model retrained without it), then decided on."),
    dataTable(
      "Familiarity guard on never-seen kernels",
      ["Kernel held out of training", { label: "Flagged by guard", num: true }, { label: "By distance alone", num: true }, "Confidently wrong auto-runs: before → after"],
      kernels.map((k) =>
        "error" in k
          ? [k.kernel, "—", "—", k.error]
          : [k.kernel, fmtPercent(k.flagged_by_guard, 1), fmtPercent(k.flagged_by_distance, 1), `${k.confidently_wrong_before} → ${k.confidently_wrong_after_guard}`]
      )
    ),
    ff.states !== undefined
      ? el("p", { class: "muted" }, `False flags on the familiar kernels' held-out sizes: ${ff.flagged} of ${ff.states} (${fmtPercent(ff.rate, 1)}).`)
      : null
  );
  if (calibration && Array.isArray(calibration.reliability) && calibration.reliability.length) {
    const c = calibration;
    part.append(
      el("h3", { id: "evaluation-reliability-title" }, "Is the stated confidence right?"),
      el(
        "p",
        { class: "muted" },
        `${c.auto_moves} of ${c.decisions} held-out decisions would run automatically (confidence ≥ ${c.auto_threshold}): right ${fmtPercent(c.auto_right, 1)}, not slower ${fmtPercent(c.auto_not_slower, 1)}; all decisions right ${fmtPercent(c.accuracy, 1)}; calibration error (ECE) ${c.ece ?? "—"}.`
      )
    );
    chart(
      part,
      `Reliability: observed accuracy against stated confidence, per confidence bin: ${c.reliability
        .map((r) => `${n(r.mean_confidence, 2)} stated, ${n(r.accuracy, 2)} right (${r.decisions})`)
        .join("; ")}.`,
      (holder, width) => reliabilityPlot(holder, width, c.reliability)
    );
  }
  return part;
}

/** Issue 43's reliability diagram: per confidence bin, the stated confidence (the bin's mean)
 *  against the observed share right to run unattended, the diagonal of a perfect calibration,
 *  and the bin's number of decisions (bars, right axis). */
function unattendedReliabilityPlot(holder, width, rows) {
  const pts = rows
    .filter((r) => typeof r.mean_confidence === "number" && typeof r.accuracy === "number")
    .sort((a, b) => a.mean_confidence - b.mean_confidence);
  const xs = [0, ...pts.map((r) => r.mean_confidence), 1];
  const observed = [null, ...pts.map((r) => r.accuracy), null];
  const counts = [null, ...pts.map((r) => r.decisions), null];
  return new uPlot(
    {
      width,
      height: 280,
      scales: {
        x: { time: false, range: [0, 1] },
        y: { range: [0, 1.02] },
        n: { range: (_u, _min, max) => [0, Math.max(1, Math.ceil((max || 1) * 1.15))] },
      },
      axes: [
        { label: "stated confidence" },
        { label: "observed share right unattended", size: 56 },
        { scale: "n", side: 1, label: "decisions in the bin", grid: { show: false }, size: 56 },
      ],
      series: [
        {},
        {
          label: "decisions in the bin",
          scale: "n",
          fill: "rgba(140, 149, 159, 0.30)",
          stroke: "#8c959f",
          paths: uPlot.paths.bars({ size: [0.9, 24] }),
          points: { show: false },
        },
        { label: "perfectly calibrated", stroke: "#8c959f", dash: [6, 4], points: { show: false }, spanGaps: true },
        { label: "observed", stroke: "#0b5cad", width: 2, points: { show: true, size: 7 }, spanGaps: false },
      ],
      legend: { live: false },
    },
    [xs, counts, xs, observed],
    holder
  );
}

/** Issue 43's selective-risk curve: decisions taken most confident first; at each coverage
 *  (the share taken) the share of them that end >= 5 % above the best available; the point
 *  the auto threshold gives marked. */
function selectiveRiskPlot(holder, width, risk) {
  const curve = (risk.curve || []).filter((p) => typeof p.coverage === "number" && typeof p.risk === "number");
  const at = risk.at_threshold && typeof risk.at_threshold.risk === "number" ? risk.at_threshold : null;
  const xs = [...new Set([...curve.map((p) => p.coverage), ...(at ? [at.coverage] : [])])].sort((a, b) => a - b);
  const onCurve = new Map(curve.map((p) => [p.coverage, p.risk]));
  const top = Math.max(0.05, ...curve.map((p) => p.risk), at ? at.risk : 0);
  return new uPlot(
    {
      width,
      height: 280,
      scales: { x: { time: false, range: [0, 1] }, y: { range: [0, Math.min(1, top * 1.15)] } },
      axes: [
        { label: "coverage (share of decisions taken)" },
        { label: "share ≥ 5 % worse among them", size: 56, values: (_u, splits) => splits.map((v) => `${Math.round(v * 1000) / 10} %`) },
      ],
      series: [
        {},
        {
          label: "most confident first",
          stroke: "#0b5cad",
          width: 2,
          spanGaps: true,
          points: { show: true, size: 6 },
          value: (_u, v) => (v == null ? "—" : fmtPercent(v, 1)),
        },
        {
          label: at ? `auto threshold (confidence ≥ ${at.threshold})` : "auto threshold",
          stroke: "#cf222e",
          width: 0,
          paths: () => null,
          points: { show: true, size: 11, fill: "#cf222e" },
          value: (_u, v) => (v == null ? "—" : fmtPercent(v, 1)),
        },
      ],
      legend: { live: false },
    },
    [xs, xs.map((x) => (onCurve.has(x) ? onCurve.get(x) : null)), xs.map((x) => (at && x === at.coverage ? at.risk : null))],
    holder
  );
}

/** Whether the confidence can be trusted to run moves unattended (issue 43): the modes, the
 *  automatic decisions within 5 % of the best, AUROC and Brier, and the two plots; an empty
 *  state when the evaluation predates these figures. */
function trustPart(c) {
  const part = el("div", { class: "evaluation-part evaluation-trust" });
  part.append(el("h3", { id: "evaluation-trust-title" }, "Can the confidence run moves unattended?"));
  const d = c && c.discrimination;
  const rows = (c && c.reliability_unattended) || [];
  if (!d || !d.decisions) {
    part.append(
      el(
        "p",
        { class: "muted evaluation-trust-empty" },
        "This evaluation has no reliability diagram or selective-risk curve (it predates them, or decided nothing): run hpc-ds1 evaluate to measure them."
      )
    );
    return part;
  }
  const shares = c.mode_shares || {};
  const brier = d.brier || {};
  const unattended = d.unattended || {};
  const at = (d.selective_risk || {}).at_threshold;
  part.append(
    el(
      "p",
      { class: "muted" },
      `Of ${c.decisions} held-out decisions: auto ${fmtPercent(shares.auto, 1)}, confirm ${fmtPercent(shares.confirm, 1)}, escalate ${fmtPercent(shares.escalate, 1)}. ` +
        `Of those run automatically, ${fmtPercent(c.auto_within_5, 1)} end within 5 % of the best available (target ≥ 99 %). ` +
        `AUROC ${n(d.auroc, 3)} for ending within 5 % of the best, ${n(unattended.auroc, 3)} for right unattended (0.5: no better than chance); ` +
        `Brier ${n(brier.brier, 4)}, resolution ${n(brier.resolution, 4)}; calibration error on right unattended (ECE) ${c.ece_unattended ?? "—"}.`
    )
  );
  if (rows.length) {
    chart(
      part,
      `Reliability diagram: the observed share right to run unattended against the stated confidence, per bin (decisions in the bin): ${rows
        .map((r) => `${n(r.mean_confidence, 2)} stated, ${n(r.accuracy, 2)} observed (${r.decisions})`)
        .join("; ")}.`,
      (holder, width) => unattendedReliabilityPlot(holder, width, rows)
    ).classList.add("evaluation-reliability-unattended");
  }
  const curve = (d.selective_risk || {}).curve || [];
  if (curve.length) {
    chart(
      part,
      `Selective risk: decisions taken most confident first; at each share taken, the share of them that end ≥ 5 % above the best available: ${curve
        .map((p) => `${fmtPercent(p.coverage, 0)} taken, ${fmtPercent(p.risk, 1)}`)
        .join("; ")}` +
        (at && typeof at.risk === "number"
          ? `; at the auto threshold (confidence ≥ ${at.threshold}) ${fmtPercent(at.coverage, 1)} taken, ${fmtPercent(at.risk, 1)} of them worse.`
          : "; nothing reaches the auto threshold."),
      (holder, width) => selectiveRiskPlot(holder, width, d.selective_risk)
    ).classList.add("evaluation-selective-risk");
  }
  return part;
}

function targetsPart(targets) {
  if (!Array.isArray(targets) || !targets.length) return null;
  const met = targets.filter((t) => t.met === true).length;
  return el(
    "details",
    { class: "evaluation-targets" },
    el("summary", {}, `Targets: ${met} of ${targets.length} met`),
    dataTable(
      "Targets",
      ["Target", { label: "Value", num: true }, "Goal", "Met", "Note"],
      targets.map((t) => [
        t.target,
        typeof t.value === "number" ? String(Math.round(t.value * 1000) / 1000) : "—",
        t.goal,
        t.met === null ? "—" : el("span", { class: `badge ${t.met ? "ok" : "bad"}` }, t.met ? "yes" : "no"),
        typeof t.note === "string" ? t.note : "",
      ])
    )
  );
}

const YARDSTICK_COLOURS = ["#0b5cad", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf"];

function median(values) {
  const v = values.filter((x) => typeof x === "number" && Number.isFinite(x)).sort((a, b) => a - b);
  if (!v.length) return null;
  const mid = Math.floor(v.length / 2);
  return v.length % 2 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
}

/** Per policy and budget, over the yardstick's spaces: the median of each space's median
 *  fraction of the optimum, and the mean methodology score. */
export function yardstickSummary(data) {
  const spaces = Object.values((data && data.spaces) || {}).filter((s) => s && s.figures);
  const budgets = new Set();
  const policies = new Map();
  for (const space of spaces) {
    for (const [policy, byBudget] of Object.entries(space.figures)) {
      if (!policies.has(policy)) policies.set(policy, new Map());
      for (const [budget, cell] of Object.entries(byBudget || {})) {
        const b = Number(budget);
        if (!Number.isFinite(b) || !cell) continue;
        budgets.add(b);
        const at = policies.get(policy);
        if (!at.has(b)) at.set(b, { fractions: [], scores: [] });
        at.get(b).fractions.push(cell.median);
        at.get(b).scores.push(cell.score);
      }
    }
  }
  const sorted = [...budgets].sort((a, b) => a - b);
  const rows = [...policies.entries()].map(([policy, at]) => ({
    policy,
    fraction: sorted.map((b) => (at.has(b) ? median(at.get(b).fractions) : null)),
    score: sorted.map((b) => {
      const v = at.has(b) ? at.get(b).scores.filter((x) => typeof x === "number" && Number.isFinite(x)) : [];
      return v.length ? v.reduce((a, c) => a + c, 0) / v.length : null;
    }),
  }));
  return { spaces: spaces.length, budgets: sorted, rows };
}

function yardstickPart(data) {
  const sum = yardstickSummary(data);
  if (!sum.rows.length || !sum.budgets.length) return null;
  const part = el(
    "section",
    { class: "evaluation-part yardstick" },
    el("h3", {}, "The yardstick: recorded GPU spaces, every run counted"),
    el(
      "p",
      { class: "muted" },
      `Over ${sum.spaces} recorded space(s) (benchmarks/yardstick.py): the median across spaces of each policy's median fraction of the optimum found within a budget of runs on the device, and the mean autotuning-methodology score (0: calculated random search, 1: the optimum).`
    )
  );
  chart(part, "Fraction of the optimum found against the budget of runs, per policy", (holder, width) => {
    const series = [
      { label: "runs" },
      ...sum.rows.map((r, i) => ({
        label: r.policy,
        stroke: YARDSTICK_COLOURS[i % YARDSTICK_COLOURS.length],
        width: r.policy.startsWith("hpcds1") ? 3 : 1.5,
        points: { show: true, size: 6 },
        value: (_u, v) => (v == null ? "—" : n(v, 3)),
      })),
    ];
    return new uPlot(
      {
        width,
        height: 300,
        scales: { x: { time: false, distr: 3 }, y: { range: [0, 1.02] } },
        axes: [{ label: "budget (runs on the device)" }, { label: "fraction of the optimum", size: 56 }],
        series,
        legend: { live: false },
      },
      [sum.budgets, ...sum.rows.map((r) => r.fraction)],
      holder
    );
  });
  part.appendChild(
    dataTable(
      "Yardstick: fraction of the optimum [methodology score] per budget",
      [{ label: "policy" }, ...sum.budgets.map((b) => ({ label: `${b} runs`, num: true }))],
      sum.rows.map((r) => [
        el("code", {}, r.policy),
        ...r.fraction.map((f, i) => `${n(f, 3)} [${r.score[i] == null ? "—" : n(r.score[i], 2)}]`),
      ])
    )
  );
  return part;
}

function pngPart(plots) {
  if (!Array.isArray(plots) || !plots.length) return null;
  return el(
    "details",
    { class: "evaluation-png" },
    el("summary", {}, "The evaluation's own plots (PNG, drawn by hpc-ds1 evaluate)"),
    plots.map((name) => {
      const img = el("img", {
        src: `/v1/evaluation/plots/${encodeURIComponent(name)}`,
        alt: `Evaluation plot ${name}: % of best reached against real runs per policy, and the reliability of the stated confidence`,
        loading: "lazy",
      });
      img.addEventListener("error", () =>
        img.replaceWith(el("p", { class: "muted" }, `${name} is not on this server (the evaluation ran on another machine).`))
      );
      return el("figure", {}, img, el("figcaption", { class: "muted" }, name));
    })
  );
}

export function render(ev, currentModel) {
  const r = ev.results || {};
  const land = r.landscape || {};
  const wrap = el("div", { class: "evaluation" });
  wrap.append(
    el(
      "p",
      { class: "evaluation-meta" },
      `Model `,
      el("code", {}, ev.model_version),
      ` on device ${ev.device_id} · ${ev.profile} profile · ${ev.landscape_runs.toLocaleString("en-US")} held-out runs` +
        (land.cells ? ` over ${land.cells} sizes` : "") +
        ` · published ${fmtTime(ev.published_at)} UTC`
    )
  );
  if (currentModel && currentModel !== ev.model_version) {
    wrap.append(
      el("p", { class: "badge warn" }, `This machine's model is now ${currentModel}: run hpc-ds1 evaluate to measure it.`)
    );
  }
  if (r.sessions) wrap.append(sessionsPart(r.sessions));
  if (r.system1) wrap.append(system1Part(r.system1));
  if (r.guard) wrap.append(guardPart(r.guard, r.calibration));
  wrap.append(trustPart(r.calibration));
  const targets = targetsPart(r.targets);
  if (targets) wrap.append(targets);
  const png = pngPart(ev.plots);
  if (png) wrap.append(png);
  return wrap;
}

export function emptyState(message) {
  return el(
    "div",
    { class: "evaluation-empty" },
    el("p", {}, message || "No evaluation yet."),
    el("p", {}, "On the machine with the model, measure it on sizes it never trained on:"),
    el("pre", {}, el("code", {}, "hpc-ds1 evaluate --quick   # a few held-out sizes\nhpc-ds1 evaluate           # every held-out size"))
  );
}

export async function init(root) {
  loadCss();
  const target = root.querySelector('[data-part="evaluation"]');
  let inFlight = false;
  let again = false;

  async function load() {
    const [ev, model, yardstick] = await Promise.all([
      api("/v1/evaluation").catch((error) => error),
      api("/v1/model").catch(() => null),
      api("/v1/evaluation/yardstick").catch(() => null),
    ]);
    if (ev instanceof Error) {
      target.replaceChildren(ev.status === 404 ? emptyState(ev.message) : el("p", { class: "section-error", role: "alert" }, ev.message));
    } else {
      target.replaceChildren(render(ev, model && model.model ? model.model.version : null));
    }
    // the yardstick is drawn after the tables are in the page (uPlot needs their width)
    const part = yardstick ? yardstickPart(yardstick) : null;
    if (part) target.appendChild(part);
    root.dataset.updated = String(Date.now());
  }

  async function refresh() {
    if (inFlight) {
      again = true;
      return;
    }
    inFlight = true;
    try {
      do {
        again = false;
        await load();
      } while (again);
    } finally {
      inFlight = false;
    }
  }

  const soon = () => {
    setTimeout(refresh, 300);
    setTimeout(refresh, 2000);
  };
  onEvent("evaluation.published", soon);
  onEvent("model.published", soon);
  onReconnect(refresh);
  await refresh();
}
