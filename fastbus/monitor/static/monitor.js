// fastbus monitor page: reads layout.json (what to show), then polls the
// JSON endpoints every second and draws tiles, rate charts (canvas) and
// tables.  No library, no CDN: this file is all of it.
"use strict";

const POLL_MS = 1000;
const KEEP_POINTS = 300;           // chart history: 5 minutes at one point a second
const COLORS = ["#1f6feb", "#d9480f", "#2f9e44", "#9c36b5", "#e8590c", "#0c8599"];

// One section per source: the layout itself, or each of its "sections"
// (fastbus monitor --broker: the queues and each broker).  Element ids are
// prefixed with the section's id and "/" (none for a single source).
const state = { layout: null, sections: [], polls: 0 };

function rel(path) { return path.replace(/^\//, ""); }   // relative to the page: works behind a path prefix

async function getJSON(path) {
  const r = await fetch(rel(path), { cache: "no-store" });
  const body = await r.json();
  return { status: r.status, body };
}

function dig(obj, dotted) {
  let v = obj;
  for (const part of dotted.split(".")) {
    if (v == null) return undefined;
    v = v[part];
  }
  return v;
}

function fmtNumber(v) {
  if (typeof v !== "number") return v == null ? "–" : String(v);
  if (Number.isInteger(v)) return v.toLocaleString("en-US");
  return v.toLocaleString("en-US", { maximumFractionDigits: Math.abs(v) < 10 ? 2 : 0 });
}

function fmtBytes(v) {
  if (typeof v !== "number") return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i ? v.toFixed(v < 10 ? 2 : 1) : String(Math.round(v))) + " " + units[i];
}

function fmtSeconds(v) {
  if (typeof v !== "number") return "–";
  v = Math.floor(v);
  const d = Math.floor(v / 86400), h = Math.floor(v % 86400 / 3600), m = Math.floor(v % 3600 / 60), s = v % 60;
  return (d ? d + "d " : "") + (d || h ? h + "h " : "") + (d || h || m ? m + "m " : "") + s + "s";
}

function fmt(v, unit) {
  if (typeof v === "boolean") return v ? "yes" : "no";
  if (unit === "bytes") return fmtBytes(v);
  if (unit === "s") return fmtSeconds(v);
  if (unit === "time") return typeof v === "number" ? new Date(v * 1000).toLocaleTimeString("en-GB") : "–";
  return fmtNumber(v);
}

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text != null) e.textContent = text;
  return e;
}

function newSection(spec, prefix, parent) {
  const sec = { spec, prefix, series: {}, times: [], charts: [], tiles: null, chartBox: null, tableBox: null };
  if (parent) {
    const box = el("section", { class: "source", id: "source-" + spec.id });
    const head = el("div", { class: "source-head" });
    head.append(el("h2", { class: "source-title" }, spec.title),
                el("span", { class: "badge", id: "health-" + spec.id }, "connecting"));
    sec.tiles = el("div", { class: "tiles" });
    sec.chartBox = el("div", { class: "charts" });
    sec.tableBox = el("div");
    box.append(head, sec.tiles, sec.chartBox, sec.tableBox);
    parent.append(box);
  } else {
    sec.tiles = document.getElementById("tiles");
    sec.chartBox = document.getElementById("charts");
    sec.tableBox = document.getElementById("tables");
  }
  return sec;
}

function buildSection(sec) {
  const spec = sec.spec, p = sec.prefix;
  for (const t of spec.tiles || []) {
    const box = el("div", { class: "tile" });
    box.append(el("div", { class: "label" }, t.label));
    box.append(el("div", { class: "value", id: "tile-" + p + t.key, "data-key": t.key }, "–"));
    box.append(el("div", { class: "rate", id: "rate-" + p + t.key }, ""));
    sec.tiles.append(box);
  }
  (spec.charts || []).forEach((c, i) => {
    const box = el("div", { class: "chart" });
    box.append(el("h2", {}, c.title));
    const canvas = el("canvas", { id: "chart-" + p + i });
    box.append(canvas);
    const legend = el("div", { class: "legend" });
    c.series.forEach((s, j) => {
      const span = el("span", { id: "legend-" + p + i + "-" + s.key });
      const sw = el("i");
      sw.style.background = COLORS[j % COLORS.length];
      span.append(sw, document.createTextNode(s.label + ": "), el("b", { "data-key": s.key }, "–"));
      legend.append(span);
      sec.series[s.key] = sec.series[s.key] || [];
    });
    box.append(legend);
    sec.chartBox.append(box);
    sec.charts.push({ spec: c, canvas });
  });
  (spec.tables || []).forEach((t, i) => {
    const box = el("div", { class: "table" });
    box.append(el("h2", { id: "table-title-" + p + i }, t.title));
    const table = el("table", { id: "table-" + p + i, "data-path": t.path });
    const head = el("tr");
    for (const col of t.columns) head.append(el("th", {}, col.label));
    const thead = el("thead");
    thead.append(head);
    table.append(thead, el("tbody"));
    box.append(table);
    sec.tableBox.append(box);
  });
}

