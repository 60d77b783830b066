// mqhub admin page: polls the JSON API and renders with DOM calls (textContent only: queue
// names, addresses and bodies come from clients and are never parsed as HTML).
"use strict";

const POLL_MS = 2000;
const PAGE = 50;
const state = { offset: 0, sort: "name", q: "", total: 0, selected: null };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) {
    node.append(c instanceof Node ? c : (c === null || c === undefined ? "" : String(c)));
  }
  return node;
}

function fmt(n) { return typeof n === "number" ? n.toLocaleString("en-US") : (n ?? ""); }

function setStatus(text) { document.getElementById("status").textContent = text; }

async function api(path, method, body) {
  const opts = { method: method || "GET", headers: {} };
  if (method && method !== "GET") {
    opts.headers["Content-Type"] = "application/json";
    const token = sessionStorage.getItem("mqhub-token");
    if (token) opts.headers["Authorization"] = "Bearer " + token;
    opts.body = JSON.stringify(body || {});
  }
  let res = await fetch(path, opts);
  if (res.status === 401 && method && method !== "GET") {
    const token = window.prompt("Admin token (--admin-token file):");
    if (token) {
      sessionStorage.setItem("mqhub-token", token.trim());
      opts.headers["Authorization"] = "Bearer " + token.trim();
      res = await fetch(path, opts);
    }
  }
  const data = await res.json().catch(() => ({}));
  if (!res.ok) throw new Error(data.error || res.statusText);
  return data;
}

function fill(tableId, rows) {
  const body = document.querySelector(`#${tableId} tbody`);
  if (!rows.length) {
    const cols = document.querySelectorAll(`#${tableId} thead th`).length;
    rows = [el("tr", { class: "empty" }, el("td", { colspan: cols }, "none"))];
  }
  body.replaceChildren(...rows);
}

// Fields of a protocol's /api/stats row shown in their own columns; the rest are its counters.
const ROW_FIELDS = new Set(["connections", "published", "published_rate", "delivered",
  "delivered_rate", "acked", "acked_rate"]);

function protocolCounters(p) {
  const own = Object.entries(p).filter(([k, v]) => !ROW_FIELDS.has(k) && typeof v === "number" && v);
  return own.length ? own.map(([k, v]) => `${k} ${fmt(v)}`).join(" · ") : "—";
}

function renderStats(s) {
  document.getElementById("uptime").textContent = "up " + Math.round(s.uptime) + " s";
  const rows = Object.entries(s.protocols).map(([name, p]) => el("tr", { "data-protocol": name },
    el("td", {}, name), el("td", {}, fmt(p.connections)), el("td", {}, fmt(p.published)),
    el("td", {}, fmt(p.published_rate)), el("td", {}, fmt(p.delivered)),
    el("td", {}, fmt(p.delivered_rate)), el("td", {}, fmt(p.acked)),
    el("td", { class: "counters" }, protocolCounters(p))));
  fill("protocols", rows);
  document.getElementById("totals").textContent =
    `${fmt(s.queues)} queues · ${fmt(s.depth)} ready · ${fmt(s.in_flight)} in flight · ` +
    `${fmt(s.dead_letters)} dead letters`;
}

function queueRow(q) {
  const tr = el("tr", { "data-queue": q.name },
    el("td", {}, q.name),
    el("td", { "data-field": "depth" }, fmt(q.depth)),
    el("td", { "data-field": "in_flight" }, fmt(q.in_flight)),
    el("td", { "data-field": "deferred" }, fmt(q.deferred)),
    el("td", { "data-field": "dead" }, fmt(q.dead)),
    el("td", { "data-field": "consumers" }, fmt(q.consumers)),
    el("td", { "data-field": "messages" }, fmt(q.messages)),
    el("td", { "data-field": "rate" }, fmt(q.rate)),
    el("td", { "data-field": "max_attempts" }, q.max_attempts || "∞"));
  if (q.name === state.selected) tr.classList.add("selected");
  tr.addEventListener("click", () => select(q.name));
  return tr;
}

async function refreshQueues() {
  const params = new URLSearchParams({ offset: state.offset, limit: PAGE, sort: state.sort, q: state.q });
  const page = await api("/api/queues?" + params);
  state.total = page.total;
  fill("queues", page.queues.map(queueRow));
  const last = Math.min(page.total, state.offset + page.queues.length);
  document.getElementById("page-info").textContent =
    page.total ? `${state.offset + 1}–${last} of ${fmt(page.total)}` : "no queues";
  document.getElementById("prev-page").disabled = state.offset === 0;
  document.getElementById("next-page").disabled = last >= page.total;
}

async function refreshDetail() {
  if (!state.selected) return;
  const name = encodeURIComponent(state.selected);
  let q;
  const window_ = window.mqhubHistoryWindow ? window.mqhubHistoryWindow() : "10m";
  try { q = await api("/api/queues/" + name + "?window=" + window_); } catch (e) { closeDetail(); return; }
  if (window.mqhubDrawQueue) window.mqhubDrawQueue(q.history);
  const input = document.getElementById("max-attempts");
  if (document.activeElement !== input) input.value = q.max_attempts;
  const dlq = await api("/api/dlq/" + name + "?limit=50");
  document.querySelector('[data-field="dlq-total"]').textContent = fmt(dlq.total);
  fill("dlq", dlq.dead_letters.map((d) => el("tr", { "data-dead-letter": d.id },
    el("td", {}, d.id), el("td", {}, d.reason), el("td", {}, d.origin), el("td", {}, d.address),
    el("td", {}, d.attempts), el("td", {}, d.last_error || ""),
    el("td", { class: "preview" }, d.preview))));
}

