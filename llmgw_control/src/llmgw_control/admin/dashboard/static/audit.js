// llmgw dashboard, "Audit": the audit log (GET /api/v1/audit), newest first, filtered by actor,
// resource, outcome and time, a page at a time (the API's next_cursor). Not polled: a page being
// read stays put; "Newest" reloads. textContent only: actors, actions and the changes' values come
// from requests we do not trust.
(() => {
  "use strict";
  const body = document.body;
  if (body.dataset.page !== "audit") return;
  const API = body.dataset.apiBase;
  const $ = (sel) => document.querySelector(sel);
  const { h } = window.llmgwDom;
  // The cursors of the pages before this one (for the page number) and the one after it.
  let cursors = [];
  let next = null;

  function filters() {
    const form = new FormData($("#audit-filters"));
    const query = new URLSearchParams();
    for (const name of ["actor", "resource", "resource_id", "outcome"]) {
      const v = String(form.get(name) || "").trim();
      if (v) query.set(name, v);
    }
    for (const name of ["since", "until"]) {
      const v = String(form.get(name) || "");
      // datetime-local is the browser's local time, without a zone: the API takes RFC 3339.
      if (v) { const d = new Date(v); if (!isNaN(d)) query.set(name, d.toISOString()); }
    }
    query.set("limit", String(form.get("limit") || "50"));
    return query;
  }

  function value(v) { return v === null || v === undefined ? "—" : typeof v === "string" ? v : JSON.stringify(v); }
  function changes(list) {
    if (!list.length) return "—";
    return h("ul", { class: "changes" }, list.map((c) => {
      const fields = [...new Set([...Object.keys(c.before || {}), ...Object.keys(c.after || {})])];
      return h("li", {}, h("span", { class: "mono" }, `${c.op} ${c.resource} ${c.id}`),
        fields.length ? h("ul", {}, fields.map((f) => h("li", {}, h("span", { class: "mono" }, f), ": ",
          value((c.before || {})[f]), " → ", value((c.after || {})[f])))) : null);
    }));
  }

  async function load(cursor) {
    const query = filters();
    if (cursor) query.set("cursor", cursor);
    const response = await fetch(`${API}/audit?${query}`, { headers: { Accept: "application/json" }, credentials: "same-origin" });
    let data = null;
    try { data = await response.json(); } catch (_) { /* not JSON */ }
    if (!response.ok) {
      const err = data && data.error;
      throw new Error(err ? err.message + (err.field ? ` (${err.field})` : "") : `HTTP ${response.status}`);
    }
    const rows = data.entries.map((e) => h("tr", { "data-audit-id": e.id, class: e.outcome === "refused" ? "refused" : "" },
      h("td", { class: "mono" }, String(e.at).replace("T", " ").slice(0, 19)),
      h("td", { class: "actor" }, e.actor), h("td", { class: "mono" }, e.peer || "—"),
      h("td", { class: "action" }, e.action),
      h("td", {}, h("span", { class: "badge " + (e.outcome === "ok" ? "ok" : "bad") }, e.outcome)),
      h("td", { class: "resource" }, e.resource, e.resource_id ? [" ", h("span", { class: "mono" }, e.resource_id)] : null),
      h("td", { class: "changes" }, changes(e.changes || []))));
    $("#audit").tBodies[0].replaceChildren(...(rows.length ? rows
      : [h("tr", {}, h("td", { colSpan: 7, class: "empty" }, "No entries match."))]));
    next = data.next_cursor || null;
    $('button[data-audit="next"]').disabled = !next;
    $("#audit-page-note").textContent = `Page ${cursors.length + 1}, ${rows.length} entr${rows.length === 1 ? "y" : "ies"}` +
      (next ? "; older entries follow." : "; the oldest that match.");
    body.dataset.auditLoaded = String(Number(body.dataset.auditLoaded || 0) + 1);
  }

  async function show(cursor) {
    try { await load(cursor); } catch (e) {
      $("#audit-page-note").textContent = "audit log: " + e.message;
      $("#audit-page-note").classList.add("error");
      body.dataset.auditLoaded = String(Number(body.dataset.auditLoaded || 0) + 1);
      return;
    }
    $("#audit-page-note").classList.remove("error");
  }

  $("#audit-filters").addEventListener("submit", (ev) => { ev.preventDefault(); cursors = []; show(null); });
  document.addEventListener("click", (ev) => {
    const button = ev.target.closest("button[data-audit]");
    if (!button) return;
    const what = button.dataset.audit;
    if (what === "next" && next) { cursors.push(next); show(next); }
    else if (what === "first") { cursors = []; show(null); }
    else if (what === "clear") { $("#audit-filters").reset(); cursors = []; show(null); }
  });
  show(null);
})();
