// The sluicegate console: plain JavaScript over the inspect server's JSON
// (docs/decisions/console-front-end.md). Every change sends the token the server put in
// the page; errors of actions stay in #messages until dismissed or the action succeeds.
"use strict";

const $ = (id) => document.getElementById(id);
const TOKEN = document.querySelector("meta[name=sluicegate-token]").content;
const REFRESH_MS = 3000;
const OUTCOMES = ["admitted", "existing", "collapsed", "dropped", "rejected", "expired",
                  "failed", "cancelled"];
window.refreshes = 0;  // how many refreshes have finished (tests wait on it)

class HttpError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function call(method, path, body) {
  const headers = {"Accept": "application/json"};
  if (method !== "GET") {
    headers["Content-Type"] = "application/json";
    headers["Authorization"] = "Bearer " + TOKEN;
  }
  let res;
  try {
    res = await fetch(path, {method, headers,
                             body: body === undefined ? undefined : JSON.stringify(body)});
  } catch (e) {
    throw new HttpError(0, "the inspect server did not answer (is `sluicegate inspect serve` running?)");
  }
  let doc = null;
  try { doc = await res.json(); } catch (e) { doc = null; }
  if (!res.ok) {
    throw new HttpError(res.status, (doc && doc.error) || (res.status + " " + res.statusText));
  }
  return doc;
}

// -- messages that stay ---------------------------------------------------------------

function showError(topic, text) {
  clearError(topic);
  const li = document.createElement("li");
  li.dataset.topic = topic;
  li.textContent = text;
  const close = document.createElement("button");
  close.type = "button";
  close.textContent = "dismiss";
  close.onclick = () => li.remove();
  li.appendChild(close);
  $("messages").appendChild(li);
}

function clearError(topic) {
  for (const li of $("messages").querySelectorAll("li")) {
    if (li.dataset.topic === topic) li.remove();
  }
}

// -- helpers --------------------------------------------------------------------------

function el(tag, text, className) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (className) e.className = className;
  return e;
}

function row(cells, classes) {
  const tr = document.createElement("tr");
  cells.forEach((c, i) => {
    const td = c instanceof Node ? (() => { const t = el("td"); t.appendChild(c); return t; })()
                                 : el("td", c);
    if (classes && classes[i]) td.className = classes[i];
    tr.appendChild(td);
  });
  return tr;
}

function runLink(id, label) {
  if (!id) return el("span", "");
  const a = el("a", label || id);
  a.href = "#runs/" + encodeURIComponent(id);
  a.className = "run-link";
  return a;
}

// Every time the console shows is UTC, as the command line's and the why-sentences' are
// (docs/decisions/times-in-utc.md): the time of day, with the date when it is not today.
function utc(ms) {
  const iso = new Date(ms).toISOString();
  const day = iso.slice(0, 10);
  const today = new Date().toISOString().slice(0, 10);
  return (day === today ? "" : day + " ") + iso.slice(11, 19) + " UTC";
}

function when(iso) {
  if (!iso) return "";
  return utc(Date.parse(iso));
}

function chart(perMinute, sinceMs) {
  // One bar a minute over the last hour, stacked: admitted, existing, collapsed, the rest.
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "chart");
  svg.setAttribute("width", "120");
  svg.setAttribute("height", "24");
  const max = Math.max(1, ...perMinute.map((m) => OUTCOMES.reduce((s, o) => s + (m[o] || 0), 0)));
  for (const m of perMinute) {
    const x = Math.floor((m.minute_ms - sinceMs) / 60000) * 2;
    let y = 24;
    const parts = [["admitted", m.admitted || 0], ["existing", m.existing || 0],
                   ["collapsed", m.collapsed || 0],
                   ["other", OUTCOMES.slice(3).reduce((s, o) => s + (m[o] || 0), 0)]];
    for (const [cls, n] of parts) {
      if (!n) continue;
      const h = Math.max(1, Math.round((n / max) * 24));
      y -= h;
      const r = document.createElementNS(ns, "rect");
      r.setAttribute("x", String(x));
      r.setAttribute("y", String(y));
      r.setAttribute("width", "2");
      r.setAttribute("height", String(h));
      r.setAttribute("class", cls);
      svg.appendChild(r);
    }
  }
  const title = document.createElementNS(ns, "title");
  title.textContent = perMinute.map((m) => utc(m.minute_ms) + ": " +
      OUTCOMES.filter((o) => m[o]).map((o) => o + " " + m[o]).join(", ")).join("\n");
  svg.appendChild(title);
  return svg;
}

