// HPC-DS1 console: the client shared by every section.
//
// Each section is an ES module static/sections/<id>.js exporting `async function init(root)`;
// it imports what it needs from here:  import { api, onEvent, el, table } from "../console.js";
// This module loads them all, in the page's order, once the page is parsed. A section that
// fails to load or to initialise shows its error in place; the others go on.

const PAGE = readPageData();

function readPageData() {
  const node = document.getElementById("console-data");
  if (!node) return { sections: [], event_types: [], user: null };
  try {
    return JSON.parse(node.textContent);
  } catch {
    return { sections: [], event_types: [], user: null };
  }
}

/** Data the server put in the page: {sections, event_types, user: {name, role}, server_url, ...}. */
export const page = PAGE;

// --- HTTP --------------------------------------------------------------------------------

/** An API call that failed: `message` is the server's own explanation. */
export class ApiError extends Error {
  constructor(message, status, body) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.body = body;
  }
}

function explain(body, status, statusText) {
  if (body && typeof body === "object") {
    const parts = [];
    if (typeof body.error === "string") parts.push(body.error);
    if (typeof body.detail === "string") parts.push(body.detail);
    else if (Array.isArray(body.detail)) {
      for (const issue of body.detail.slice(0, 5)) {
        if (issue && typeof issue === "object") {
          const where = Array.isArray(issue.loc) ? issue.loc.filter((x) => x !== "body").join(".") : "";
          parts.push(where ? `${where}: ${issue.msg}` : String(issue.msg));
        }
      }
    }
    if (parts.length) return parts.join(" — ");
  }
  return `${status} ${statusText || "error"}`.trim();
}

/**
 * Same-origin JSON call to the gateway with the session cookie and the header the server's
 * CSRF rule asks for. Resolves to the parsed JSON (null for an empty body); throws ApiError
 * with the server's explanation for any status outside 2xx. While the page loads, identical
 * GETs of several sections are sent once (each caller gets its own copy).
 *   await api("/v1/stats")
 *   await api(`/v1/approvals/${id}`, { method: "POST", body: { approved: true, note } })
 */
export async function api(path, options = {}) {
  const { method = "GET", body, signal, headers = {} } = options;
  if (loading && method.toUpperCase() === "GET" && body === undefined && !signal) {
    // While the page loads, sections asking for the same data share one request.
    let pending = loadReads.get(path);
    if (!pending) {
      pending = request(path, options);
      loadReads.set(path, pending);
    }
    const value = await pending;
    return value !== null && typeof value === "object" ? structuredClone(value) : value;
  }
  return request(path, options);
}

// True until every section has initialised: identical GETs meanwhile are made once.
let loading = true;
const loadReads = new Map(); // path -> Promise of its parsed body

async function request(path, { method = "GET", body, signal, headers = {} } = {}) {
  const init = {
    method,
    credentials: "same-origin",
    signal,
    headers: { Accept: "application/json", "X-Requested-With": "hpc-ds1-console", ...headers },
  };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const text = await response.text();
  let parsed = null;
  if (text) {
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = text;
    }
  }
  if (!response.ok) {
    if (response.status === 401) signedOut();
    throw new ApiError(explain(parsed, response.status, response.statusText), response.status, parsed);
  }
  return parsed;
}

function signedOut() {
  if (document.getElementById("signed-out")) return;
  const note = el(
    "p",
    { id: "signed-out", class: "section-error", role: "alert" },
    "This browser's session is no longer valid. ",
    el("a", { href: "/" }, "Sign in again"),
    "."
  );
  document.querySelector("main")?.prepend(note);
}

/** Who is signed in: {name, role}. From the page when it has it, else GET /v1/whoami. */
let whoamiPromise = null;
export function whoami() {
  if (!whoamiPromise) {
    whoamiPromise = PAGE.user ? Promise.resolve(PAGE.user) : api("/v1/whoami");
  }
  return whoamiPromise;
}

/** Whether a role may act (approve, run, submit): engineer or admin; a viewer only sees. */
export function canAct(role) {
  return role === "engineer" || role === "admin";
}

// --- live events -------------------------------------------------------------------------

const listeners = []; // {prefix, callback}
const reconnectListeners = [];
let source = null;
let lastSeq = 0;
let everOpen = false;

function setLive(state, text) {
  const badge = document.getElementById("live");
  if (!badge) return;
  badge.className = `live ${state}`;
  badge.textContent = text;
}

