// llmgw dashboard, "Find a model": Hub search, a repository's GGUF files with their fit on the
// fleet, pulls with progress, their draft models (edit, publish). Plain DOM, textContent only:
// repository and file names come from the Hub, which we do not control.
(() => {
  "use strict";
  const body = document.body;
  if (body.dataset.page !== "find") return;
  const API = body.dataset.apiBase;
  const CSRF = (document.querySelector('meta[name="csrf-token"]') || {}).content || "";
  const $ = (sel) => document.querySelector(sel);
  const RUNNING = ["queued", "downloading", "verifying"];
  const autoPublish = new Set();
  let openDraft = null;

  const { h } = window.llmgwDom;
  async function api(path, method = "GET", payload = undefined) {
    const headers = { Accept: "application/json" };
    if (CSRF) headers["X-CSRF-Token"] = CSRF;
    if (payload !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(API + path, { method, headers, credentials: "same-origin",
      body: payload === undefined ? undefined : JSON.stringify(payload) });
    let data = null;
    try { data = await response.json(); } catch (_) { /* empty */ }
    if (!response.ok) {
      const err = data && data.error;
      throw new Error(err ? err.message : `HTTP ${response.status}`);
    }
    return data;
  }
  function flash(message, isError = false) {
    const el = $("#flash");
    el.textContent = message;
    el.className = isError ? "flash error" : "flash";
    el.hidden = false;
  }
  function size(v) {
    const units = ["B", "KiB", "MiB", "GiB"];
    let i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
    return i ? `${v.toFixed(1)} ${units[i]}` : `${v} B`;
  }
  function rows(table, list, cols, empty) {
    table.tBodies[0].replaceChildren(...(list.length ? list
      : [h("tr", {}, h("td", { colSpan: cols, class: "empty" }, empty))]));
  }
  const badge = (text, kind) => h("span", { class: "badge " + kind }, text);

  $("#hub-search").addEventListener("submit", async (event) => {
    event.preventDefault();
    const q = new FormData(event.target).get("q") || "";
    try {
      const found = await api("/hub/search?q=" + encodeURIComponent(q));
      rows($("#hub-repos"), found.repos.map((r) => h("tr", { "data-repo": r.id },
        h("td", {}, r.id), h("td", {}, r.downloads.toLocaleString("en-US")), h("td", {}, r.likes),
        h("td", {}, (r.updated || "").slice(0, 10)),
        h("td", {}, h("button", { type: "button", "data-find": "files", "data-repo": r.id }, "Files")))),
      5, `No GGUF repositories match “${q}”.`);
    } catch (e) { flash("Search failed: " + e.message, true); }
  });

  async function showFiles(repo) {
    const answer = await api("/hub/files?repo=" + encodeURIComponent(repo));
    $("#hub-files-title").textContent = repo;
    $("#hub-files-panel").hidden = false;
    rows($("#hub-files"), answer.files.map((f) => h("tr", { "data-file": f.path },
      h("td", {}, f.path), h("td", {}, f.quantisation || "—"), h("td", {}, size(f.size)),
      h("td", {}, size(f.estimate_ram_mib * 1048576)),
      h("td", { title: f.fit_detail }, f.fits === null ? "—" : f.fits ? badge("fits", "ok") : badge("does not fit", "bad"),
        f.fits === false ? h("div", { class: "detail" }, f.fit_detail) : null),
      h("td", {}, f.split ? "split file: not pulled yet"
        : h("button", { type: "button", "data-find": "pull", "data-repo": repo, "data-file": f.path }, "Add")))),
    6, "This repository has no GGUF files.");
  }

  async function refreshPulls() {
    const pulls = (await api("/models/pulls")).pulls;
    for (const p of pulls) {
      if (p.state === "ready" && autoPublish.has(p.id)) {
        autoPublish.delete(p.id);
        try { await api(`/models/pulls/${p.id}/publish`, "POST"); p.state = "published";
          flash(`Model ${p.draft.name} added to the catalog.`);
        } catch (e) { flash("Publish failed: " + e.message, true); }
      }
    }
    rows($("#pulls"), pulls.map((p) => {
      const share = p.size ? Math.floor((100 * p.bytes) / p.size) : 0;
      const progress = RUNNING.includes(p.state)
        ? [h("progress", { max: 100, value: share }), ` ${share}% · ${size(p.bytes)} / ${size(p.size)} · ${size(p.rate)}/s`
           + (p.eta_seconds !== null ? ` · ETA ${Math.round(p.eta_seconds)} s` : "")]
        : p.error || size(p.size);
      const kind = p.state === "failed" ? "bad" : ["ready", "published"].includes(p.state) ? "ok" : "warn";
      return h("tr", { "data-pull": p.id },
        h("td", {}, p.name), h("td", {}, badge(p.state, kind)), h("td", {}, progress),
        h("td", {}, p.draft ? `${p.draft.name} (context ${p.draft.profiles[0].context}, ~${p.estimate_ram_mib} MiB)` : "—"),
        h("td", {}, p.state === "ready" ? [
          h("button", { type: "button", "data-find": "edit", "data-pull": p.id }, "Edit draft"),
          h("button", { type: "button", "data-find": "publish", "data-pull": p.id }, "Publish")] : null,
        RUNNING.includes(p.state) ? h("button", { type: "button", class: "danger", "data-find": "cancel", "data-pull": p.id }, "Cancel") : null));
    }), 5, "No pulls.");
    return pulls;
  }

  document.addEventListener("click", async (event) => {
    const el = event.target.closest("[data-find]");
    if (!el || el.tagName !== "BUTTON") return;
    el.disabled = true;
    try {
      const what = el.dataset.find;
      if (what === "files") await showFiles(el.dataset.repo);
      else if (what === "pull") {
        const answer = await api("/models/pulls", "POST", { repo: el.dataset.repo, file: el.dataset.file });
        if ($("#publish-when-ready").checked) autoPublish.add(answer.pull.id);
        flash(`Pulling ${answer.pull.name}…`);
      } else if (what === "publish") {
        const answer = await api(`/models/pulls/${el.dataset.pull}/publish`, "POST");
        flash(`Model ${answer.model.name} added to the catalog.`);
      } else if (what === "cancel") {
        await api(`/models/pulls/${el.dataset.pull}`, "DELETE");
      } else if (what === "edit") {
        const pull = (await api(`/models/pulls/${el.dataset.pull}`)).pull;
        openDraft = pull.id;
        $("#draft-id").textContent = pull.id;
        $("#draft-panel").hidden = false;
        $("#draft-panel").open = true;
        $("#draft-panel textarea").value = JSON.stringify(pull.draft, null, 2);
      }
      await refreshPulls();
    } catch (e) { flash(e.message, true); } finally { el.disabled = false; }
  });

  document.querySelector('[data-find="save-draft"]').addEventListener("submit", async (event) => {
    event.preventDefault();
    let draft;
    try { draft = JSON.parse(event.target.elements.draft.value); } catch (e) {
      flash("The draft is not valid JSON: " + e.message, true); return;
    }
    try {
      await api(`/models/pulls/${openDraft}/draft`, "PUT", draft);
      flash(`Draft ${draft.name} saved.`);
      await refreshPulls();
    } catch (e) { flash("Saving the draft failed: " + e.message, true); }
  });

  async function loop() {
    let pulls = [];
    try { pulls = await refreshPulls(); } catch (_) { /* shown by the next action */ }
    // Quickly while something downloads (a live bar), slowly otherwise.
    setTimeout(loop, pulls.some((p) => RUNNING.includes(p.state)) ? 700 : 3000);
  }
  loop();
})();