function waited(ms) {
  // 2m10s, 1h05m, 45s: the flow view's way of writing a wait.
  const s = Math.round(ms / 1000);
  if (s < 60) return s + "s";
  const m = Math.floor(s / 60);
  if (m < 60) return m + "m" + String(s % 60).padStart(2, "0") + "s";
  return Math.floor(m / 60) + "h" + String(m % 60).padStart(2, "0") + "m";
}

function queueChart(perMinute, sinceMs) {
  // The queue over the last hour, a bar a minute for its depth and a line for how long its
  // oldest start had waited, each to its own scale.
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "chart queue");
  svg.setAttribute("width", "120");
  svg.setAttribute("height", "24");
  const depth = Math.max(1, ...perMinute.map((m) => m.queued));
  const wait = Math.max(1, ...perMinute.map((m) => m.oldest_wait_ms));
  const points = [];
  for (const m of perMinute) {
    const x = Math.floor((m.minute_ms - sinceMs) / 60000) * 2;
    const h = Math.max(1, Math.round((m.queued / depth) * 24));
    const r = document.createElementNS(ns, "rect");
    r.setAttribute("x", String(x));
    r.setAttribute("y", String(24 - h));
    r.setAttribute("width", "2");
    r.setAttribute("height", String(h));
    r.setAttribute("class", "queued");
    svg.appendChild(r);
    points.push((x + 1) + "," + (24 - Math.round((m.oldest_wait_ms / wait) * 23)));
  }
  if (points.length > 1) {
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", points.join(" "));
    line.setAttribute("class", "wait");
    svg.appendChild(line);
  }
  // Minutes counted back from the one under way: no clock time, so no time zone.
  const ago = (m) => 59 - Math.floor((m.minute_ms - sinceMs) / 60000);
  const title = document.createElementNS(ns, "title");
  title.textContent = perMinute.length === 0 ? "nothing waited in the last hour"
    : perMinute.map((m) => (ago(m) === 0 ? "this minute" : ago(m) + " min ago") + ": " +
                    m.queued + " queued, the oldest waiting " + waited(m.oldest_wait_ms))
        .join("\n");
  svg.appendChild(title);
  return svg;
}

function lastHour(wf, sinceMs) {
  // The decisions' chart above the queue's, in one cell, so the row keeps its width.
  const box = el("div");
  box.className = "last-hour";
  box.append(chart(wf.per_minute, sinceMs), queueChart(wf.queue_per_minute, sinceMs));
  return box;
}

// -- tabs -----------------------------------------------------------------------------