function build(layout) {
  document.title = layout.title;
  document.getElementById("title").textContent = layout.title;
  if (layout.sections) {
    const main = document.querySelector("main");
    const holder = el("div", { id: "sections" });
    main.insertBefore(holder, document.getElementById("tiles"));
    for (const spec of layout.sections) state.sections.push(newSection(spec, spec.id + "/", holder));
  } else {
    state.sections.push(newSection(layout, "", null));
  }
  state.sections.forEach(buildSection);
}

function pushPoint(sec, t, rates) {
  sec.times.push(t);
  for (const key of Object.keys(sec.series)) sec.series[key].push(rates[key] ?? 0);
  if (sec.times.length > KEEP_POINTS) {
    sec.times.shift();
    for (const key of Object.keys(sec.series)) sec.series[key].shift();
  }
}

function drawChart(sec, chart) {
  const { spec, canvas } = chart;
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 400, h = canvas.clientHeight || 140;
  canvas.width = w * dpr;
  canvas.height = h * dpr;
  const g = canvas.getContext("2d");
  g.scale(dpr, dpr);
  g.clearRect(0, 0, w, h);
  const left = 64, right = 6, top = 6, bottom = 18;
  let max = 0;
  for (const s of spec.series) for (const v of sec.series[s.key] || []) max = Math.max(max, v);
  max = max > 0 ? max * 1.1 : 1;
  g.strokeStyle = "#e2e5ea";
  g.fillStyle = "#6b7380";
  g.font = "11px system-ui, DejaVu Sans, sans-serif";
  g.lineWidth = 1;
  for (let k = 0; k <= 2; k++) {
    const y = top + (h - top - bottom) * k / 2;
    g.beginPath(); g.moveTo(left, y); g.lineTo(w - right, y); g.stroke();
    const v = max * (1 - k / 2);
    g.fillText(spec.unit === "bytes" ? fmtBytes(v) : fmtNumber(max < 10 ? Math.round(v * 10) / 10 : Math.round(v)),
               4, y + 4);
  }
  const times = sec.times, n = times.length;
  if (n) {
    const span = Math.max(60, times[n - 1] - times[0]);
    g.fillText("last " + fmtSeconds(span), left, h - 4);
  }
  const x0 = n ? times[n - 1] - Math.max(60, times[n - 1] - times[0]) : 0;
  const xs = t => left + (w - left - right) * (t - x0) / Math.max(60, (times[n - 1] - x0) || 60);
  spec.series.forEach((s, j) => {
    const data = sec.series[s.key] || [];
    g.strokeStyle = COLORS[j % COLORS.length];
    g.lineWidth = 1.6;
    g.beginPath();
    data.forEach((v, i) => {
      const x = xs(times[i]), y = top + (h - top - bottom) * (1 - v / max);
      if (i === 0) g.moveTo(x, y); else g.lineTo(x, y);
    });
    g.stroke();
  });
}

function updateTiles(sec, varz) {
  const p = sec.prefix;
  for (const t of sec.spec.tiles || []) {
    const v = dig(varz, t.key);
    const node = document.getElementById("tile-" + p + t.key);
    node.textContent = fmt(v, t.unit);
    node.setAttribute("data-value", v == null ? "" : String(v));
    const rate = varz.rates ? varz.rates[t.key] : undefined;
    document.getElementById("rate-" + p + t.key).textContent =
      typeof rate === "number" ? (t.unit === "bytes" ? fmtBytes(rate) : fmtNumber(rate)) + " / s" : "";
  }
  sec.charts.forEach((c, i) => {
    for (const s of c.spec.series) {
      const node = document.getElementById("legend-" + p + i + "-" + s.key).querySelector("b");
      const v = varz.rates ? varz.rates[s.key] : undefined;
      node.textContent = (c.spec.unit === "bytes" ? fmtBytes(v) : fmtNumber(v)) + " / s";
      node.setAttribute("data-value", v == null ? "" : String(v));
    }
  });
}

