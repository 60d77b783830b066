// mqhub admin page: the history charts, drawn with uPlot (installed from npm by `make web` and
// served by the broker itself as /static/vendor/uPlot.iife.min.js: no CDN, works offline).
// Reads GET /api/history every 2 s; a queue's chart is fed by app.js from its detail.
// Tests read window.mqhubCharts[name] = {plot, keys}: plot.data[0] is the time axis and
// plot.data[i + 1] the values of keys[i] ([family, label] of /api/history, or a field of a
// queue's history), drawn in colours[i].
"use strict";

const CHART_POLL_MS = 2000;
const HISTORY_SERIES = "published,delivered,connections,dead_lettered,totals,queue_depth," +
  "queue_in_flight,process,store";
const PALETTE = ["#2463b5", "#e07b1f", "#2e9e5b", "#c2185b", "#7a5cc2", "#1795a8", "#a0782b",
  "#d64541", "#4d7c0f", "#5b6b8c"];
const OTHER_COLOUR = "#9aa3ad";
const DASH = [5, 4];
const DOTS = [1, 3];
const chartState = { window: "10m", colours: new Map(), drawn: false };
window.mqhubCharts = {};

// One colour per name within a group, kept while the page lives (a queue keeps its colour).
function colourOf(group, name) {
  if (name === "_other") return OTHER_COLOUR;
  let names = chartState.colours.get(group);
  if (!names) chartState.colours.set(group, names = new Map());
  if (!names.has(name)) names.set(name, PALETTE[names.size % PALETTE.length]);
  return names.get(name);
}

function compact(v) {
  if (v === null || v === undefined) return "—";
  const a = Math.abs(v);
  if (a >= 1e9) return (v / 1e9).toFixed(1) + "G";
  if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (a >= 1e4) return (v / 1e3).toFixed(0) + "k";
  if (a >= 1e3) return (v / 1e3).toFixed(1) + "k";
  return Number.isInteger(v) ? String(v) : v.toFixed(a < 10 ? 2 : 1);
}
const mib = (v) => (v === null || v === undefined ? "—" : (v / 1048576).toFixed(v < 1048576 * 10 ? 1 : 0) + " MiB");
const ms = (v) => (v === null || v === undefined ? "—" : v.toFixed(v < 1 ? 2 : 1) + " ms");
const SCALES = { y: compact, r: compact, mem: mib, ms: ms };

// Labels of one family by name, "_other" last (a stable order: a chart is rebuilt only when
// its set of series changes).
function labels(doc, family) {
  return Object.keys(doc.series[family] || {}).sort((a, b) =>
    (a === "_other") - (b === "_other") || a.localeCompare(b));
}

function protocolNames(doc, ...families) {
  const names = new Set();
  for (const f of families) for (const p of Object.keys(doc.series[f] || {})) names.add(p);
  return [...names].sort();
}

// Each chart: the series it draws from an /api/history document.
const CHARTS = {
  rates: (doc) => protocolNames(doc, "published", "delivered").flatMap((p) => [
    { key: ["published", p], label: p + " in", stroke: colourOf("protocol", p), scale: "y" },
    { key: ["delivered", p], label: p + " out", stroke: colourOf("protocol", p), scale: "y", dash: DASH },
  ]),
  depth: (doc) => labels(doc, "queue_depth").map((q) =>
    ({ key: ["queue_depth", q], label: q, stroke: colourOf("queue", q), scale: "y" })),
  in_flight: (doc) => labels(doc, "queue_in_flight").map((q) =>
    ({ key: ["queue_in_flight", q], label: q, stroke: colourOf("queue", q), scale: "y" })),
  dead: (doc) => [
    { key: ["totals", "dead_letters"], label: "held", stroke: "#c2185b", scale: "y", fill: "rgba(194,24,91,.08)" },
    ...labels(doc, "dead_lettered").map((r) =>
      ({ key: ["dead_lettered", r], label: r + "/s", stroke: colourOf("reason", r), scale: "r", dash: DASH })),
  ],
  connections: (doc) => protocolNames(doc, "connections").map((p) =>
    ({ key: ["connections", p], label: p, stroke: colourOf("protocol", p), scale: "y" })),
  system: () => [
    { key: ["process", "rss_bytes"], label: "RSS", stroke: "#2463b5", scale: "mem", fill: "rgba(36,99,181,.07)" },
    { key: ["store", "commit_ms_mean"], label: "commit mean", stroke: "#e07b1f", scale: "ms", dash: DASH },
    { key: ["store", "commit_ms_max"], label: "commit max", stroke: "#d64541", scale: "ms", dash: DOTS },
  ],
};

const QUEUE_SERIES = [
  { key: ["depth"], label: "ready", stroke: "#2463b5", scale: "y", fill: "rgba(36,99,181,.08)" },
  { key: ["in_flight"], label: "in flight", stroke: "#2e9e5b", scale: "y" },
  { key: ["dead"], label: "dead letters", stroke: "#c2185b", scale: "y" },
  { key: ["rate"], label: "put/s", stroke: "#e07b1f", scale: "r", dash: DASH },
];

function axis(scale, side) {
  const fmt = SCALES[scale];
  return { scale, side, size: 58, stroke: "#6a7380", font: "11px system-ui, sans-serif",
    grid: { show: side === 3, stroke: "#eef1f4", width: 1 }, ticks: { stroke: "#dde2e8", size: 4 },
    values: (u, vals) => vals.map(fmt) };
}

