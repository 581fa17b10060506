// Every decision the service made: GET /v1/audit, paged on the server with its cursors (newest
// first; "Older" follows next_before, "Newer" goes back), filtered by source, mode and workload.
// Live: on the newest page a new decision (or an approval that changes one) shows at the top,
// marked new; on an older page the pager says how many came in.
import {
  api,
  el,
  fmtConfig,
  fmtTime,
  MODE_CLASS,
  onEvent,
  onReconnect,
  refresher,
} from "../console.js";

const APPROVED_CLASS = { waiting: "warn", rejected: "bad" };

export async function init(root) {
  const part = (name) => root.querySelector(`[data-part="${name}"]`);
  const form = part("filter");
  const body = part("rows");
  const info = part("page-info");
  const buttons = { newest: part("newest"), newer: part("newer"), older: part("older") };

  // The pages seen: cursors[i] is the `before` of page i (null: the newest page).
  let cursors = [null];
  let nextBefore = null;
  let newestSeq = 0; // the highest seq shown on the newest page, to mark what is new
  let missed = 0; // decisions that came in while an older page was shown

  try {
    const { workloads } = await api("/v1/workloads");
    const select = form.querySelector("select[name=workload]");
    select.append(...workloads.map((w) => el("option", { value: w.name }, w.name)));
  } catch {
    // The filter still takes any workload the log has through the other filters.
  }

  function query() {
    const data = new FormData(form);
    const params = new URLSearchParams();
    for (const key of ["source", "mode", "workload"]) if (data.get(key)) params.set(key, data.get(key));
    params.set("limit", data.get("limit") || "25");
    const before = cursors[cursors.length - 1];
    if (before !== null) params.set("before", String(before));
    return params;
  }

  function row(d, fresh) {
    const approved = d.approved || "—";
    return el(
      "tr",
      { class: fresh ? "new" : null, dataset: { seq: d.seq } },
      el("td", { class: "num" }, String(d.seq)),
      el("td", {}, fmtTime(d.time)),
      el("td", {}, d.source, d.session_id ? el("div", { class: "muted" }, ["session ", el("code", {}, d.session_id)]) : null),
      el("td", {}, `${d.workload} · ${d.size} `, el("span", { class: "muted" }, fmtConfig(d.config))),
      el("td", {}, el("strong", {}, d.choice)),
      el("td", { class: "num" }, d.confidence.toFixed(2)),
      el("td", {}, el("span", { class: `badge ${MODE_CLASS[d.mode] || ""}` }, d.mode)),
      el("td", {}, APPROVED_CLASS[approved] ? el("span", { class: `badge ${APPROVED_CLASS[approved]}` }, approved) : approved)
    );
  }

  async function load() {
    const onNewest = cursors.length === 1;
    try {
      const page = await api(`/v1/audit?${query()}`);
      const rows = page.decisions;
      nextBefore = page.next_before;
      const top = rows.length ? rows[0].seq : 0;
      const mark = onNewest && newestSeq > 0;
      body.replaceChildren(
        ...(rows.length
          ? rows.map((d) => row(d, mark && d.seq > newestSeq))
          : [el("tr", { class: "empty" }, el("td", { colspan: 8 }, cursors.length > 1 ? "No older decision." : "No decision matches."))])
      );
      if (onNewest) {
        newestSeq = Math.max(newestSeq, top);
        missed = 0;
      }
      buttons.newest.disabled = onNewest;
      buttons.newer.disabled = onNewest;
      buttons.older.disabled = nextBefore === null || nextBefore === undefined;
      const where = onNewest ? "Newest decisions" : `Page ${cursors.length}`;
      const span = rows.length ? `: #${rows[0].seq} to #${rows[rows.length - 1].seq}` : "";
      info.textContent = `${where}${span}.${missed ? ` ${missed} new since — see Newest.` : ""}`;
    } catch (error) {
      body.replaceChildren(el("tr", {}, el("td", { colspan: 8, class: "error" }, error.message)));
    }
  }

  form.addEventListener("change", () => {
    cursors = [null];
    newestSeq = 0; // a new filter: nothing is "new"
    load();
  });
  form.addEventListener("submit", (event) => event.preventDefault());
  buttons.older.addEventListener("click", () => {
    if (nextBefore === null || nextBefore === undefined) return;
    cursors.push(nextBefore);
    load();
  });
  buttons.newer.addEventListener("click", () => {
    if (cursors.length > 1) cursors.pop();
    load();
  });
  buttons.newest.addEventListener("click", () => {
    cursors = [null];
    load();
  });

  await load();
  const soon = refresher(load);
  const arrived = (envelope) => {
    if (cursors.length === 1) soon();
    else if (envelope.type === "decision.made") {
      missed += 1;
      const base = info.textContent.replace(/ \d+ new since — see Newest\.$/, "");
      info.textContent = `${base} ${missed} new since — see Newest.`;
    }
  };
  onEvent("decision.", arrived);
  onEvent("approval.", arrived); // the Approved column
  onReconnect(() => load());
}
