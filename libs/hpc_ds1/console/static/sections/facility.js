// Facility at a glance: the four figures of GET /v1/stats, refreshed when an event that can
// change them arrives. The figures come from the projection, which may apply an event a moment
// after the stream shows it: each burst of events is followed by a read soon after and one a
// little later. At most one request is in flight.
import { api, onEvent, onReconnect, fmtPercent } from "../console.js";

const CHANGES = ["device.", "task.", "session.", "approval.", "decision."];

export async function init(root) {
  const figure = (name) => root.querySelector(`[data-figure="${name}"]`);
  let inFlight = false;
  let again = false;

  function show(stats) {
    const tasks = stats.tasks_running ?? 0;
    figure("devices_online").textContent = String(stats.devices_online);
    const running = figure("running");
    running.textContent = String(tasks + stats.sessions_running);
    running.title = `${tasks} tasks, ${stats.sessions_running} sessions`;
    figure("moves_waiting").textContent = String(stats.moves_waiting);
    const share = figure("auto_share");
    share.textContent = fmtPercent(stats.auto_share);
    share.title = `${stats.decisions_auto} of ${stats.decisions_total} decisions`;
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
        show(await api("/v1/stats"));
      } while (again);
    } catch (error) {
      console.error("facility: /v1/stats failed", error);
    } finally {
      inFlight = false;
    }
  }

  const timers = new Map(); // delay -> pending timer
  function soon() {
    for (const delay of [200, 1500]) {
      if (timers.has(delay)) continue;
      timers.set(delay, setTimeout(() => { timers.delete(delay); refresh(); }, delay));
    }
  }

  for (const prefix of CHANGES) onEvent(prefix, soon);
  onReconnect(refresh);
  // The page came with its figures; this read (not awaited: the page is ready without it)
  // covers what happened between the render and the stream's start.
  refresh();
}