// Time ticks as 24-hour clock times (seconds only in the 10-minute window).
function clock(t, withSeconds) {
  return new Date(t * 1000).toLocaleTimeString("en-GB",
    withSeconds ? { hour: "2-digit", minute: "2-digit", second: "2-digit" } : { hour: "2-digit", minute: "2-digit" });
}

function options(width, specs) {
  const used = [...new Set(specs.map((s) => s.scale))];
  const scales = { x: { time: true } };
  for (const s of used) scales[s] = { range: (u, min, max) => [0, max > 0 ? max * 1.08 : 1] };
  return {
    width, height: 170, scales, legend: { live: true }, hooks: { ready: [showNewest] },
    cursor: { points: { size: 5 } },
    series: [{ value: (u, t) => (t === null ? "—" : clock(t, true)) },
      ...specs.map((s) => ({ label: s.label, stroke: s.stroke, width: 1.5, dash: s.dash,
        fill: s.fill, scale: s.scale, points: { show: false }, spanGaps: false,
        value: (u, v) => SCALES[s.scale](v) }))],
    axes: [{ stroke: "#6a7380", font: "11px system-ui, sans-serif", grid: { stroke: "#eef1f4", width: 1 },
      ticks: { stroke: "#dde2e8", size: 4 }, space: 64,
      values: (u, vals) => vals.map((t) => clock(t, chartState.window === "10m")) },
      ...used.map((s, i) => axis(s, i === 0 ? 3 : 1))],
  };
}

// Draw (or update) chart ``name`` inside ``figure`` with ``specs`` over ``times``.
function draw(name, figure, specs, times, valuesOf) {
  const box = figure.querySelector(".plot");
  if (typeof uPlot === "undefined") {
    box.textContent = "charts need uPlot: run `make web` (mqhub/web/package.json)";
    return;
  }
  const data = [times, ...specs.map((s) => valuesOf(s.key))];
  const shape = specs.map((s) => s.label + "@" + s.scale).join("|");
  const chart = window.mqhubCharts[name];
  let plot;
  if (chart && chart.shape === shape) {
    plot = chart.plot;
    plot.setData(data);
  } else {
    if (chart) chart.plot.destroy();
    box.replaceChildren();
    plot = new uPlot(options(Math.max(240, box.clientWidth), specs), data, box);
    // away from the cursor the legend shows the newest values
    plot.over.addEventListener("mouseleave", () => showNewest(plot));
  }
  window.mqhubCharts[name] = { plot, shape, keys: specs.map((s) => s.key),
    colours: specs.map((s) => s.stroke) };
  if (plot.cursor.left < 0 || plot.cursor.left === undefined) showNewest(plot);
}

function showNewest(plot) {
  const n = plot.data[0].length;
  if (n) plot.setLegend({ idx: n - 1 });
}

function drawHistory(doc) {
  for (const [name, pick] of Object.entries(CHARTS)) {
    const figure = document.querySelector(`figure[data-chart="${name}"]`);
    if (!figure) continue;
    draw(name, figure, pick(doc), doc.t, ([family, label]) =>
      (doc.series[family] && doc.series[family][label]) || doc.t.map(() => null));
  }
  const note = document.getElementById("history-note");
  note.textContent = doc.t.length
    ? `${doc.t.length} points, one per ${doc.step >= 60 ? doc.step / 60 + " min" : doc.step + " s"}`
    : "collecting…";
  if (!chartState.drawn) {
    chartState.drawn = true;
    performance.mark("mqhub-charts-drawn");
  }
}

// A queue's history, from its detail (app.js calls this with q.history).
window.mqhubDrawQueue = function (h) {
  const figure = document.querySelector('figure[data-chart="queue"]');
  if (!figure || !h) return;
  draw("queue", figure, QUEUE_SERIES, h.t, ([field]) => h[field]);
};

window.mqhubHistoryWindow = () => chartState.window;

async function fetchHistory() {
  const res = await fetch(`/api/history?window=${chartState.window}&series=${HISTORY_SERIES}`);
  if (!res.ok) throw new Error((await res.json().catch(() => ({}))).error || res.statusText);
  return res.json();
}

async function refreshCharts(pending) {
  try {
    drawHistory(await (pending || fetchHistory()));
  } catch (e) {
    document.getElementById("history-note").textContent = "history unavailable: " + e.message;
  }
}

// The first history request leaves as soon as this script runs, ahead of the tables' requests
// (a broker with 100,000 queues answers /api/stats in tens of milliseconds).
const firstHistory = fetchHistory();
firstHistory.catch(() => {});
window.mqhubFirstHistory = firstHistory;

function setupCharts() {
  for (const b of document.querySelectorAll("button[data-window]")) {
    b.addEventListener("click", () => {
      chartState.window = b.dataset.window;
      for (const o of document.querySelectorAll("button[data-window]")) o.classList.toggle("active", o === b);
      refreshCharts();
    });
  }
  let resizing;
  window.addEventListener("resize", () => {
    clearTimeout(resizing);
    resizing = setTimeout(() => {
      for (const c of Object.values(window.mqhubCharts)) {
        const box = c.plot.root.parentElement;
        if (box.clientWidth) c.plot.setSize({ width: box.clientWidth, height: 170 });
      }
    }, 150);
  });
  refreshCharts(firstHistory);
  setInterval(refreshCharts, CHART_POLL_MS);
}

document.addEventListener("DOMContentLoaded", setupCharts);
