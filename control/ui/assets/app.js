// Tiergate's dashboard: asks for a token, then draws /v1/ui/dashboard and
// /v1/nodes every few seconds with uPlot. Values from the nodes are shown as
// text only (textContent), never as markup.
"use strict";
(function () {
  const KEY = "tiergate.token";
  const REFRESH_MS = 2000;
  const WINDOW_S = 900;
  const colors = ["#3366cc", "#dc3912", "#ff9900", "#109618", "#990099", "#0099c6", "#dd4477", "#66aa00", "#b82e2e", "#316395"];
  const charts = {}; // panel id -> {plot, names}
  let timer = null;
  let inFlight = false;

  const $ = (id) => document.getElementById(id);
  const setState = (s) => { document.body.dataset.state = s; };
  const fmt = (v, unit) => {
    if (v === null || v === undefined || Number.isNaN(v)) return "–";
    if (unit === "s") return v < 1 ? (v * 1000).toFixed(v < 0.01 ? 2 : 1) + "ms" : v.toFixed(2) + "s";
    const a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toFixed(1) + "G";
    if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (a >= 1e4) return (v / 1e3).toFixed(1) + "k";
    return a >= 100 ? v.toFixed(0) : v.toFixed(1);
  };

  function login(msg) {
    sessionStorage.removeItem(KEY);
    if (timer) { clearInterval(timer); timer = null; }
    for (const id of Object.keys(charts)) { charts[id].plot.destroy(); delete charts[id]; }
    $("charts").replaceChildren();
    for (const t of ["nodes", "certs"]) $(t).tBodies[0].replaceChildren();
    $("login-error").textContent = msg || "";
    setState("login");
  }

  async function get(path, token) {
    const r = await fetch(path, { headers: { Authorization: "Bearer " + token }, cache: "no-store" });
    if (r.status === 401) { const e = new Error("the token was refused"); e.unauthorized = true; throw e; }
    if (!r.ok) throw new Error(path + ": " + r.status + " " + (await r.text()).slice(0, 200));
    return r.json();
  }

  async function refresh() {
    const token = sessionStorage.getItem(KEY);
    if (!token) { login(); return; }
    if (inFlight) return;
    inFlight = true;
    try {
      const [d, nodes] = await Promise.all([get("/v1/ui/dashboard?window=" + WINDOW_S, token), get("/v1/nodes", token)]);
      setState("dashboard");
      draw(d, nodes);
      $("status").textContent = "figures from " + (d.source === "prometheus" ? "Prometheus" : "the nodes' metrics") +
        ", every " + d.interval_seconds + "s; updated " + new Date().toLocaleTimeString();
    } catch (e) {
      if (e.unauthorized) { login("That token is not valid."); return; }
      $("status").textContent = "update failed: " + e.message;
    } finally {
      inFlight = false;
    }
  }

  function last(values) {
    for (let i = values.length - 1; i >= 0; i--) if (values[i] !== null) return values[i];
    return null;
  }
  // lastSum adds the latest value of each series (null when none has one).
  function lastSum(series, pred) {
    let sum = null;
    for (const s of series) {
      if (pred && !pred(s)) continue;
      const v = last(s.values);
      if (v !== null) sum = (sum || 0) + v;
    }
    return sum;
  }

  function draw(d, nodes) {
    const panel = (id) => d.panels.find((p) => p.id === id) || { series: [] };
    const hs = panel("handshakes").series;
    const total = lastSum(hs);
    $("hs-rate").textContent = fmt(total);
    $("hs-rate").dataset.value = total === null ? "" : String(total);
    $("hs-full").textContent = fmt(lastSum(hs, (s) => s.labels && s.labels.resumed === "false"));
    $("hs-resumed").textContent = fmt(lastSum(hs, (s) => s.labels && s.labels.resumed === "true"));
    $("hs-tcp").textContent = fmt(lastSum(hs, (s) => s.labels && s.labels.transport === "tcp"));
    $("hs-quic").textContent = fmt(lastSum(hs, (s) => s.labels && s.labels.transport === "quic"));
    $("hs-failures").textContent = fmt(lastSum(panel("handshake_failures").series));
    drawNodes(nodes, d.targets);
    drawCerts(d.certificates);
    for (const p of d.panels) drawChart(p, d.times);
  }

  function cell(tr, text) { const td = document.createElement("td"); td.textContent = text; tr.appendChild(td); return td; }

  function drawNodes(nodes, targets) {
    const byNode = {};
    for (const t of targets) byNode[t.node] = t;
    const body = document.createElement("tbody");
    let lost = 0;
    for (const n of nodes.nodes) {
      const tr = document.createElement("tr");
      const t = byNode[n.node];
      tr.dataset.node = n.node;
      tr.dataset.state = n.state;
      if (n.state === "lost") { tr.className = "lost"; lost++; } else if (t && !t.up) tr.className = "down";
      cell(tr, n.node); cell(tr, n.role); cell(tr, n.address || "");
      cell(tr, String(n.applied_revision)); cell(tr, String(n.lag)); cell(tr, n.state);
      cell(tr, !t ? "not scraped" : t.up ? "up" : (t.error || "down"));
      cell(tr, n.state === "lost" ? "" : n.uptime_seconds + " s");
      body.appendChild(tr);
    }
    $("nodes-lost").textContent = String(lost);
    $("nodes").replaceChild(body, $("nodes").tBodies[0]);
  }

  function drawCerts(certs) {
    const body = document.createElement("tbody");
    for (const c of certs) {
      const tr = document.createElement("tr");
      if (c.days_left < 14) tr.className = "soon";
      cell(tr, c.days_left.toFixed(1)); cell(tr, c.name); cell(tr, c.subject); cell(tr, c.node);
      cell(tr, new Date(c.expires).toISOString().slice(0, 10));
      body.appendChild(tr);
    }
    $("certs").replaceChild(body, $("certs").tBodies[0]);
  }

  function drawChart(p, times) {
    const names = p.series.map((s) => s.name).join("\n");
    let c = charts[p.id];
    const title = p.title + (p.omitted ? " (" + p.omitted + " more, lower, not shown)" : "");
    const data = [times].concat(p.series.map((s) => s.values));
    if (c && c.names === names) {
      c.title.textContent = title;
      c.plot.setData(data);
      return;
    }
    let box = document.getElementById("chart-" + p.id);
    if (!box) {
      box = document.createElement("div");
      box.className = "chart";
      box.id = "chart-" + p.id;
      box.appendChild(document.createElement("h3"));
      $("charts").appendChild(box);
    }
    if (c) c.plot.destroy();
    const h = box.querySelector("h3");
    h.textContent = title;
    const opts = {
      width: Math.max(440, box.clientWidth - 16), height: 220,
      series: [{}].concat(p.series.map((s, i) => ({
        label: s.name, stroke: colors[i % colors.length], width: 1.5, spanGaps: false,
        value: (u, v) => fmt(v, p.unit),
      }))),
      axes: [{}, { size: 70, values: (u, vals) => vals.map((v) => fmt(v, p.unit)) }],
      scales: { x: { time: true } },
    };
    const el = document.createElement("div");
    const old = box.querySelector(".uplot");
    if (old) old.remove();
    box.appendChild(el);
    charts[p.id] = { plot: new uPlot(opts, data, el), names: names, title: h };
  }

  function start() {
    refresh();
    if (!timer) timer = setInterval(refresh, REFRESH_MS);
  }

  $("login-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const t = $("token").value.trim();
    if (!t) return;
    sessionStorage.setItem(KEY, t);
    $("token").value = "";
    $("login-error").textContent = "";
    start();
  });
  $("logout").addEventListener("click", () => login());
  if (sessionStorage.getItem(KEY)) start(); else login();
})();