function deliver(message) {
  let envelope;
  try {
    envelope = JSON.parse(message.data);
  } catch {
    return;
  }
  if (typeof envelope.seq === "number") {
    if (envelope.seq <= lastSeq) return; // already delivered (a resumed stream)
    lastSeq = envelope.seq;
  }
  for (const { prefix, callback } of listeners.slice()) {
    if (!envelope.type || !envelope.type.startsWith(prefix)) continue;
    try {
      callback(envelope);
    } catch (error) {
      console.error(`console: a listener of "${prefix}" failed`, error);
    }
  }
}

function connect() {
  if (source || typeof EventSource === "undefined") return;
  source = new EventSource("/v1/stream");
  // The server names each message by its event type; listen to every type the log knows.
  for (const type of PAGE.event_types || []) source.addEventListener(type, deliver);
  source.onmessage = deliver; // unnamed messages, if any
  source.onopen = () => {
    setLive("on", "live");
    if (everOpen) {
      // A new stream starts at the log's end (a restarted server may even have a new log):
      // what was missed meanwhile is for the sections to read again.
      lastSeq = 0;
      for (const callback of reconnectListeners.slice()) {
        try {
          callback();
        } catch (error) {
          console.error("console: a reconnect listener failed", error);
        }
      }
    }
    everOpen = true;
  };
  source.onerror = () => {
    if (source.readyState === EventSource.CLOSED) {
      setLive("off", "disconnected");
      source = null;
      // A closed stream (401 after a revoked cookie, a restarted server) is retried slowly.
      setTimeout(connect, 5000);
    } else {
      setLive("off", "reconnecting…");
    }
  };
}

/**
 * Call `callback(envelope)` for every new event of the log whose type starts with `typePrefix`
 * ("" for all; "session." for a session's; "approval.requested" for one type). The envelope is
 * {seq, id, type, subject, time, actor, source, data, ...}. Returns a function that unsubscribes.
 * One EventSource on /v1/stream serves every section.
 */
export function onEvent(typePrefix, callback) {
  const entry = { prefix: typePrefix || "", callback };
  listeners.push(entry);
  connect();
  return () => {
    const at = listeners.indexOf(entry);
    if (at >= 0) listeners.splice(at, 1);
  };
}

/** Call `callback()` when the stream comes back after a break (events may have been missed:
 *  refetch). Returns a function that unsubscribes. */
export function onReconnect(callback) {
  reconnectListeners.push(callback);
  return () => {
    const at = reconnectListeners.indexOf(callback);
    if (at >= 0) reconnectListeners.splice(at, 1);
  };
}

// --- DOM helpers -------------------------------------------------------------------------

/**
 * el("button", {type: "button", class: "secondary", onclick: fn, "aria-label": "Approve"}, "Yes")
 * Attributes: `class`, `dataset` (object), `style` (string), `on<event>` (function), boolean
 * true/false (present/absent), anything else as an attribute. Children: strings, numbers,
 * nodes, arrays of those; null, undefined and false are skipped.
 */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("on") && typeof value === "function") {
      node.addEventListener(key.slice(2).toLowerCase(), value);
    } else if (key === "value" && "value" in node) node.value = value;
    else if (value === true) node.setAttribute(key, "");
    else node.setAttribute(key, String(value));
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(node, child);
    else if (child instanceof Node) node.appendChild(child);
    else node.appendChild(document.createTextNode(String(child)));
  }
}

/**
 * A table of `rows` (objects). `columns`: [{label, value: row => string|Node, num: bool,
 * key}] or plain strings (the label, also the row's key). Options: {caption, empty, rowAttrs:
 * row => attrs}. Returns a scrolling wrapper around <table class="data">.
 */
export function table(rows, columns, { caption, empty = "Nothing yet.", rowAttrs } = {}) {
  const cols = columns.map((c) => (typeof c === "string" ? { label: c, key: c } : c));
  const cell = (tag, col, content) =>
    el(tag, { class: col.num ? "num" : null, scope: tag === "th" ? "col" : null }, content);
  const head = el("thead", {}, el("tr", {}, cols.map((c) => cell("th", c, c.label))));
  const body = el("tbody");
  if (!rows || rows.length === 0) {
    body.appendChild(el("tr", { class: "empty" }, el("td", { colspan: cols.length }, empty)));
  } else {
    for (const row of rows) {
      const tr = el("tr", rowAttrs ? rowAttrs(row) : {});
      for (const col of cols) {
        let content = col.value ? col.value(row) : row[col.key];
        if (content === null || content === undefined || content === "") content = "—";
        tr.appendChild(cell("td", col, content));
      }
      body.appendChild(tr);
    }
  }
  const t = el("table", { class: "data" }, caption ? el("caption", {}, caption) : null, head, body);
  return el("div", { class: "table-wrap" }, t);
}