function currentTab() {
  const hash = location.hash.replace(/^#/, "");
  const name = hash.split("/")[0] || "overview";
  return $("tab-" + name) ? name : "overview";
}

function showTab() {
  const name = currentTab();
  for (const s of document.querySelectorAll("section.tab")) s.hidden = s.id !== "tab-" + name;
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", a.dataset.tab === name);
  }
  const parts = location.hash.replace(/^#/, "").split("/");
  if (name === "runs" && parts.length > 1) {
    const id = decodeURIComponent(parts.slice(1).join("/"));
    $("run-id").value = id;
    lookup(id);
  }
  refresh();
}

// -- overview -------------------------------------------------------------------------

function renderOverview(doc) {
  const body = $("overview-table").querySelector("tbody");
  body.replaceChildren();
  $("overview-empty").hidden = doc.workflows.length !== 0;
  for (const wf of doc.workflows) {
    // A workflow the ledger names but the declarations do not (a rejected typo).
    const state = wf.paused
      ? "PAUSED" + (wf.pause && wf.pause.reason ? ": " + wf.pause.reason : "")
      : wf.declared === false ? "not declared" : "running";
    const button = el("button", wf.paused ? "Unpause" : "Pause", wf.paused ? "unpause" : "pause");
    button.type = "button";
    button.onclick = () => setPaused(wf.workflow, !wf.paused);
    const full = wf.fullest_key;
    const limit = wf.limit !== null ? " / " + wf.limit
        : full ? " (" + (full.key === null ? "(one key)" : full.key) + ": " + full.in_flight +
                 "/" + full.limit + fromTable(full, doc.limits_topic) + ")" : "";
    const tr = row([wf.workflow, state, ...OUTCOMES.map((o) => wf.counts[o]), wf.queued,
                    wf.waiting || "", wf.in_flight + limit, lastHour(wf, doc.since_ms), button],
                   ["", wf.paused ? "text state paused"
                        : wf.declared === false ? "text state undeclared" : "text state",
                    ...OUTCOMES.map((o) => "count-" + o), "queued", "waiting", "inflight"]);
    tr.dataset.workflow = wf.workflow;
    if (wf.override) {
      const cell = tr.querySelector("td.inflight");
      cell.textContent += " (override)";
      cell.title = overrideTitle(wf.override);
    }
    // A workflow with two limits: an override of either is named.
    const overridden = (wf.limits || []).filter((l) => l.override);
    if (overridden.length) {
      const cell = tr.querySelector("td.inflight");
      cell.textContent += " (override of " + overridden.map((l) => l.control).join(", ") + ")";
      cell.title = overridden.map((l) => l.control + ": " + l.limit + ", " +
                                        overrideTitle(l.override)).join("\n");
    }
    if (wf.pause) {
      tr.querySelector("td.state").title = (wf.paused ? "paused" : "unpaused") + " at " +
          utc(wf.pause.at_ms) + (wf.pause.by ? " by " + wf.pause.by : "");
    }
    body.appendChild(tr);
  }
}

function fromTable(key, topic) {
  // A key whose own limit comes from the limits table rather than the declaration.
  return key.declared !== undefined && key.declared !== null
      ? " from " + topic + ", declared " + key.declared : "";
}

function overrideTitle(override) {
  return "override since " + utc(override.at_ms) +
      (override.by ? " by " + override.by : "") +
      (override.reason ? ": " + override.reason : "") + "; declared " + override.declared;
}

function renderPools(doc) {
  const body = $("pools-table").querySelector("tbody");
  body.replaceChildren();
  $("pools-table").hidden = !doc.pools || doc.pools.length === 0;
  for (const pool of doc.pools || []) {
    const lines = pool.keys.length === 0
        ? [{key: null, in_flight: pool.in_flight, limit: pool.limit, queued: pool.queued}]
        : pool.keys.map((k) => ({key: k.key === "" ? "(one key)" : k.key,
                                 in_flight: k.in_flight, limit: k.limit, queued: k.queued,
                                 declared: k.limit_row ? k.limit_row.declared : null}));
    for (const line of lines) {
      const tr = row([pool.pool, pool.members.join(", "), line.key || "",
                      line.in_flight + (line.limit !== null ? " / " + line.limit : "") +
                      fromTable(line, doc.limits_topic) + (pool.override ? " (override)" : ""),
                      line.queued || 0],
                     ["text", "text", "text", "inflight", "queued"]);
      tr.dataset.pool = pool.pool;
      if (pool.override) tr.querySelector("td.inflight").title = overrideTitle(pool.override);
      body.appendChild(tr);
    }
    // A keyed pool lists the keys whose starts all wait up to a bound; the rest in one row.
    if (pool.more_keys) {
      const tr = row([pool.pool, pool.members.join(", "),
                      "and " + pool.more_keys + " more keys waiting", "0", pool.more_queued],
                     ["text", "text", "text", "inflight", "queued"]);
      tr.dataset.pool = pool.pool;
      body.appendChild(tr);
    }
  }
}

function rate(limit, periodMs) {
  // `10/1m`, as the override form and `--throttle` take it.
  const units = [[86400000, "d"], [3600000, "h"], [60000, "m"], [1000, "s"]];
  for (const [ms, unit] of units) {
    if (periodMs % ms === 0) return limit + "/" + periodMs / ms + unit;
  }
  return limit + "/" + periodMs + "ms";
}

function renderPaces(doc) {
  // Each throttle and rateLimit in force: an override's (who, when, why, the declared
  // pace), or as declared; a key whose own pace is its row of the limits table.
  const body = $("paces-table").querySelector("tbody");
  body.replaceChildren();
  let any = false;
  for (const wf of doc.workflows) {
    for (const pace of wf.paces || []) {
      any = true;
      const declared = rate(pace.declared, pace.declared_period_ms);
      const from = pace.override
          ? "override since " + utc(pace.override.at_ms) +
            (pace.override.by ? " by " + pace.override.by : "") +
            (pace.override.reason ? ": " + pace.override.reason : "") + "; declared " + declared
          : pace.per_key ? "declared, or a key's row of " + pace.per_key + " in " +
                           doc.limits_topic
          : "declared";
      const tr = row([wf.workflow, pace.control, pace.keyed ? "per key" : "",
                      rate(pace.limit, pace.period_ms), from],
                     ["text", "text", "text", "pace", "text"]);
      tr.dataset.workflow = wf.workflow;
      tr.dataset.control = pace.control;
      body.appendChild(tr);
    }
    for (const key of wf.pace_keys || []) {
      const tr = row([wf.workflow, key.control, key.key === "" ? "(one key)" : key.key,
                      rate(key.limit, key.period_ms),
                      "from " + doc.limits_topic + ", declared " +
                      rate(key.declared, key.period_ms)],
                     ["text", "text", "text", "pace", "text"]);
      tr.dataset.workflow = wf.workflow;
      tr.dataset.control = key.control;
      body.appendChild(tr);
    }
  }
  $("paces-table").hidden = !any;
}

async function setPaused(workflow, paused) {
  const reason = $("pause-reason").value.trim();
  try {
    await call("POST", "/inspect/workflows/" + encodeURIComponent(workflow) + "/" +
               (paused ? "pause" : "unpause"), {reason: reason || null});
    clearError("pause");
  } catch (e) {
    showError("pause", (paused ? "Pause" : "Unpause") + " of " + workflow + " refused: " +
              e.message);
  }
  refresh();
}

// -- waiting --------------------------------------------------------------------------

function renderWaiting(doc) {
  const body = $("waiting-table").querySelector("tbody");
  body.replaceChildren();
  $("waiting-empty").hidden = doc.waiting.length !== 0;
  for (const w of doc.waiting) {
    const tr = row([w.workflow, w.key === null ? "" : w.key, w.control || w.deferral || "",
                    runLink(w.request_id), when(w.requested_at), w.why],
                   ["", "text", "text", "text", "", "text why"]);
    tr.dataset.request = w.request_id;
    body.appendChild(tr);
  }
}

// -- runs -----------------------------------------------------------------------------

async function lookup(id) {
  const out = $("run-result");
  out.replaceChildren(el("p", "Looking up " + id + "…"));
  let doc;
  try {
    doc = await call("GET", "/inspect/runs/" + encodeURIComponent(id));
  } catch (e) {
    out.replaceChildren(el("p", e.message, "error run-error"));
    return;
  }
  out.replaceChildren(el("p", id + ": matched as " + doc.matched, "matched"));
  for (const run of doc.runs) {
    out.appendChild(el("h3", "Run " + run.execution_id + " (" + run.workflow + ")"));
    const t = el("table");
    t.className = "run-row";
    for (const [k, v] of [["status", run.status], ["admitted", run.admitted_at],
                          ["updated", run.updated_at], ["ended", run.ended_at],
                          ["reason", run.last_reason], ["retries spent", run.retries_spent],
                          ["engine run id", run.run_id],
                          ["slots", run.slots.map((s) => s.stage + " " + JSON.stringify(s.key)).join(", ")],
                          ["payload", run.payload === null ? run.payload_note
                                                           : JSON.stringify(run.payload)]]) {
      if (v === null || v === undefined || v === "") continue;
      const tr = row([k, v], ["", "text"]);
      tr.dataset.field = k;
      t.appendChild(tr);
    }
    out.appendChild(t);
    if (run.changes.length) {
      out.appendChild(el("h4", "Status changes seen"));
      const c = el("table");
      for (const ch of run.changes) c.appendChild(row([ch.at, ch.status, ch.reason || ""],
                                                      ["", "text", "text"]));
      out.appendChild(c);
    }
  }
  for (const eid of doc.execution_ids) {
    if (!doc.runs.some((r) => r.execution_id === eid)) {
      out.appendChild(el("p", "Run " + eid + ": no row in the runs table."));
    }
  }
  if (doc.waiting && doc.waiting.length) {
    // Why each request still queued waits, and when it should go (the why-sentence).
    out.appendChild(el("h3", "Waiting"));
    const w = el("table");
    w.id = "run-waiting";
    for (const x of doc.waiting) w.appendChild(row([x.request_id, x.why], ["text", "text why"]));
    out.appendChild(w);
  }
  out.appendChild(el("h3", "Ledger history"));
  const h = el("table");
  h.id = "run-history";
  const head = el("tr");
  for (const x of ["decided", "outcome", "request", "key", "control", "due", "run", "reason"]) {
    head.appendChild(el("th", x));
  }
  h.appendChild(head);
  for (const r of doc.ledger) {
    const tr = row([r.decided_at, r.outcome, r.request_id, r.key === null ? "" : r.key,
                    r.control || r.deferral || "", r.due_at || "",
                    runLink(r.execution_id, r.execution_id ? r.execution_id.slice(0, 8) : ""),
                    r.reason || ""],
                   ["", "text outcome", "text", "text", "text", "", "text", "text"]);
    tr.className = "history";
    h.appendChild(tr);
  }
  out.appendChild(h);
}

// -- dead letters ---------------------------------------------------------------------

function renderDeadletters(doc) {
  const body = $("deadletters-table").querySelector("tbody");
  body.replaceChildren();
  $("deadletters-empty").hidden = doc.deadletters.length !== 0;
  for (const d of doc.deadletters) {
    body.appendChild(row([d.at, d.workflow || "", d.request_id || "", d.stage, d.reason,
                          d.source], ["", "text", "text", "text", "text reason", "text"]));
  }
}

// -- bulk -----------------------------------------------------------------------------

function bulkRequest() {
  const limit = parseInt($("bulk-limit").value, 10);
  return {
    verb: $("bulk-verb").value,
    workflow: $("bulk-workflow").value.trim() || null,
    status: $("bulk-status").value.trim() || null,
    mode: $("bulk-mode").value || null,
    reason: $("bulk-reason").value.trim() || null,
    limit: Number.isNaN(limit) ? null : limit,
  };
}

function dropApply() {
  // A changed form no longer matches the preview: preview again before applying.
  $("bulk-apply-slot").replaceChildren();
}

function fillRuns(tableId, runs) {
  const table = $(tableId);
  const body = table.querySelector("tbody");
  body.replaceChildren();
  for (const r of runs) {
    body.appendChild(row([runLink(r.execution_id), r.workflow || "", r.status || "",
                          r.detail || ""], ["", "text", "text", "text"]));
  }
  table.hidden = runs.length === 0;
}

async function preview() {
  dropApply();
  $("bulk-error").textContent = "";
  $("bulk-matched").textContent = "";
  $("bulk-result").replaceChildren();
  fillRuns("bulk-runs", []);
  fillRuns("bulk-skipped", []);
  const request = bulkRequest();
  let doc;
  try {
    doc = await call("POST", "/inspect/bulk/preview", request);
  } catch (e) {
    $("bulk-error").textContent = e.message;
    return;
  }
  if (typeof doc.matched !== "number") {
    $("bulk-error").textContent = "The preview returned no number of runs.";
    return;
  }
  const plural = (n) => n + " run" + (n === 1 ? "" : "s");
  $("bulk-matched").textContent = plural(doc.matched) + " matched" +
      (doc.truncated ? " (truncated: more match than the limit)" : "") + "." +
      (doc.skipped && doc.skipped.length ? " " + doc.skipped.length + " skipped." : "");
  fillRuns("bulk-runs", doc.listed || (doc.runs || []).map((id) => ({execution_id: id})));
  fillRuns("bulk-skipped", doc.skipped || []);
  const apply = el("button", "Apply " + request.verb + " to " + plural(doc.matched));
  apply.type = "button";
  apply.id = "bulk-apply";
  // Exactly the runs the preview listed, however the table changed since.
  apply.onclick = () => applyBulk({...request, only: doc.runs || []});
  $("bulk-apply-slot").appendChild(apply);
}

async function applyBulk(request) {
  dropApply();
  let doc;
  try {
    doc = await call("POST", "/inspect/bulk/apply", request);
  } catch (e) {
    $("bulk-error").textContent = e.message;
    return;
  }
  const list = $("bulk-result");
  list.replaceChildren();
  for (const r of doc.results || []) {
    const li = el("li", r.execution_id + ": " + r.outcome + (r.reason ? " (" + r.reason + ")" : ""),
                  r.outcome);
    list.appendChild(li);
  }
  $("bulk-matched").textContent = (doc.results || []).length + " done" +
      (doc.truncated ? "; more matched than the limit" : "") + ".";
  refresh();
}

// -- limit overrides --------------------------------------------------------------------

function limitRequest() {
  const control = $("limit-control").value;
  const value = parseInt($("limit-value").value, 10);
  const clear = $("limit-clear").checked;
  const request = {
    control: control,
    workflow: $("limit-workflow").value.trim() || null,
    pool: $("limit-pool").value.trim() || null,
    // Which of a workflow's limits: a concurrency limit's or a throttle's (a rateLimit
    // is one).
    nth: control === "rateLimit" ? 1 : parseInt($("limit-nth").value, 10) || 1,
    clear: clear,
    reason: $("limit-reason").value.trim() || null,
  };
  // A concurrency limit is a number of slots; a throttle's or a rateLimit's, LIMIT/PERIOD.
  if (control === "concurrency") {
    request.concurrency = clear || Number.isNaN(value) ? null : value;
  } else {
    request.rate = clear || Number.isNaN(value) ? null
        : value + "/" + $("limit-period").value.trim();
  }
  return request;
}

function limitControlChanged() {
  const concurrency = $("limit-control").value === "concurrency";
  $("limit-nth").disabled = $("limit-control").value === "rateLimit";
  $("limit-period").disabled = concurrency;
  dropLimitApply();
}

function dropLimitApply() {
  // A changed form no longer matches the preview: preview again before applying.
  $("limit-apply-slot").replaceChildren();
}

async function previewLimit() {
  dropLimitApply();
  $("limit-error").textContent = "";
  $("limit-preview-text").textContent = "";
  const request = limitRequest();
  let doc;
  try {
    doc = await call("POST", "/inspect/limits/preview", request);
  } catch (e) {
    $("limit-error").textContent = e.message;
    return;
  }
  if (typeof doc.admitted_now !== "number") {
    $("limit-error").textContent = "The preview returned no number of starts.";
    return;
  }
  const what = doc.note
      ? doc.note + "; " + doc.waiting + " starts wait there now, none is admitted at once"
      : doc.admitted_now + " of the " + doc.waiting + " waiting starts would be admitted now" +
        (doc.draining ? "; " + doc.draining + " runs over the new limit keep running and drain"
                      : "");
  $("limit-preview-text").textContent = doc.limit + ": " + doc.old + " -> " + doc.new +
      " (declared " + doc.declared_text + "). " + what + ".";
  const apply = el("button", "Apply: " + doc.old + " -> " + doc.new);
  apply.type = "button";
  apply.id = "limit-apply";
  apply.onclick = () => applyLimit(request);
  $("limit-apply-slot").appendChild(apply);
}

async function applyLimit(request) {
  dropLimitApply();
  let doc;
  try {
    doc = await call("POST", "/inspect/limits/apply", request);
  } catch (e) {
    $("limit-error").textContent = e.message;
    return;
  }
  $("limit-preview-text").textContent = doc.done;
  refresh();
}

// -- tail -----------------------------------------------------------------------------

function renderTail(doc) {
  const body = $("tail-table").querySelector("tbody");
  body.replaceChildren();
  for (const d of doc.decisions) {
    body.appendChild(row([when(d.decided_at), d.outcome, d.workflow, d.key === null ? "" : d.key,
                          runLink(d.execution_id, d.execution_id ? d.execution_id.slice(0, 8) : ""),
                          d.reason || ""],
                         ["", "text outcome", "text", "text", "text", "text"]));
  }
}

// -- the refresh loop -----------------------------------------------------------------

function query(params) {
  const q = Object.entries(params).filter(([, v]) => v).map(
      ([k, v]) => k + "=" + encodeURIComponent(v)).join("&");
  return q ? "?" + q : "";
}

let busy = false;

async function refresh() {
  if (busy) return;
  busy = true;
  const tab = currentTab();
  try {
    if (tab === "overview") {
      const doc = await call("GET", "/inspect/overview");
      renderOverview(doc);
      renderPools(doc);
      renderPaces(doc);
    } else if (tab === "waiting") {
      renderWaiting(await call("GET", "/inspect/waiting" + query({
        workflow: $("waiting-workflow").value.trim(), key: $("waiting-key").value})));
    } else if (tab === "deadletters") {
      renderDeadletters(await call("GET", "/inspect/deadletters"));
    } else if (tab === "tail") {
      renderTail(await call("GET", "/inspect/decisions" + query({
        workflow: $("tail-workflow").value.trim()})));
    } else {
      await call("GET", "/inspect/overview");  // the status line still says what is up
    }
    $("status").className = "";
    $("status").textContent = "Updated " + utc(Date.now()) +
        "; refreshed every " + REFRESH_MS / 1000 + " s.";
  } catch (e) {
    $("status").className = "error";
    $("status").textContent = (e.status === 503 ? "Kafka cannot be read (503): "
                               : "Could not refresh: ") + e.message;
  } finally {
    busy = false;
    window.refreshes += 1;
  }
}

$("bulk-preview").onclick = preview;
$("limit-preview").onclick = previewLimit;
for (const e of $("limit-form").querySelectorAll("input, select")) e.oninput = dropLimitApply;
$("limit-control").onchange = limitControlChanged;
for (const e of $("bulk-form").querySelectorAll("input, select")) e.oninput = dropApply;
$("run-form").onsubmit = (ev) => {
  ev.preventDefault();
  const id = $("run-id").value.trim();
  if (!id) return;
  const target = "#runs/" + encodeURIComponent(id);
  if (location.hash === target) lookup(id); else location.hash = target;
};
window.addEventListener("hashchange", showTab);
showTab();
setInterval(refresh, REFRESH_MS);
