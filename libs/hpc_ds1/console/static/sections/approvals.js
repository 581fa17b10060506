// Moves waiting for an engineer: each with where it comes from, the job and its current
// configuration, the move, its confidence and why it is here; an engineer approves or rejects
// it with a note (a viewer sees the buttons disabled, and why). The moves decided lately follow,
// with who decided. Live on approval.* events.
import {
  api,
  canAct,
  el,
  fmtConfig,
  fmtTime,
  MODE_CLASS,
  onEvent,
  onReconnect,
  refresher,
  whoami,
} from "../console.js";

const DECIDED_SHOWN = 10;

export async function init(root) {
  const part = (name) => root.querySelector(`[data-part="${name}"]`);
  const me = await whoami();
  const mayDecide = canAct(me && me.role);
  const said = part("status");

  async function decide(approval, approve, note, buttons) {
    for (const b of buttons) b.disabled = true;
    said.className = "";
    said.textContent = `${approve ? "Approving" : "Rejecting"} ${approval.move}…`;
    try {
      const done = await api(`/v1/approvals/${encodeURIComponent(approval.approval_id)}`, {
        method: "POST",
        body: { decision: approve ? "approve" : "reject", note },
      });
      said.textContent =
        `${approval.move} on ${approval.workload} · ${approval.size} ${done.approved ? "approved" : "rejected"} ` +
        `by ${done.by}${approve ? ": the session goes on." : ": the session ends at its last good configuration."}`;
      loadWaiting();
      loadDecided();
    } catch (error) {
      said.className = "error";
      said.textContent = error.message;
      for (const b of buttons) b.disabled = !mayDecide;
    }
  }

  function waitingRow(a) {
    const id = a.approval_id;
    const noteId = `approval-note-${id}`;
    const note = el("input", {
      id: noteId,
      type: "text",
      maxlength: 2000,
      class: "approval-note",
      placeholder: "note (optional)",
      disabled: !mayDecide,
    });
    const why = mayDecide ? null : `needs an engineer token; you are signed in as ${me ? me.role : "nobody"}`;
    const approve = el("button", { type: "button", disabled: !mayDecide, title: why, "aria-label": `Approve ${a.move} on ${a.workload} ${a.size}` }, "Approve");
    const reject = el("button", { type: "button", class: "secondary", disabled: !mayDecide, title: why, "aria-label": `Reject ${a.move} on ${a.workload} ${a.size}` }, "Reject");
    approve.addEventListener("click", () => decide(a, true, note.value, [approve, reject]));
    reject.addEventListener("click", () => decide(a, false, note.value, [approve, reject]));
    const reasons = a.reasons && a.reasons.length ? a.reasons : [`${a.mode}: confidence ${a.confidence.toFixed(2)}`];
    return el(
      "tr",
      { dataset: { approvalId: id } },
      el("td", {}, el("strong", {}, a.device_id), el("div", { class: "muted" }, ["session ", el("code", {}, a.session_id)]), el("div", { class: "muted" }, fmtTime(a.requested_at))),
      el("td", {}, `${a.workload} · ${a.size}`, el("div", { class: "muted" }, fmtConfig(a.config))),
      el("td", {}, el("strong", {}, a.move)),
      el("td", { class: "num" }, a.confidence.toFixed(2), el("div", {}, el("span", { class: `badge ${MODE_CLASS[a.mode] || ""}` }, a.mode))),
      el("td", {}, el("ul", { class: "plain" }, reasons.map((r) => el("li", {}, r)))),
      el(
        "td",
        { class: "approval-actions" },
        el("label", { for: noteId, class: "visually-hidden" }, `Note for ${a.move} on ${a.workload} ${a.size}`),
        note,
        el("div", { class: "buttons" }, approve, " ", reject)
      )
    );
  }

  function decidedRow(a) {
    const approved = a.status === "approved";
    return el(
      "tr",
      { dataset: { approvalId: a.approval_id } },
      el("td", {}, fmtTime(a.decided_at)),
      el("td", {}, `${a.workload} · ${a.size}`, el("div", { class: "muted" }, fmtConfig(a.config))),
      el("td", {}, a.move, el("span", { class: "muted" }, ` (${a.confidence.toFixed(2)})`)),
      el("td", {}, el("span", { class: `badge ${approved ? "ok" : "bad"}` }, a.status)),
      el("td", {}, a.decided_by || "—", a.decided_role ? el("span", { class: "muted" }, ` (${a.decided_role})`) : null),
      el("td", {}, a.note || "—")
    );
  }

  async function loadWaiting() {
    const body = part("waiting");
    try {
      const { approvals } = await api("/v1/approvals");
      // Keep what an engineer is typing in a note when the table is drawn again.
      const typed = {};
      for (const input of body.querySelectorAll("input.approval-note")) if (input.value) typed[input.id] = input.value;
      const focused = document.activeElement && body.contains(document.activeElement) ? document.activeElement.id : null;
      body.replaceChildren(
        ...(approvals.length
          ? approvals.map(waitingRow)
          : [el("tr", { class: "empty" }, el("td", { colspan: 6 }, "Nothing is waiting for an engineer."))])
      );
      for (const [id, value] of Object.entries(typed)) {
        const input = document.getElementById(id);
        if (input) input.value = value;
      }
      if (focused) document.getElementById(focused)?.focus();
    } catch (error) {
      body.replaceChildren(el("tr", {}, el("td", { colspan: 6, class: "error" }, error.message)));
    }
  }

  async function loadDecided() {
    const body = part("decided");
    try {
      const { approvals } = await api(`/v1/approvals?status=decided&limit=${DECIDED_SHOWN}`);
      body.replaceChildren(
        ...(approvals.length
          ? approvals.map(decidedRow)
          : [el("tr", { class: "empty" }, el("td", { colspan: 6 }, "No move has been decided by an engineer yet."))])
      );
    } catch (error) {
      body.replaceChildren(el("tr", {}, el("td", { colspan: 6, class: "error" }, error.message)));
    }
  }

  await Promise.all([loadWaiting(), loadDecided()]);
  const soon = refresher(() => {
    loadWaiting();
    loadDecided();
  });
  onEvent("approval.", soon);
  onReconnect(soon);
}