async function refreshOthers() {
  const [addrs, conns, boxes, sched] = await Promise.all([
    api("/api/addresses?limit=100"), api("/api/connections"), api("/api/mailboxes?limit=100"),
    api("/api/schedules?limit=100")]);
  fill("addresses", addrs.addresses.map((a) => el("tr", {}, el("td", {}, a.address),
    el("td", {}, a.queues.join(", ")),
    el("td", {}, Object.entries(a.subscribers).map(([p, n]) => `${p}: ${n}`).join(", ")))));
  fill("connections", conns.connections.map((c) => el("tr", {}, el("td", {}, c.protocol),
    el("td", {}, c.kind ? `${c.peer} (${c.kind})` : c.peer),
    el("td", {}, c.since ? new Date(c.since * 1000).toLocaleTimeString() : ""),
    el("td", {}, fmt(c.message_count ?? c.in_msgs ?? c.messages ?? "")))));
  fill("mailboxes", boxes.mailboxes.map((b) => el("tr", {}, el("td", {}, b.mail_id),
    el("td", {}, fmt(b.urgent ?? 0)), el("td", {}, fmt(b.normal ?? 0)), el("td", {}, fmt(b.notify ?? 0)),
    el("td", {}, fmt(b.consumers)),
    el("td", {}, b.expires_at ? new Date(b.expires_at * 1000).toLocaleString() : ""))));
  fill("schedules", sched.schedules.map((s) => el("tr", {}, el("td", {}, s.key),
    el("td", {}, s.interval ?? ""), el("td", {}, s.cron ?? ""), el("td", {}, fmt(s.runs)))));
  fill("workers", (sched.workers || []).map((w) => el("tr", {}, el("td", {}, w.peer),
    el("td", {}, w.queues.join(", ")), el("td", {}, fmt(w.slots)), el("td", {}, fmt(w.in_flight)))));
  document.getElementById("delays").textContent =
    `${fmt(sched.pending)} delayed entries pending · ${fmt(sched.deferred_messages)} deferred messages`;
}

async function refreshHealth() {
  const res = await fetch("/healthz");
  const h = await res.json();
  const badge = document.getElementById("health");
  badge.textContent = h.status;
  badge.className = "badge " + (res.ok ? "ok" : "bad");
  badge.title = (h.problems || []).join("\n");
}

async function refresh() {
  try {
    const stats = await api("/api/stats");
    renderStats(stats);
    await refreshQueues();
    await refreshDetail();
    await refreshOthers();
    await refreshHealth();
    setStatus("updated " + new Date().toLocaleTimeString());
  } catch (e) {
    setStatus("update failed: " + e.message);
  }
}

function select(name) {
  state.selected = name;
  document.getElementById("detail-name").textContent = name;
  document.getElementById("queue-detail").hidden = false;
  document.getElementById("max-attempts").value = "";
  refresh();
}

function closeDetail() {
  state.selected = null;
  document.getElementById("queue-detail").hidden = true;
}

async function act(action) {
  const name = state.selected;
  if (!name) return;
  const q = encodeURIComponent(name);
  try {
    if (action === "close") { closeDetail(); return; }
    if (action === "save-settings") {
      const n = parseInt(document.getElementById("max-attempts").value, 10);
      await api("/api/queues/" + q, "PATCH", { max_attempts: Number.isNaN(n) ? 0 : n });
      setStatus(`max_attempts of ${name} set`);
    } else if (action === "pause" || action === "resume") {
      await api(`/api/queues/${q}/${action}`, "POST");
      setStatus(`${name} ${action}d`);
    } else if (action === "purge-queue") {
      if (!window.confirm(`Purge every message of ${name}?`)) return;
      await api(`/api/queues/${q}/purge`, "POST");
      setStatus(`${name} purged`);
    } else if (action === "replay") {
      const r = await api(`/api/dlq/${q}/replay`, "POST");
      setStatus(`${r.replayed} dead letters of ${name} replayed`);
    } else if (action === "purge") {
      if (!window.confirm(`Delete every dead letter of ${name}?`)) return;
      const r = await api(`/api/dlq/${q}/purge`, "POST");
      setStatus(`${r.purged} dead letters of ${name} purged`);
    }
  } catch (e) {
    setStatus(`${action} failed: ${e.message}`);
  }
  refresh();
}

function setup() {
  let typing;
  document.getElementById("queue-filter").addEventListener("input", (ev) => {
    clearTimeout(typing);
    typing = setTimeout(() => { state.q = ev.target.value.trim(); state.offset = 0; refresh(); }, 250);
  });
  document.getElementById("prev-page").addEventListener("click", () => {
    state.offset = Math.max(0, state.offset - PAGE); refresh();
  });
  document.getElementById("next-page").addEventListener("click", () => {
    if (state.offset + PAGE < state.total) { state.offset += PAGE; refresh(); }
  });
  for (const th of document.querySelectorAll("th[data-sort]")) {
    th.addEventListener("click", () => {
      const key = th.dataset.sort;
      state.sort = state.sort === key ? "-" + key : (key === "name" ? key : "-" + key);
      for (const o of document.querySelectorAll("th[data-sort]")) o.classList.remove("sorted", "asc");
      th.classList.add("sorted");
      if (!state.sort.startsWith("-")) th.classList.add("asc");
      refresh();
    });
  }
  for (const b of document.querySelectorAll("#queue-detail button[data-action]")) {
    b.addEventListener("click", () => act(b.dataset.action));
  }
  // the charts' first history request is answered first (charts.js), then the tables'
  Promise.resolve(window.mqhubFirstHistory).catch(() => {}).finally(refresh);
  setInterval(refresh, POLL_MS);
}

document.addEventListener("DOMContentLoaded", setup);