// --- formatting --------------------------------------------------------------------------

const pad = (n) => String(n).padStart(2, "0");

/** An ISO time (or Date, or epoch seconds) as "2026-11-30 13:17:21" UTC; "—" for none. */
export function fmtTime(value) {
  if (value === null || value === undefined || value === "") return "—";
  const d = value instanceof Date ? value : new Date(typeof value === "number" ? value * 1000 : value);
  if (Number.isNaN(d.getTime())) return String(value);
  return (
    `${d.getUTCFullYear()}-${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())} ` +
    `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}:${pad(d.getUTCSeconds())}`
  );
}

/** Seconds as "840 µs", "12.3 ms", "1.23 s", "4 min 05 s", "2 h 03 min"; "—" for none. */
export function fmtSeconds(value) {
  if (value === null || value === undefined || Number.isNaN(Number(value))) return "—";
  const s = Number(value);
  const a = Math.abs(s);
  if (a === 0) return "0 s";
  if (a < 1e-3) return `${(s * 1e6).toPrecision(3)} µs`;
  if (a < 1) return `${(s * 1e3).toPrecision(3)} ms`;
  if (a < 60) return `${s.toPrecision(3)} s`;
  if (a < 3600) return `${Math.floor(s / 60)} min ${pad(Math.round(s % 60))} s`;
  return `${Math.floor(s / 3600)} h ${pad(Math.round((s % 3600) / 60))} min`;
}

const CONFIG_ORDER = ["ranks", "threads", "tile", "gpu"];

/** A configuration as "ranks=2 threads=1 tile=64": the usual knobs first, whatever order it
 *  came in, then any other knob, the workload's own knobs ("knobs": {"nb": 64}) flattened
 *  among them; gpu only when on; "—" for none. */
export function fmtConfig(config) {
  if (!config || typeof config !== "object") return "—";
  const own = config.knobs && typeof config.knobs === "object" ? config.knobs : {};
  const flat = { ...config, ...own };
  delete flat.knobs;
  const keys = [
    ...CONFIG_ORDER.filter((k) => k in flat),
    ...Object.keys(flat).filter((k) => !CONFIG_ORDER.includes(k)),
  ];
  const parts = keys
    .filter((k) => !(k === "gpu" && flat[k] === false))
    .map((k) => `${k}=${flat[k]}`);
  return parts.length ? parts.join(" ") : "—";
}

/** The badge class of a decision mode. */
export const MODE_CLASS = { auto: "ok", confirm: "warn", escalate: "bad" };

/** Whether a GET /v1/workloads answer offers workload `name`. */
export const offersWorkload = (workloads, name) => workloads.some((w) => w.name === name);

/** Run `load` soon, at most once per quarter second however many events come; and once more
 *  when they stop, after the projection has folded what the last one announced. */
export function refresher(load) {
  let pending = false;
  let again = null;
  return () => {
    if (!pending) {
      pending = true;
      setTimeout(() => {
        pending = false;
        load();
      }, 250);
    }
    clearTimeout(again);
    again = setTimeout(load, 1500);
  };
}

/** A share 0..1 as "87 %"; "—" for none. */
export function fmtPercent(value, digits = 0) {
  if (value === null || value === undefined || Number.isNaN(Number(value))) return "—";
  return `${(Number(value) * 100).toFixed(digits)} %`;
}

// --- start -------------------------------------------------------------------------------

async function initSection(id) {
  const root = document.getElementById(id);
  if (!root) return;
  const started = performance.now();
  try {
    const module = await import(`./sections/${id}.js`);
    if (typeof module.init !== "function") throw new Error(`sections/${id}.js exports no init(root)`);
    await module.init(root);
    root.dataset.ready = "true";
    // When its init finished, in ms since navigation (benchmarks/bench_console.py reads it).
    root.dataset.readyMs = String(Math.round(performance.now()));
  } catch (error) {
    console.error(`console: section ${id} failed`, error);
    root.dataset.ready = "error";
    root.appendChild(
      el("p", { class: "section-error", role: "alert" }, `This section could not load: ${error.message}`)
    );
  }
}

async function start() {
  connect();
  await Promise.all((PAGE.sections || []).map(initSection));
  loading = false;
  loadReads.clear();
  document.body.dataset.readyMs = String(Math.round(performance.now())); // since navigation
  document.body.dataset.ready = "true";
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
else start();
