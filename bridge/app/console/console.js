// The jms-bridge console: plain DOM calls on the admin JSON API, no framework, nothing fetched
// from elsewhere. The admin token lives in this tab's sessionStorage only; every data call sends
// it as "Authorization: Bearer". Data is put in the page with textContent, never as HTML.
"use strict";

const TOKEN_KEY = "jms-bridge-admin-token";
const BROWSE_LIMIT = 200;
const BINS = 24;
// Shown from /metrics in the health section (summed over their labels).
const METRICS = ["jms_bridge_connections_open", "jms_bridge_amqp_connections_open",
  "jms_bridge_staging_pending", "jms_bridge_staged_total", "jms_bridge_staging_released_total",
  "jms_bridge_dead_letters_total", "jms_bridge_staging_undeliverable_total"];

const $ = (id) => document.getElementById(id);
let dlqQueue = null; // the dead-letter queue shown in detail

class Unauthorized extends Error {}
class ApiError extends Error {
  constructor(message, status, body) { super(message); this.status = status; this.body = body; }
}

// -- the token ------------------------------------------------------------------------------

// A link may carry the token in its fragment (#token=...), which browsers never send to a
// server; it is moved to sessionStorage and taken out of the address bar and the history.
function takeTokenFromFragment() {
  const found = /(?:^#|&)token=([^&]*)/.exec(location.hash);
  if (!found) return;
  sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(found[1]));
  history.replaceState(null, "", location.pathname);
}

const token = () => sessionStorage.getItem(TOKEN_KEY) || "";

// -- calling the API ------------------------------------------------------------------------

function query(params) {
  const kept = Object.entries(params || {}).filter(([, v]) => v !== "" && v !== null && v !== undefined);
  return kept.length ? "?" + new URLSearchParams(kept).toString() : "";
}

// {status, body} of a call; Unauthorized for 401/403 (the API's own words kept).
async function call(method, path, params) {
  let response;
  try {
    response = await fetch(path + query(params), {
      method, cache: "no-store", headers: { Authorization: "Bearer " + token() },
    });
  } catch (e) {
    throw new Error(`${method} ${path}: the bridge did not answer (${e.message})`);
  }
  const text = await response.text();
  let body = text;
  try { body = JSON.parse(text); } catch { /* /metrics is text */ }
  if (response.status === 401 || response.status === 403) {
    throw new Unauthorized((body && body.error) || response.statusText);
  }
  return { status: response.status, body };
}

// The body of a successful call; an ApiError naming the problem otherwise.
async function api(method, path, params) {
  const { status, body } = await call(method, path, params);
  if (status >= 400) {
    throw new ApiError((body && body.error) || `${method} ${path}: HTTP ${status}`, status, body);
  }
  return body;
}

// -- showing --------------------------------------------------------------------------------

function banner(text, kind) {
  const el = $("banner");
  el.textContent = text;
  el.className = kind || "info";
  el.hidden = !text;
}

function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

function button(label, onClick, cls) {
  const b = el("button", label, { type: "button" });
  if (cls) b.className = cls;
  b.addEventListener("click", () => guarded(onClick));
  return b;
}

function fillTable(id, rows, cells) {
  const body = $(id).querySelector("tbody");
  body.replaceChildren(...rows.map((row) => {
    const tr = el("tr");
    for (const cell of cells(row)) {
      const td = el("td");
      if (cell instanceof Node) td.append(cell); else td.textContent = cell ?? "";
      tr.append(td);
    }
    return tr;
  }));
}

function plural(n, word) { return `${n} ${word}${n === 1 ? "" : "s"}`; }

function clearData() {
  for (const body of document.querySelectorAll("main tbody")) body.replaceChildren();
  $("due-chart").replaceChildren();
  $("health-facts").replaceChildren();
  $("policy-report").replaceChildren();
  $("staged-summary").textContent = "";
  $("dlq-detail").hidden = true;
  $("dlq-incomplete").hidden = true;
  dlqQueue = null;
}

