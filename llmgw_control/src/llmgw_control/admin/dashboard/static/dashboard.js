// llmgw dashboard: fills the server-rendered pages from the admin REST API and keeps them fresh.
// Plain DOM (textContent only, never innerHTML with data: node facts and names come from
// machines and people we do not control), no libraries, works without internet.
(() => {
  "use strict";
  const body = document.body;
  const API = body.dataset.apiBase;
  const BASE = body.dataset.base;
  const PAGE = body.dataset.page;
  const REFRESH_MS = Number(body.dataset.refreshMs) || 3000;
  const CSRF = (document.querySelector('meta[name="csrf-token"]') || {}).content || "";
  const $ = (sel) => document.querySelector(sel);

  const { h, s } = window.llmgwDom;

  class ApiFailure extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  async function request(url, method = "GET", payload = undefined) {
    const headers = { Accept: "application/json" };
    // The session's CSRF token goes with every request; the server checks it on those that change state.
    if (CSRF) headers["X-CSRF-Token"] = CSRF;
    if (payload !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(url, {
      method, headers, credentials: "same-origin",
      body: payload === undefined ? undefined : JSON.stringify(payload),
    });
    let data = null;
    try { data = await response.json(); } catch (_) { /* an empty or non-JSON body */ }
    if (response.status === 401 && CSRF) { location.href = BASE + "login"; }
    if (!response.ok) {
      const err = data && data.error;
      const msg = err ? err.message + (err.field ? ` (${err.field})` : "") : `HTTP ${response.status}`;
      throw new ApiFailure(response.status, msg);
    }
    return data;
  }
  const api = (path, method, payload) => request(API + path, method, payload);

  function flash(message, isError = false) {
    const el = $("#flash");
    el.textContent = message;
    el.className = isError ? "flash error" : "flash";
    el.hidden = false;
  }

  function badge(text, kind) { return h("span", { class: "badge " + (kind || "") }, text); }
  function stateKind(state) {
    const s = String(state || "");
    if (/^(ready|installed|configured)/.test(s)) return "ok";
    if (/^(failed|lost|unreachable|disconnected|stopped)/.test(s)) return "bad";
    return "warn";
  }
  function mib(v) { return v >= 1024 ? `${(v / 1024).toFixed(1)} GiB` : `${v} MiB`; }
  function fileSize(bytes) { return bytes >= 1 << 20 ? mib(Math.ceil(bytes / (1 << 20))) : `${Math.ceil(bytes / 1024)} KiB`; }
  function num(v) { return (Number(v) || 0).toLocaleString("en-US"); }
  function when(v) {
    if (!v) return "—";
    const d = typeof v === "number" ? new Date(v * 1000) : new Date(v);
    return isNaN(d) ? String(v) : d.toISOString().replace("T", " ").slice(0, 16) + " UTC";
  }
  function replaceRows(table, rows, cols, emptyText) {
    const tbody = table.tBodies[0];
    tbody.replaceChildren(...(rows.length ? rows : [h("tr", {}, h("td", { colSpan: cols, class: "empty" }, emptyText))]));
  }
  function firstArray(data, name) {
    if (Array.isArray(data)) return data;
    if (data && Array.isArray(data[name])) return data[name];
    for (const v of Object.values(data || {})) if (Array.isArray(v)) return v;
    return [];
  }

  // ---------------------------------------------------------------- pages

  const pages = {};

  // Where a node's engine install came from (its install manifest): index, signer, digests, when,
  // the control epoch that asked. The same words as `ctl engines` and `llmgw-node engines list`.
  const provenanceWords = (p) => {
    const when = p.installed_at > 0
      ? new Date(p.installed_at * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z") : "at an unknown time";
    const assets = (p.assets || []).map((a) => `${a.name} sha256:${a.sha256.slice(0, 16)}…`).join(", ")
      || "no archives recorded";
    const signed = p.signed_by ? `signed by ${p.signed_by}` : "unsigned index";
    const asked = p.control_epoch ? `control epoch ${p.control_epoch}` : "by hand";
    return `from ${p.source || "?"} (${signed}): ${assets}; installed ${when}, ${asked}${p.archives_kept ? "; archives kept" : ""}`;
  };

  // On a standby the fleet pages show the leader's fleet as the store holds it (role "standby");
  // say so, and where the leader is, since drain and cordon must be done there.
  function standbyWords(answer) {
    if (!answer || answer.role !== "standby") return "";
    return `This daemon is a standby: showing the leader's fleet from the store (leader: ${answer.leader || "unknown"}). ` +
      "Drain, cordon and capacity runs are done on the leader.";
  }

  pages.fleet = async () => {
    const answer = await api("/nodes");
    const nodes = firstArray(answer, "nodes");
    const counts = {};
    for (const n of nodes) counts[n.state] = (counts[n.state] || 0) + 1;
    $("#fleet-summary").textContent = [standbyWords(answer), nodes.length
      ? `${nodes.length} node(s): ` + Object.entries(counts).map(([s, c]) => `${c} ${s}`).join(", ")
      : ""].filter(Boolean).join(" ");
    const cards = nodes.map((n) => {
      const f = n.facts || {};
      const gpus = (f.gpus || []).map((g) => `${g.name} (${mib(g.memory_total_mib)})`);
      return h("section", { class: "card node", "data-node": n.id },
        h("div", { class: "head" },
          h("h2", {}, n.id), badge(n.state, stateKind(n.state)),
          n.cordoned ? badge("cordoned", "warn") : null,
          f.degraded ? badge("degraded: CPU only", "bad") : null,
          h("span", { class: "actions" },
            n.cordoned
              ? h("button", { type: "button", "data-action": "uncordon", "data-node": n.id }, "Uncordon")
              : h("button", { type: "button", "data-action": "cordon", "data-node": n.id }, "Cordon"),
            h("button", { type: "button", class: "danger", "data-action": "drain", "data-node": n.id }, "Drain"))),
        f.degraded ? h("div", { class: "warning degraded" },
          `⚠ Degraded: ${f.degraded}. GPU profiles are not placed here unless they say cpu_ok.`) : null,
        (n.warnings || []).map((w) => h("div", { class: "warning" }, "⚠ " + w)),
        h("dl", {},
          h("dt", {}, "OS"), h("dd", { class: "os" }, f.os || "—"),
          h("dt", {}, "CPU"), h("dd", { class: "cpu" }, `${f.cpu || "—"} · ${f.cores || 0} cores · ${f.arch || ""}`),
          h("dt", {}, "CPU features"), h("dd", { class: "mono" }, (f.cpu_features || []).join(" ") || "—"),
          h("dt", {}, "RAM"), h("dd", {}, f.ram_total_mib ? mib(f.ram_total_mib) : "—"),
          h("dt", {}, "GPUs"), h("dd", { class: "gpus" }, gpus.length
            ? gpus.join(", ") + (f.gpu_backend ? ` · ${f.gpu_backend}` : "") : "none"),
          f.nvidia_driver ? [h("dt", {}, "NVIDIA driver"), h("dd", {}, f.nvidia_driver)] : null,
          h("dt", {}, "Address"), h("dd", { class: "mono" }, n.address || "—"),
          Object.keys(n.labels || {}).length
            ? [h("dt", {}, "Labels"), h("dd", {}, Object.entries(n.labels).map(([k, v]) => `${k}=${v}`).join(", "))]
            : null,
          h("dt", {}, "Engines"),
          h("dd", { class: "engines" }, (n.engines || []).length
            ? h("ul", {}, n.engines.map((e) => h("li", {}, `${e.name} ${e.version}: `, badge(e.state, stateKind(e.state)),
                e.provenance ? h("div", { class: "provenance mono" }, provenanceWords(e.provenance)) : null)))
            : "none"),
          h("dt", {}, "Replicas"),
          h("dd", { class: "shards" }, (n.shards || []).length
            ? h("ul", {}, n.shards.map((s) => h("li", {}, h("span", { class: "mono" }, s.id), ` :${s.port} `,
                badge(s.state, stateKind(s.state)))))
            : "none")));
    });
    $("#nodes").replaceChildren(...(cards.length ? cards
      : [h("p", { class: "empty" }, "No node has joined yet. Add one with POST /api/v1/nodes (llmgw-control ctl nodes add).")]));
  };

  pages.models = async () => {
    const answer = await api("/models");
    const models = firstArray(answer, "models");
    $("#models-standby").textContent = standbyWords(answer);
    const rows = models.map((m) => h("tr", { "data-model": m.key || m.model },
      h("td", {}, m.model), h("td", {}, m.profile),
      h("td", { class: "status" }, badge(m.ready ? "ready" : "not running", m.ready ? "ok" : "warn"), " ",
        m.ready ? "" : (m.status || "")),
      h("td", { class: "num" }, m.ready), h("td", { class: "num" }, m.waiting_requests || 0),
      h("td", { class: "replicas" }, (m.replicas || []).length
        ? h("ul", {}, m.replicas.map((r) => h("li", {}, h("span", { class: "mono" }, r.id), ` on ${r.node}:${r.port} `,
            badge(r.state, stateKind(r.state)), " ",
            h("button", { type: "button", class: "small", "data-action": "replica-logs", "data-replica": r.id },
              "Logs"))))
        : "none"),
      // LoRA adapters, each its own model name: size, default scale, the replicas that hold it.
      h("td", { class: "adapters" }, (m.adapters || []).length
        ? h("ul", {}, m.adapters.map((a) => h("li", { "data-adapter": a.name }, h("span", { class: "mono" }, a.name),
            ` ${fileSize(a.size)} · scale ${a.scale} · `,
            (a.loaded_on || []).length ? `loaded on ${a.loaded_on.join(", ")}` : badge("not loaded", "warn"))))
        : "none")));
    replaceRows($("#models"), rows, 7, "No models configured.");
    await replicaLogs.refresh();
  };

  // The replica view's engine output: the last lines, then (each refresh) what came after the
  // cursor. At most KEEP lines stay on the page.
  const replicaLogs = {
    KEEP: 1000, replica: "", cursor: "",
    async show(replica) {
      this.replica = replica;
      this.cursor = "";
      $("#replica-logs").hidden = false;
      $("#logs-replica").textContent = replica;
      $("#logs-lines").textContent = "";
      $("#logs-note").textContent = "Loading…";
      await this.refresh();
    },
    async refresh() {
      if (!this.replica || !$("#replica-logs")) return;
      const query = this.cursor ? `cursor=${encodeURIComponent(this.cursor)}` : "lines=200";
      let answer;
      try {
        answer = await api(`/replicas/${encodeURIComponent(this.replica)}/logs?${query}`);
      } catch (err) {
        $("#logs-note").textContent = err.message;
        return;
      }
      const pre = $("#logs-lines");
      if (!this.cursor || answer.source !== "node") pre.textContent = "";
      const text = answer.lines.join("\n");
      if (text) pre.textContent = (pre.textContent ? pre.textContent + "\n" : "") + text;
      const kept = pre.textContent.split("\n");
      if (kept.length > this.KEEP) pre.textContent = kept.slice(-this.KEEP).join("\n");
      this.cursor = answer.cursor;
      $("#logs-note").textContent = answer.source === "node"
        ? `Replica ${answer.status} on node ${answer.node}; new lines appear as the engine writes them.`
        : `The lines node ${answer.node} sent with the failure (${answer.status}: ${answer.detail}).`;
    },
  };

  async function groupsList() { return firstArray(await api("/groups"), "groups"); }

  pages.usage = async () => {
    const since = new Date(Date.now() - Number($("#usage-since").value) * 1000).toISOString();
    const [groups, usage] = await Promise.all([groupsList(),
      api("/usage?since=" + encodeURIComponent(since))]);
    const rows = firstArray(usage, "usage");
    const parent = $("#group-parent");
    const chosen = parent.value;
    parent.replaceChildren(h("option", { value: "" }, "(none: a root)"),
      ...groups.map((g) => h("option", { value: g.id }, g.path || g.name)));
    parent.value = chosen;
    if (parent.value !== chosen) parent.value = "";
    const own = {};
    for (const r of rows) {
      const g = r.group_id || "";
      const o = own[g] || (own[g] = { requests: 0, prompt: 0, completion: 0 });
      o.requests += Number(r.requests) || 0;
      o.prompt += Number(r.prompt_tokens) || 0;
      o.completion += Number(r.completion_tokens) || 0;
    }
    const children = {};
    const ids = new Set(groups.map((g) => g.id));
    for (const g of groups) {
      const parent = g.parent_id && ids.has(g.parent_id) ? g.parent_id : "";
      (children[parent] || (children[parent] = [])).push(g);
    }
    const out = [];
    // Roll-up: a group's total is its own usage plus every group below it.
    function visit(g, depth) {
      const mine = own[g.id] || { requests: 0, prompt: 0, completion: 0 };
      const total = { ...mine };
      const rowIndex = out.length;
      out.push(null);
      for (const c of (children[g.id] || []).sort((a, b) => a.name.localeCompare(b.name))) {
        const t = visit(c, depth + 1);
        total.requests += t.requests; total.prompt += t.prompt; total.completion += t.completion;
      }
      out[rowIndex] = h("tr", { "data-group": g.id },
        h("td", { class: "name", style: `padding-left:${0.6 + depth * 1.4}rem` }, depth ? "└ " : "", g.name),
        h("td", { class: "num total-requests" }, num(total.requests)), h("td", { class: "num" }, num(total.prompt)),
        h("td", { class: "num" }, num(total.completion)), h("td", { class: "num" }, num(mine.requests)),
        h("td", { class: "num" }, num(mine.prompt + mine.completion)));
      return total;
    }
    for (const g of (children[""] || []).sort((a, b) => a.name.localeCompare(b.name))) visit(g, 0);
    if (own[""]) {
      const o = own[""];
      out.push(h("tr", { "data-group": "" }, h("td", { class: "name" }, "(no key: open gateway)"),
        h("td", { class: "num" }, num(o.requests)), h("td", { class: "num" }, num(o.prompt)),
        h("td", { class: "num" }, num(o.completion)), h("td", { class: "num" }, num(o.requests)),
        h("td", { class: "num" }, num(o.prompt + o.completion))));
    }
    replaceRows($("#usage"), out, 6, "No groups yet.");
  };

  pages.capacity = async () => {
    const records = firstArray(await api("/capacity"), "capacity");
    const rows = records.map((c) => h("tr", {},
      h("td", {}, c.model), h("td", {}, c.profile), h("td", {}, c.node_id), h("td", {}, c.engine),
      h("td", { class: "num" }, c.concurrency), h("td", { class: "num" }, (Number(c.tokens_per_s) || 0).toFixed(1)),
      h("td", { class: "num" }, `${(Number(c.ttft_p50_s) || 0).toFixed(3)} s`),
      h("td", { class: "num" }, `${(Number(c.ttft_p99_s) || 0).toFixed(3)} s`), h("td", {}, when(c.measured_at))));
    replaceRows($("#capacity"), rows, 9, "No benchmark results recorded yet.");
  };

  pages.keys = async () => {
    const [groups, keys] = await Promise.all([groupsList(), api("/keys")]);
    const names = Object.fromEntries(groups.map((g) => [g.id, g.path || g.name]));
    const select = $("#key-group");
    const chosen = select.value;
    select.replaceChildren(...groups.map((g) => h("option", { value: g.id }, g.path || g.name)));
    if (chosen && names[chosen]) select.value = chosen;
    const now = Date.now();
    const rows = firstArray(keys, "keys").map((k) => {
      const expired = k.expires_at && new Date(k.expires_at).getTime() <= now;
      const state = k.state || (k.revoked_at ? "revoked" : expired ? "expired" : "active");
      return h("tr", { "data-key": k.id },
        h("td", {}, k.name), h("td", {}, names[k.group_id] || k.group_id),
        h("td", {}, k.models && k.models.length ? k.models.join(", ") : "all"),
        h("td", {}, k.admin ? "admin" : ""), h("td", {}, when(k.created_at)), h("td", {}, when(k.expires_at)),
        h("td", { class: "state" }, badge(state, state === "active" ? "ok" : "bad")),
        h("td", {}, state === "active"
          ? h("button", { type: "button", class: "danger", "data-action": "revoke", "data-key": k.id,
              "data-name": k.name }, "Revoke")
          : ""));
    });
    replaceRows($("#keys"), rows, 8, "No keys: the gateway is open to every request.");
  };

  // ---------------------------------------------------------------- charts (inline SVG)

  const COLORS = ["#2456c7", "#d9480f", "#1b7f3b", "#7048e8", "#c2255c", "#0b7285", "#e67700", "#495057"];
  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }
  function fmt(v) {
    if (v === 0) return "0";
    if (Math.abs(v) >= 1000) return (v / 1000).toFixed(1) + "k";
    if (Math.abs(v) >= 10) return v.toFixed(0);
    if (Math.abs(v) >= 1) return v.toFixed(1);
    return v.toPrecision(2);
  }
  function hhmm(t) { return new Date(t * 1000).toISOString().slice(11, 16); }

  function drawChart(plot, data) {
    const series = data.series.filter((x) => x.points.some((p) => p[1] !== null));
    if (!series.length) {
      plot.replaceChildren(h("p", { class: "empty" }, "No data in this range yet."));
      return;
    }
    const W = 560, H = 200, L = 44, R = 8, T = 8, B = 22;
    let max = 0;
    for (const x of series) for (const [, v] of x.points) if (v !== null && v > max) max = v;
    max = niceMax(max);
    const X = (t) => L + ((t - data.start) / (data.end - data.start)) * (W - L - R);
    const Y = (v) => T + (1 - v / max) * (H - T - B);
    const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": data.title });
    const grid = s("g", { class: "grid" });
    for (let i = 0; i <= 4; i++) {
      const v = (max * i) / 4;
      grid.append(s("line", { x1: L, x2: W - R, y1: Y(v), y2: Y(v) }));
      grid.append(s("text", { x: L - 4, y: Y(v) + 3, "text-anchor": "end" }, fmt(v)));
    }
    [["start", data.start], ["middle", (data.start + data.end) / 2], ["end", data.end]].forEach(([anchor, t]) => {
      grid.append(s("text", { x: X(t), y: H - 6, "text-anchor": anchor }, hhmm(t)));
    });
    svg.append(grid);
    series.forEach((x, i) => {
      // A null (no samples, or a quantile over no requests) breaks the line instead of dropping to zero.
      let d = "", pen = false;
      const color = COLORS[i % COLORS.length];
      x.points.forEach(([t, v], j) => {
        if (v === null) { pen = false; return; }
        d += `${pen ? "L" : "M"}${X(t).toFixed(1)},${Y(v).toFixed(1)}`;
        const next = x.points[j + 1];
        if (!pen && (!next || next[1] === null)) {
          // A lone sample would be an invisible zero-length line: mark it with a dot.
          svg.append(s("circle", { cx: X(t).toFixed(1), cy: Y(v).toFixed(1), r: 2.5, fill: color }));
        }
        pen = true;
      });
      svg.append(s("path", { d, fill: "none", stroke: color, "stroke-width": 1.6, "data-series": x.label }));
    });
    const legend = h("div", { class: "legend" }, series.map((x, i) =>
      h("span", {}, h("i", { style: `background:${COLORS[i % COLORS.length]}` }), x.label)));
    plot.replaceChildren(svg, legend);
  }

  pages.history = async () => {
    const figures = document.querySelectorAll("figure[data-chart]");
    if (!figures.length) return;  // history is off: the page explains how to turn it on
    const range = $("#history-range").value;
    await Promise.all([...figures].map(async (fig) => {
      const plot = fig.querySelector(".plot");
      try {
        const data = await request(`${BASE}dashboard/history.json?chart=${fig.dataset.chart}&range=${range}`);
        drawChart(plot, data);
      } catch (e) {
        plot.replaceChildren(h("p", { class: "error" }, e.message));
      }
    }));
  };

  // ---------------------------------------------------------------- actions

  async function act(work, done) {
    try {
      const message = await work();
      if (message) flash(message);
      await refresh();
    } catch (e) {
      flash(e.message, true);
    } finally {
      if (done) done();
    }
  }

  document.addEventListener("click", (ev) => {
    const button = ev.target.closest("button[data-action]");
    if (!button) return;
    const { action, node, key, name } = button.dataset;
    if (action === "cordon" || action === "uncordon") {
      button.disabled = true;
      act(async () => { await api(`/nodes/${encodeURIComponent(node)}/${action}`, "POST"); return `Node ${node}: ${action}ed.`; });
    } else if (action === "drain") {
      if (!confirm(`Drain node ${node}? Its replicas move to other nodes and it takes no new ones.`)) return;
      button.disabled = true;
      act(async () => { await api(`/nodes/${encodeURIComponent(node)}/drain`, "POST"); return `Node ${node} is draining.`; });
    } else if (action === "revoke") {
      if (!confirm(`Revoke key ${name}? Clients using it are refused at once.`)) return;
      button.disabled = true;
      act(async () => { await api(`/keys/${encodeURIComponent(key)}/revoke`, "POST"); return `Key ${name} revoked.`; });
    } else if (action === "replica-logs") {
      replicaLogs.show(button.dataset.replica);
    } else if (action === "close-logs") {
      replicaLogs.replica = "";
      $("#replica-logs").hidden = true;
    } else if (action === "dismiss-secret") {
      $("#new-secret-value").textContent = "";
      $("#new-secret").hidden = true;
    }
  });

  document.addEventListener("submit", (ev) => {
    const form = ev.target.closest("form[data-action]");
    if (!form) return;
    ev.preventDefault();
    const submit = form.querySelector("button[type=submit]");
    submit.disabled = true;
    const done = () => { submit.disabled = false; };
    if (form.dataset.action === "create-key") {
      const f = new FormData(form);
      const payload = { name: f.get("name"), group_id: f.get("group_id"), admin: f.get("admin") === "on" };
      const models = String(f.get("models") || "").split(",").map((m) => m.trim()).filter(Boolean);
      if (models.length) payload.models = models;
      act(async () => {
        const created = await api("/keys", "POST", payload);
        // Shown once, never kept: the page forgets it when dismissed or reloaded.
        $("#new-secret-value").textContent = created.secret;
        $("#new-secret").hidden = false;
        form.reset();
        return `Key ${payload.name} created.`;
      }, done);
    } else if (form.dataset.action === "add-model") {
      let entry;
      try { entry = JSON.parse(form.elements.model.value); } catch (e) {
        flash("The model entry is not valid JSON: " + e.message, true); done(); return;
      }
      act(async () => { await api("/models", "POST", entry); return `Model ${entry.name} added.`; }, done);
    } else if (form.dataset.action === "add-group") {
      const f = new FormData(form);
      const payload = { name: f.get("name"), parent_id: f.get("parent_id") || null };
      act(async () => { await api("/groups", "POST", payload); form.reset(); return `Group ${payload.name} added.`; }, done);
    } else if (form.dataset.action === "end-sessions") {
      const user = String(new FormData(form).get("user") || "").trim();
      act(async () => {
        await api("/sessions/revoke", "POST", { user });
        form.reset();
        return `The dashboard sessions of ${user} are ended.`;
      }, done);
    }
  });

  for (const id of ["#usage-since", "#history-range"]) {
    const el = $(id);
    if (el) el.addEventListener("change", () => refresh());
  }

  // ---------------------------------------------------------------- refresh loop

  let running = null;
  let again = false;
  async function refresh() {
    // One refresh at a time: an action's refresh and the timer's must not interleave their renders.
    // A refresh asked for while one runs (after an action, or a new range) runs once more after
    // it, since the one in flight may have read the old state.
    if (running) { again = true; return running; }
    running = (async () => {
      const status = $("#status");
      do {
        again = false;
        try {
          await (pages[PAGE] || (async () => {}))();
          status.textContent = "updated " + new Date().toLocaleTimeString();
          status.classList.remove("stale");
          body.dataset.loaded = "true";
        } catch (e) {
          status.textContent = "refresh failed: " + e.message;
          status.classList.add("stale");
        }
      } while (again);
    })();
    try { await running; } finally { running = null; }
  }

  async function loop() {
    if (!document.hidden) await refresh();
    // History changes slowly and costs Prometheus queries: poll it less often.
    setTimeout(loop, PAGE === "history" ? Math.max(REFRESH_MS, 15000) : REFRESH_MS);
  }
  window.llmgw = { refresh };
  loop();
})();
