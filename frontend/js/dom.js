// Building DOM without innerHTML: every string becomes a text node, so names from the
// server (runs, projects, parameters, messages) are always shown as text, never parsed.

/**
 * h("a", {href, class: "x", dataset: {id}, onclick}, "text", childNode, [more], null)
 * Attributes: `class`, `dataset` (object), `on<event>` (function), `hidden`/`disabled`/`checked`
 * (booleans), anything else through setAttribute. Children: strings, numbers, nodes, arrays;
 * null/undefined/false are skipped.
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "hidden" || k === "disabled" || k === "checked" || k === "selected") el[k] = Boolean(v);
    else if (k === "value") el.value = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

/** Replace an element's children. */
export function setChildren(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** document.getElementById that fails loudly when the page lacks the element. */
export function byId(id) {
  const el = document.getElementById(id);
  if (!el) throw new Error(`missing #${id} in the page`);
  return el;
}

/** A status badge: running / finished / crashed. */
export function statusBadge(status) {
  const s = String(status || "unknown");
  return h("span", { class: `badge badge-${/^[a-z]+$/.test(s) ? s : "unknown"}`, dataset: { status: s } }, s);
}

/** A message block for empty, loading and error states. */
export function notice(kind, title, ...body) {
  return h("div", { class: `notice notice-${kind}`, role: kind === "error" ? "alert" : "status" },
    h("p", { class: "notice-title" }, title), ...body);
}