// Runs an action; what goes wrong is shown in the banner (a refused token clears the page).
async function guarded(action) {
  try {
    await action();
  } catch (e) {
    if (e instanceof Unauthorized) {
      clearData();
      banner(`Not authorized: ${e.message}. Type the admin token above.`, "auth");
    } else {
      banner(e.message, "error");
    }
  }
}

// -- health ---------------------------------------------------------------------------------

function metricSums(text) {
  const sums = {};
  for (const line of String(text).split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const name = line.split(/[{ ]/, 1)[0];
    if (METRICS.includes(name)) sums[name] = (sums[name] || 0) + Number(line.slice(line.lastIndexOf(" ") + 1));
  }
  return sums;
}

async function loadHealth() {
  const health = await api("GET", "/healthz");
  const ready = await call("GET", "/readyz");
  const metrics = await api("GET", "/metrics");
  const facts = [
    ["alive", `${health.status}, up ${health.uptime_s} s`],
    ["ready", ready.body.status + (ready.body.problem ? `: ${ready.body.problem}` : "")],
    ["broker", `${ready.body.broker} at ${ready.body.upstream}`],
    ...Object.entries(metricSums(metrics)),
  ];
  $("health-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", k), el("dd", v)]));
  $("health").className = ready.status === 200 ? "ready" : "not-ready";
}

// -- staged messages ------------------------------------------------------------------------

const stagedSelector = () => $("staged-selector").value.trim();

async function loadStaged() {
  const rows = await api("GET", "/staged", { selector: stagedSelector(), message_id: $("staged-id").value.trim() });
  rows.sort((a, b) => a.due_ms - b.due_ms);
  const byTarget = {};
  for (const r of rows) byTarget[r.target] = (byTarget[r.target] || 0) + 1;
  fillTable("staged-by-destination", Object.entries(byTarget).sort((a, b) => b[1] - a[1]), ([t, n]) => [t, n]);
  fillTable("staged-rows", rows, (r) => [r.message_id, r.target, r.due, r.size, actions(r.message_id)]);
  $("staged-summary").textContent = `${plural(rows.length, "staged message")}` +
    (stagedSelector() ? ` selected by ${stagedSelector()}` : "");
  drawDueChart(rows.map((r) => r.due_ms));
}

function actions(id) {
  const span = el("span", null, { class: "row-actions" });
  span.append(
    button("Cancel", () => stagedOne(id, "cancel"), "danger"),
    button("Release now", () => stagedOne(id, "release")),
    button("Reschedule", () => stagedOne(id, "reschedule")));
  return span;
}

// "10m", "90s", "2h" are durations (in=); anything else a time (at=, ISO 8601 or epoch ms).
function when() {
  const text = $("staged-when").value.trim();
  if (!text) throw new Error("Reschedule: type when (a duration such as 10m, or a time) first");
  return /^\d+\s*[a-z]+$/i.test(text) ? { in: text } : { at: text };
}

const VERBS = { cancel: "Cancel", release: "Release now", reschedule: "Reschedule" };

async function stagedOne(id, action) {
  const due = action === "reschedule" ? when() : {};
  const to = due.in ? ` to ${due.in} from now` : due.at ? ` to ${due.at}` : "";
  if (!confirm(`${VERBS[action]} 1 staged message (${id})${to}?`)) return;
  const done = await api("POST", `/staged/${encodeURIComponent(id)}/${action}`, due);
  banner(Object.entries(done).map(([k, v]) => `${k} ${v}`).join(", "), "info");
  await loadStaged();
}

async function stagedSelected(action) {
  const selector = stagedSelector();
  if (!selector) throw new Error(`${VERBS[action]}: type a selector first (it picks the messages)`);
  const due = action === "reschedule" ? when() : {};
  const { count } = await api("GET", "/staged", { selector, count: 1 });
  if (!confirm(`${VERBS[action]} ${plural(count, "staged message")} selected by ${selector}?`)) return;
  const { status, body } = await call("POST", `/staged/${action}`, { selector, ...due });
  if (body.error) throw new ApiError(body.error, status, body);
  const done = body.cancelled || body.released || body.rescheduled || [];
  const failed = Object.entries(body.failed || {}).map(([id, why]) => `${id}: ${why}`);
  banner(`${action}: ${done.length} of ${body.selected} done` + (failed.length ? `; failed: ${failed.join("; ")}` : ""),
    failed.length ? "error" : "info");
  await loadStaged();
}

