// llmgw dashboard, Models page: live traffic of the last 15 minutes (GET /api/v1/traffic), per
// model with its replicas under it, without Prometheus. Each control daemon (and each worker)
// counts only what it answered itself, and the panel says which daemon it is. Plain DOM and
// inline SVG, textContent only: model names and replica ids are not trusted.
(() => {
  "use strict";
  const body = document.body;
  if (body.dataset.page !== "models") return;
  const API = body.dataset.apiBase;
  const REFRESH_MS = Number(body.dataset.refreshMs) || 3000;
  const $ = (sel) => document.querySelector(sel);
  const { h, s } = window.llmgwDom;

  function rate(v) { return v >= 100 ? v.toFixed(0) : v >= 1 ? v.toFixed(1) : v > 0 ? v.toFixed(2) : "0"; }
  function ms(v) { return v === null || v === undefined ? "—" : v >= 1 ? `${v.toFixed(2)} s` : `${Math.round(v * 1000)} ms`; }
  function hhmm(t) { return new Date(t * 1000).toISOString().slice(11, 16); }

  // Requests per bucket over the window, one bar each (oldest left); errors drawn over them in red.
  function spark(series, answer) {
    const W = 180, H = 28, n = series.requests.length || 1, bw = W / n;
    const max = Math.max(0, ...series.requests);
    const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "spark", role: "img",
      "aria-label": `requests per ${answer.bucket_seconds} s, last ${answer.window_seconds / 60} min` });
    svg.append(s("line", { x1: 0, x2: W, y1: H - 0.5, y2: H - 0.5, class: "base" }));
    series.requests.forEach((count, i) => {
      if (!count || !max) return;
      const x = (i * bw).toFixed(1), width = Math.max(1, bw - 0.5).toFixed(1);
      const bh = Math.max(1, (count / max) * (H - 2));
      const bar = s("rect", { x, y: (H - bh).toFixed(1), width, height: bh.toFixed(1), class: "req" });
      const at = answer.start + i * answer.bucket_seconds;
      bar.append(s("title", {}, `${hhmm(at)} UTC: ${count} requests, ${series.errors[i]} errors, ` +
        `${series.completion_tokens[i]} tokens, TTFT p50 ${ms(series.ttft_p50[i])}, queue ${series.queue_depth[i]}`));
      svg.append(bar);
      if (series.errors[i]) {
        const eh = Math.max(1, (series.errors[i] / max) * (H - 2));
        svg.append(s("rect", { x, y: (H - eh).toFixed(1), width, height: eh.toFixed(1), class: "err" }));
      }
    });
    return svg;
  }

  function row(series, answer, kind) {
    const r = series.recent;
    const name = kind === "replica"
      ? h("td", { class: "name replica" }, "↳ replica ", h("span", { class: "mono" }, series.name))
      : h("td", { class: "name" }, series.name);
    return h("tr", { class: "live-" + kind, "data-live": kind, "data-name": series.name },
      name, h("td", {}, spark(series, answer)),
      h("td", { class: "num req" }, rate(r.requests_per_s)),
      h("td", { class: "num errors" + (r.errors ? " bad" : "") }, r.errors),
      h("td", { class: "num ttft50" }, ms(r.ttft_p50)), h("td", { class: "num ttft95" }, ms(r.ttft_p95)),
      h("td", { class: "num tokens" }, rate(r.tokens_per_s)),
      h("td", { class: "num queue" }, kind === "model" ? r.queue_depth : "—"));
  }

  async function refresh() {
    const response = await fetch(API + "/traffic", { headers: { Accept: "application/json" }, credentials: "same-origin" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const answer = await response.json();
    $("#live-daemon").textContent = answer.daemon;
    $("#live-note").textContent = `Counted by this daemon (${answer.daemon}) since ${hhmm(answer.started)} UTC, ` +
      `in ${answer.bucket_seconds} s buckets; figures are the last minute. Each control daemon, and each worker, ` +
      "counts only the requests it answered itself: another daemon's dashboard shows its own share.";
    const byModel = new Map();
    for (const r of answer.replicas) {
      if (!byModel.has(r.model)) byModel.set(r.model, []);
      byModel.get(r.model).push(r);
    }
    const rows = [];
    for (const m of answer.models) {
      rows.push(row(m, answer, "model"));
      for (const r of byModel.get(m.name) || []) rows.push(row(r, answer, "replica"));
    }
    const tbody = $("#live-traffic").tBodies[0];
    tbody.replaceChildren(...(rows.length ? rows
      : [h("tr", {}, h("td", { colSpan: 8, class: "empty" }, "No requests answered by this daemon in the last 15 minutes."))]));
    body.dataset.liveLoaded = "true";
  }

  async function loop() {
    if (!document.hidden) {
      try { await refresh(); } catch (e) { $("#live-note").textContent = "live traffic: " + e.message; }
    }
    setTimeout(loop, REFRESH_MS);
  }
  loop();
})();
