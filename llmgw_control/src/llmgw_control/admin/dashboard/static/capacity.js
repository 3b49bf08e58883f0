// llmgw dashboard, "Capacity": capacity runs (GET /api/v1/capacity/runs), each drawn as charts of
// throughput and latency against concurrency, and two runs side by side (a baseline A and a
// candidate B: the same model on another engine version or node) with a regression flag where B
// is worse than A beyond a threshold. Plain DOM and inline SVG, textContent only: node facts and
// names come from machines we do not control.
(() => {
  "use strict";
  const body = document.body;
  if (body.dataset.page !== "capacity") return;
  const API = body.dataset.apiBase;
  const REFRESH_MS = Number(body.dataset.refreshMs) || 3000;
  const $ = (sel) => document.querySelector(sel);
  const COLORS = ["#2456c7", "#d9480f", "#1b7f3b", "#7048e8"];
  let runs = [];
  let optionsKey = "";

  const { h, s } = window.llmgwDom;
  function fmt(v) {
    if (!(v > 0)) return "0";
    if (v >= 1000) return (v / 1000).toFixed(1) + "k";
    if (v >= 10) return v.toFixed(0);
    if (v >= 1) return v.toFixed(1);
    return v.toPrecision(2);
  }
  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }
  const key = (r) => `${r.model}:${r.profile}`;
  const label = (r) => `${key(r)} on ${r.node_id || r.node || "?"} (${(r.comparable.engine || "")} ${(r.comparable.engine_version || "")}) · ${r.id}`;

  // One chart: series of [concurrency, value] on a log2 concurrency axis.
  function xyChart(title, unit, series, scale) {
    const W = 420, H = 190, L = 44, R = 10, T = 8, B = 30;
    const xs = [...new Set(series.flatMap((x) => x.points.map((p) => p[0])))].sort((a, b) => a - b);
    // One scale for the runs drawn side by side, so their heights compare at a glance.
    let max = scale || 0;
    for (const x of series) for (const [, v] of x.points) if (v > max) max = v;
    max = niceMax(max);
    const lo = Math.log2(xs[0] || 1), hi = Math.log2(xs[xs.length - 1] || 1);
    const X = (c) => hi > lo ? L + ((Math.log2(c) - lo) / (hi - lo)) * (W - L - R) : (L + W - R) / 2;
    const Y = (v) => T + (1 - v / max) * (H - T - B);
    const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title });
    const grid = s("g", { class: "grid" });
    for (let i = 0; i <= 4; i++) {
      const v = (max * i) / 4;
      grid.append(s("line", { x1: L, x2: W - R, y1: Y(v), y2: Y(v) }));
      grid.append(s("text", { x: L - 4, y: Y(v) + 3, "text-anchor": "end" }, fmt(v)));
    }
    for (const c of xs) grid.append(s("text", { x: X(c), y: H - 16, "text-anchor": "middle" }, String(c)));
    grid.append(s("text", { x: (L + W - R) / 2, y: H - 3, "text-anchor": "middle" }, "concurrency"));
    svg.append(grid);
    series.forEach((x, i) => {
      const color = COLORS[i % COLORS.length];
      const d = x.points.map(([c, v], j) => `${j ? "L" : "M"}${X(c).toFixed(1)},${Y(v).toFixed(1)}`).join("");
      svg.append(s("path", { d, fill: "none", stroke: color, "stroke-width": 1.6, "data-series": x.label }));
      for (const [c, v] of x.points) svg.append(s("circle", { cx: X(c).toFixed(1), cy: Y(v).toFixed(1), r: 2.5, fill: color }));
    });
    const legend = h("div", { class: "legend" }, series.map((x, i) =>
      h("span", {}, h("i", { style: `background:${COLORS[i % COLORS.length]}` }), x.label)));
    return h("div", { class: "xy", "data-chart": title }, h("div", { class: "subtitle" }, title, " ", h("span", { class: "unit" }, `(${unit})`)), svg, legend);
  }

  const THROUGHPUT = ["generation_tokens_per_s", "prompt_tokens_per_s"];
  const LATENCY = ["ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s"];
  function highest(shown, fields) {
    return Math.max(0, ...shown.flatMap((r) => r.results.flatMap((lv) => fields.map((f) => Number(lv[f]) || 0))));
  }

  function runFigure(run, role, shown) {
    const pts = (field) => run.results.map((lv) => [lv.concurrency, Number(lv[field]) || 0]);
    const facts = run.comparable || {};
    const node = facts.node || {};
    const gpus = (node.gpus || []).map((g) => g.name).join(", ") || "no GPU";
    return h("figure", { class: "chart run-chart", "data-run": run.id, "data-role": role },
      h("figcaption", {}, `${role} · ${label(run)}`),
      h("p", { class: "facts" }, `${node.cpu_model || "?"} · ${node.cores || "?"} cores · ${gpus}`,
        node.nvidia_driver ? ` · driver ${node.nvidia_driver}` : "",
        ` · weights ${(facts.weights_sha256 || facts.model_dir || "?").slice(0, 12)}`,
        run.slots !== null && run.slots !== undefined ? ` · slots ${run.slots}` : ""),
      run.results.length ? h("div", { class: "pair" },
        xyChart("Throughput", "tokens/s", [{ label: "generation", points: pts("generation_tokens_per_s") },
                                           { label: "prompt", points: pts("prompt_tokens_per_s") }],
                highest(shown, THROUGHPUT)),
        xyChart("Latency", "s", [{ label: "TTFT p50", points: pts("ttft_p50_s") }, { label: "TTFT p99", points: pts("ttft_p99_s") },
                                 { label: "ITL p50", points: pts("itl_p50_s") }, { label: "ITL p99", points: pts("itl_p99_s") }],
                highest(shown, LATENCY)))
        : h("p", { class: "empty" }, `No level measured yet (${run.state}).`));
  }

  // Where B is worse than A beyond the threshold, per concurrency level both measured.
  function compare(a, b, threshold) {
    const byC = Object.fromEntries(a.results.map((lv) => [lv.concurrency, lv]));
    const rows = [];
    for (const lb of b.results) {
      const la = byC[lb.concurrency];
      if (!la) continue;
      const change = (x, y) => (x > 0 ? ((y - x) / x) * 100 : 0);
      const gen = change(la.generation_tokens_per_s, lb.generation_tokens_per_s);
      const ttft = change(la.ttft_p99_s, lb.ttft_p99_s);
      const itl = change(la.itl_p99_s, lb.itl_p99_s);
      const worse = [];
      if (-gen > threshold) worse.push(`generation ${gen.toFixed(0)}%`);
      if (ttft > threshold) worse.push(`TTFT p99 +${ttft.toFixed(0)}%`);
      if (itl > threshold) worse.push(`ITL p99 +${itl.toFixed(0)}%`);
      rows.push({ c: lb.concurrency, la, lb, gen, ttft, itl, worse });
    }
    return rows;
  }

  function pct(v) { return `${v > 0 ? "+" : ""}${v.toFixed(1)}%`; }

  function renderComparison(a, b) {
    const out = $("#comparison");
    if (!a || !b) { out.replaceChildren(h("p", { class: "empty" }, "Choose two finished runs to compare them.")); return; }
    if (key(a) !== key(b)) {
      out.replaceChildren(h("p", { class: "warning", id: "regression-verdict" },
        `A is ${key(a)}, B is ${key(b)}: runs of different profiles are not comparable.`));
      return;
    }
    const threshold = Math.max(0, Number($("#regression-threshold").value) || 0);
    const rows = compare(a, b, threshold);
    const bad = rows.filter((r) => r.worse.length);
    const verdict = !rows.length
      ? h("p", { class: "warning", id: "regression-verdict" }, "The two runs share no concurrency level.")
      : bad.length
        ? h("p", { class: "regression-flag", id: "regression-verdict", "data-regression": "true" },
            h("span", { class: "badge bad" }, "regression"),
            ` B is worse than A beyond ${threshold}% at ` + bad.map((r) => `c=${r.c} (${r.worse.join(", ")})`).join("; "))
        : h("p", { id: "regression-verdict", "data-regression": "false" }, h("span", { class: "badge ok" }, "no regression"),
            ` B is within ${threshold}% of A at every shared level.`);
    const table = h("table", { class: "grid", id: "comparison-table" },
      h("thead", {}, h("tr", {}, ["Concurrency", "Gen tok/s A", "Gen tok/s B", "Change", "TTFT p99 A", "TTFT p99 B", "Change",
        "ITL p99 A", "ITL p99 B", "Change"].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows.map((r) => h("tr", { class: r.worse.length ? "regression" : "", "data-concurrency": r.c },
        h("td", { class: "num" }, r.c),
        h("td", { class: "num" }, r.la.generation_tokens_per_s.toFixed(1)), h("td", { class: "num" }, r.lb.generation_tokens_per_s.toFixed(1)),
        h("td", { class: "num" }, pct(r.gen)),
        h("td", { class: "num" }, r.la.ttft_p99_s.toFixed(3)), h("td", { class: "num" }, r.lb.ttft_p99_s.toFixed(3)),
        h("td", { class: "num" }, pct(r.ttft)),
        h("td", { class: "num" }, r.la.itl_p99_s.toFixed(3)), h("td", { class: "num" }, r.lb.itl_p99_s.toFixed(3)),
        h("td", { class: "num" }, pct(r.itl))))));
    out.replaceChildren(verdict, table);
  }

  function fillSelects() {
    const done = runs.filter((r) => r.state === "done");
    const k = done.map((r) => r.id).join(",");
    if (k === optionsKey) return;
    optionsKey = k;
    const selA = $("#run-a"), selB = $("#run-b");
    const [chosenA, chosenB] = [selA.value, selB.value];
    for (const sel of [selA, selB]) {
      sel.replaceChildren(h("option", { value: "" }, "—"), ...done.map((r) => h("option", { value: r.id }, label(r))));
    }
    // Defaults: B the newest finished run, A the one before it of the same profile.
    const newest = done[0];
    const before = newest ? done.find((r) => r !== newest && key(r) === key(newest)) : undefined;
    selB.value = done.some((r) => r.id === chosenB) ? chosenB : (newest ? newest.id : "");
    selA.value = done.some((r) => r.id === chosenA) ? chosenA : (before ? before.id : "");
  }

  function render() {
    const rows = runs.map((r) => {
      const best = r.results.reduce((m, lv) => Math.max(m, lv.generation_tokens_per_s), 0);
      const kind = r.state === "done" ? "ok" : r.state === "failed" || r.state === "cancelled" ? "bad" : "warn";
      return h("tr", { "data-run": r.id },
        h("td", { class: "mono" }, r.id), h("td", {}, key(r)),
        h("td", {}, h("span", { class: "badge " + kind }, r.state), r.error ? h("div", { class: "error" }, r.error) : ""),
        h("td", {}, r.node_id || r.node || "—"),
        h("td", {}, `${r.comparable.engine || ""} ${r.comparable.engine_version || ""}`.trim() || "—"),
        h("td", { class: "num" }, `${r.levels_done}/${r.levels.length}`),
        h("td", { class: "num" }, r.results.length ? best.toFixed(1) : "—"),
        h("td", { class: "num" }, r.slots === null || r.slots === undefined ? "—" : r.slots),
        h("td", {}, new Date(r.created_at * 1000).toISOString().replace("T", " ").slice(0, 16) + " UTC"));
    });
    const tbody = $("#capacity-runs").tBodies[0];
    tbody.replaceChildren(...(rows.length ? rows : [h("tr", {}, h("td", { colSpan: 9, class: "empty" },
      "No capacity runs yet: llmgw-control ctl bench MODEL[:PROFILE]"))]));
    fillSelects();
    const a = runs.find((r) => r.id === $("#run-a").value);
    const b = runs.find((r) => r.id === $("#run-b").value);
    const running = runs.find((r) => r.state === "running");
    const figures = [];
    const shown = [a, b].filter(Boolean);
    if (a) figures.push(runFigure(a, "A", shown));
    if (b) figures.push(runFigure(b, "B", shown));
    if (running && running !== a && running !== b) figures.push(runFigure(running, "running", [running]));
    $("#run-charts").replaceChildren(...(figures.length ? figures : [h("p", { class: "empty" }, "No finished run to draw yet.")]));
    renderComparison(a, b);
  }

  async function refresh() {
    try {
      const response = await fetch(API + "/capacity/runs", { headers: { Accept: "application/json" }, credentials: "same-origin" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      runs = (await response.json()).runs || [];
      render();
      body.dataset.capacityLoaded = "true";
    } catch (e) {
      $("#run-charts").replaceChildren(h("p", { class: "error" }, "capacity runs: " + e.message));
    }
  }

  for (const id of ["#run-a", "#run-b", "#regression-threshold"]) $(id).addEventListener("change", render);
  $("#regression-threshold").addEventListener("input", render);
  async function loop() {
    if (!document.hidden) await refresh();
    setTimeout(loop, REFRESH_MS);
  }
  loop();
})();