// A histogram of the due times, as SVG: one bar per bin, its range and count in its tooltip.
function drawDueChart(dues) {
  const svg = $("due-chart");
  const ns = "http://www.w3.org/2000/svg";
  const shape = (tag, attrs, text) => {
    const node = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  };
  svg.replaceChildren();
  const width = Number(svg.getAttribute("width")), height = Number(svg.getAttribute("height"));
  const left = 30, bottom = 20, top = 8, plotW = width - left - 8, plotH = height - top - bottom;
  if (!dues.length) {
    svg.append(shape("text", { x: left, y: height / 2, class: "empty" }, "nothing staged"));
    return;
  }
  const lo = Math.min(...dues), hi = Math.max(Math.max(...dues), lo + 60000);
  const span = (hi - lo) / BINS;
  const counts = new Array(BINS).fill(0);
  for (const d of dues) counts[Math.min(BINS - 1, Math.floor((d - lo) / span))]++;
  const most = Math.max(...counts);
  const barW = plotW / BINS;
  counts.forEach((n, i) => {
    const h = n ? Math.max(1, (n / most) * plotH) : 0;
    const bar = shape("rect", { x: left + i * barW + 1, y: top + plotH - h, width: barW - 2, height: h, class: "bar" });
    const from = new Date(lo + i * span).toISOString(), to = new Date(lo + (i + 1) * span).toISOString();
    bar.append(shape("title", {}, `${n} due ${from} to ${to}`));
    svg.append(bar);
  });
  const label = (ms) => new Date(ms).toISOString().replace("T", " ").slice(0, 16);
  svg.append(
    shape("line", { x1: left, y1: top + plotH, x2: left + plotW, y2: top + plotH, class: "axis" }),
    shape("text", { x: 2, y: top + 10 }, String(most)),
    shape("text", { x: 2, y: top + plotH }, "0"),
    shape("text", { x: left, y: height - 4 }, label(lo)),
    shape("text", { x: left + plotW, y: height - 4, "text-anchor": "end" }, label(hi) + " UTC"));
}

// -- dead letters ---------------------------------------------------------------------------

async function loadQueues() {
  const listing = await api("GET", "/dlq");
  const queues = listing.queues.filter((q) => q.messages > 0 || !$("dlq-nonempty").checked);
  fillTable("dlq-queues", queues, (q) => [q.queue, q.messages, button("Browse", () => openQueue(q.queue))]);
  // Never a partial list that looks whole: say what is missing and why.
  $("dlq-incomplete").textContent = listing.incomplete
    ? `Incomplete: only the queues known by name are shown; ${listing.incomplete}` : "";
  $("dlq-incomplete").hidden = !listing.incomplete;
}

async function openQueue(name) {
  dlqQueue = name;
  $("dlq-name").textContent = name;
  $("dlq-detail").hidden = false;
  await browse();
}

const dlqPath = (what) => `/dlq/${encodeURIComponent(dlqQueue)}/${what}`;
const dlqSelector = () => $("dlq-selector").value.trim();

async function browse() {
  const selector = dlqSelector();
  const summary = await api("GET", dlqPath("summary"), { selector });
  fillTable("dlq-by-reason", Object.entries(summary.by_reason), ([k, n]) => [k, n]);
  fillTable("dlq-by-destination", Object.entries(summary.by_destination), ([k, n]) => [k, n]);
  const body = $("dlq-body").checked;
  const entries = await api("GET", dlqPath("messages"), { selector, limit: BROWSE_LIMIT, body: body ? "true" : "" });
  fillTable("dlq-rows", entries, (e) => [e.position, e.original_id, e.reason, e.original_destination,
    e.failed_at, e.delivery_count, e.size, body ? e.body : ""]);
  banner(`${dlqQueue}: ${plural(summary.count, "dead letter")}` + (selector ? ` selected by ${selector}` : "") +
    (entries.length >= BROWSE_LIMIT ? ` (the first ${BROWSE_LIMIT} shown)` : ""), "info");
}