function updateTable(sec, i, spec, body) {
  const table = document.getElementById("table-" + sec.prefix + i);
  const rows = dig(body, spec.rows) || [];
  const tbody = document.createElement("tbody");
  for (const row of rows) {
    const tr = el("tr", { "data-id": String(row[spec.id]) });
    for (const col of spec.columns) {
      const v = row[col.key];
      const td = el("td", { "data-key": col.key, "data-value": v == null ? "" : String(v) }, fmt(v, col.unit));
      if (typeof v === "string" || v == null) td.className = "text";
      if (v === true && col.key === "slow") td.className = "yes";
      tr.append(td);
    }
    tbody.append(tr);
  }
  if (!rows.length) {
    const tr = el("tr");
    tr.append(el("td", { colspan: String(spec.columns.length), class: "text muted" },
                 body.note || body.error || "none"));
    tbody.append(tr);
  }
  table.replaceChild(tbody, table.querySelector("tbody"));
  if (rows.length) {       // headings aligned as their column's cells
    const cells = tbody.rows[0].cells, heads = table.querySelectorAll("th");
    heads.forEach((th, k) => { th.className = cells[k] && cells[k].className === "text" ? "text" : ""; });
  }
  const total = body.total != null ? ` (${fmtNumber(body.total)})` : "";
  document.getElementById("table-title-" + sec.prefix + i).textContent = spec.title + total;
}

function setBadge(node, status, ok) {
  node.textContent = status || (ok ? "ok" : "unhealthy");
  node.className = "badge " + (ok ? "ok" : "bad");
}

async function pollSection(sec) {
  const spec = sec.spec;
  const main = await getJSON(spec.poll || "/varz");
  if (main.status === 200) {
    const varz = main.body;
    if (!sec.times.length || varz.snapshot_time > sec.times[sec.times.length - 1]) {
      pushPoint(sec, varz.snapshot_time, varz.rates || {});
    }
    updateTiles(sec, varz);
    sec.charts.forEach(c => drawChart(sec, c));
    document.getElementById("updated").textContent =
      "snapshot " + new Date(varz.snapshot_time * 1000).toLocaleTimeString("en-GB");
  }
  const tables = spec.tables || [];
  const answers = await Promise.all(tables.map(t => getJSON(t.path)));
  answers.forEach((a, i) => { if (a.status === 200 || a.body.error) updateTable(sec, i, tables[i], a.body); });
}

async function poll() {
  try {
    const health = await getJSON("/healthz");
    setBadge(document.getElementById("health"), health.body.status, health.status === 200);
    if (state.layout.sections) {
      for (const sec of state.sections) {
        const h = (health.body.sources || {})[sec.spec.id] || {};
        setBadge(document.getElementById("health-" + sec.spec.id), h.status, h.status === "ok");
      }
    }
    await Promise.all(state.sections.map(pollSection));
    document.getElementById("error").hidden = true;
    state.polls += 1;
    document.body.setAttribute("data-polls", String(state.polls));
  } catch (err) {
    const e = document.getElementById("error");
    e.textContent = "cannot reach the server: " + err;
    e.hidden = false;
    setBadge(document.getElementById("health"), "unreachable", false);
  }
  setTimeout(poll, POLL_MS);
}

async function loadHistory(sec) {
  if (!sec.spec.history) return;
  try {
    const h = (await getJSON(sec.spec.history)).body.history;
    if (h) h.t.forEach((t, i) => {
      const rates = {};
      for (const k of Object.keys(h.rates)) rates[k] = h.rates[k][i];
      pushPoint(sec, t, rates);
    });
  } catch (err) { /* charts start empty */ }
}

async function main() {
  const layout = (await getJSON("/layout.json")).body;
  state.layout = layout;
  build(layout);
  await Promise.all(state.sections.map(loadHistory));
  window.addEventListener("resize", () => state.sections.forEach(sec => sec.charts.forEach(c => drawChart(sec, c))));
  poll();
}

main();
