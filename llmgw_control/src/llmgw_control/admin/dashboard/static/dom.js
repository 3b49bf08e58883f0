// llmgw dashboard: the two element builders every page script uses (dashboard.js, capacity.js,
// find.js), loaded before them. Text goes in as text nodes or textContent, never as markup: the
// names and facts shown come from machines and people we do not control.
(() => {
  "use strict";
  const SVG = "http://www.w3.org/2000/svg";

  // An HTML element: attributes (class, data-*, or DOM properties) and children (nodes or text).
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k.startsWith("data-")) el.setAttribute(k, v);
      else el[k] = v;
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  // An SVG element, for the inline charts.
  function s(tag, attrs, text) {
    const el = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
    if (text !== undefined) el.textContent = text;
    return el;
  }

  window.llmgwDom = Object.freeze({ h, s });
})();