async function dlqChange(operation) {
  if (!dlqQueue) return;
  const selector = dlqSelector();
  const to = $("dlq-to").value.trim();
  if (operation === "move" && !to) throw new Error("Move: type the queue to move them to first");
  const { count } = await api("GET", dlqPath("count"), { selector });
  const which = selector ? `selected by ${selector}` : "(every message of the queue)";
  const where = operation === "purge" ? " (they are gone for good)" :
    to ? ` to ${to}` : operation === "replay" ? " to their original destinations" : "";
  const verb = operation[0].toUpperCase() + operation.slice(1);
  if (!confirm(`${verb} ${plural(count, "dead letter")} of ${dlqQueue} ${which}${where}?`)) return;
  const params = { selector, to: operation === "purge" ? "" : to, all: operation === "purge" && !selector ? "true" : "" };
  const { status, body } = await call("POST", dlqPath(operation), params);
  if (status >= 400 && !("done" in body)) throw new ApiError(body.error || `HTTP ${status}`, status, body);
  await loadQueues();
  await browse();
  const skipped = body.skipped ? `; ${body.skipped} left (no original destination: give To)` : "";
  banner(`${operation}: ${body.done} of ${body.picked} done${skipped}` + (body.error ? `; stopped: ${body.error}` : ""),
    body.error ? "error" : "info");
}

// -- redelivery policy ----------------------------------------------------------------------

async function loadPolicy() {
  const destination = $("policy-destination").value.trim();
  if (!destination) throw new Error("Redelivery policy: type a destination first");
  const r = await api("GET", "/policy", { destination });
  const facts = el("dl");
  for (const [k, v] of [["destination", `${r.kind} ${r.name}` + (r.scope ? ` (exchange ${r.scope})` : "")],
    ["pattern", r.pattern ?? "(none: the default)"], ["dialect", r.dialect], ["policy", r.policy],
    ["applied", r.applied ? "yes" : `no: ${r.broker_handles}`]]) facts.append(el("dt", k), el("dd", v));
  const table = el("table");
  table.append(el("thead"), el("tbody"));
  table.tHead.append(el("tr"));
  for (const h of ["failures", "action"]) table.tHead.rows[0].append(el("th", h));
  for (const f of r.failures) {
    const tr = el("tr");
    tr.append(el("td", f.first === f.last ? f.first : `${f.first} to ${f.last ?? "more"}`), el("td", f.action));
    table.tBodies[0].append(tr);
  }
  $("policy-report").replaceChildren(facts, table);
}

// -- wiring ---------------------------------------------------------------------------------

async function refreshAll() {
  if (!token()) {
    clearData();
    banner("Type the admin token above (or open a link ending in #token=...) to see the bridge's data.", "info");
    return;
  }
  await guarded(async () => {
    await loadStaged(); // first: a refused token stops here, before anything is shown
    banner("", "info");
    await loadHealth();
    await loadQueues();
  });
}

function submit(id, action) {
  $(id).addEventListener("submit", (event) => { event.preventDefault(); guarded(action); });
}

document.addEventListener("DOMContentLoaded", () => {
  takeTokenFromFragment();
  submit("token-form", async () => {
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    await refreshAll();
  });
  $("forget").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    refreshAll();
  });
  submit("staged-form", loadStaged);
  submit("dlq-form", browse);
  submit("policy-form", loadPolicy);
  $("health-refresh").addEventListener("click", () => guarded(loadHealth));
  $("dlq-refresh").addEventListener("click", () => guarded(loadQueues));
  $("dlq-nonempty").addEventListener("change", () => guarded(loadQueues));
  $("staged-cancel-all").addEventListener("click", () => guarded(() => stagedSelected("cancel")));
  $("staged-release-all").addEventListener("click", () => guarded(() => stagedSelected("release")));
  $("staged-reschedule-all").addEventListener("click", () => guarded(() => stagedSelected("reschedule")));
  for (const op of ["replay", "move", "purge"]) $(`dlq-${op}`).addEventListener("click", () => guarded(() => dlqChange(op)));
  window.addEventListener("hashchange", () => { takeTokenFromFragment(); refreshAll(); });
  refreshAll();
});
