// The run list's table: a sortable header, a row per run (select to compare, name and id,
// tags that filter, project, status, steps, times, size, optimizer, findings, edit and
// delete), and what the list shows when the server has no run yet. pages/runs.js owns the state.

import { runPageUrl } from "../api.js";
import { h, statusBadge } from "../dom.js";
import { fmtAgo, fmtCount, fmtDuration, fmtTime, runDuration } from "../format.js";
import { ranksBadgeText } from "../ranks.js";

export const DEFAULT_SERVER = "http://127.0.0.1:8765"; // where the hook sends unless told otherwise

/**
 * @param {object[]} rows  the runs to show, in order
 * @param {{sorts: Object<string, Array>, sort: string, dir: string, selected: Set<string>, tag?: string}} view
 *   tag: the active tag filter (its chips are drawn pressed)
 * @param {{onSort: (key: string) => void, onCheck: (id: string, on: boolean) => void,
 *          onTag: (tag: string) => void, onEdit: (run: object, from: Element) => void,
 *          onDelete: (run: object, from: Element) => void}} on
 */
export function runTable(rows, view, on) {
  const header = (key, num) => {
    const [title] = view.sorts[key];
    const active = view.sort === key;
    return h("th", { scope: "col", class: num ? "num" : "", "aria-sort": active ? (view.dir === "asc" ? "ascending" : "descending") : "none" },
      h("button", {
        type: "button", class: `sort${active ? " sort-on" : ""}`, dataset: { sort: key, focus: `sort:${key}` },
        title: `Sort by ${title.toLowerCase()}`, onclick: () => on.onSort(key),
      }, title, h("span", { class: "sort-mark", "aria-hidden": "true" }, active ? (view.dir === "asc" ? "▲" : "▼") : "↕")));
  };
  return h("div", { class: "table-wrap" }, h("table", { class: "runs-table" },
    h("thead", {}, h("tr", {},
      h("th", { class: "col-check" }, h("span", { class: "sr-only" }, "Compare")),
      header("name"), header("project"), header("status"), header("steps", true), header("created"), header("duration"),
      h("th", { scope: "col", class: "num" }, "Parameters"),
      h("th", { scope: "col" }, "Optimizer"),
      h("th", { scope: "col" }, "Findings"),
      h("th", { scope: "col", class: "col-actions" }, h("span", { class: "sr-only" }, "Actions")))),
    h("tbody", {}, rows.map((r) => runRow(r, view, on)))));
}

function runRow(r, view, on) {
  const name = r.name || r.id;
  const tags = r.tags || [];
  return h("tr", { dataset: { runId: r.id, status: r.status } },
    h("td", { class: "col-check" }, h("input", {
      type: "checkbox", checked: view.selected.has(r.id), "aria-label": `Select ${name} to compare`,
      dataset: { focus: "check" }, onchange: (e) => on.onCheck(r.id, e.target.checked),
    })),
    h("td", { class: "col-name" }, h("a", { href: runPageUrl(r.id), class: "run-link", dataset: { focus: "link" } }, name),
      name !== r.id ? h("span", { class: "run-id" }, r.id) : null,
      ranksBadgeText(r.world_size) ? h("span", { class: "ranks-badge", dataset: { worldSize: String(r.world_size) },
        title: `A distributed job: ${r.world_size} processes, one run` }, ranksBadgeText(r.world_size)) : null,
      tags.length ? h("span", { class: "tags" }, tags.map((t) => h("button", {
        type: "button", class: `tag${t === view.tag ? " tag-on" : ""}`, "aria-pressed": String(t === view.tag),
        dataset: { tag: t, focus: `tag:${t}` }, title: `Show only runs tagged ${t}`,
        onclick: () => on.onTag(t),
      }, t))) : null),
    h("td", {}, r.project || "—"),
    h("td", {}, statusBadge(r.status)),
    h("td", { class: "num" }, fmtCount(r.steps)),
    h("td", { title: fmtTime(r.created_at) }, fmtAgo(r.created_at)),
    h("td", {}, fmtDuration(runDuration(r))),
    h("td", { class: "num", title: r.param_numel ? `${fmtCount(r.param_numel)} values` : null },
      r.param_numel ? fmtCount(r.param_numel, true) : "—",
      r.param_count != null ? h("span", { class: "run-id" }, `${fmtCount(r.param_count)} tensors`) : null),
    h("td", {}, r.optimizer || "—"),
    findingsCell(r),
    h("td", { class: "col-actions" },
      h("button", { type: "button", class: "btn btn-small", dataset: { action: "edit", focus: "edit" },
        "aria-label": `Edit the name and tags of ${name}`, onclick: (e) => on.onEdit(r, e.currentTarget) }, "Edit"),
      h("button", { type: "button", class: "btn btn-small btn-danger", dataset: { action: "delete", focus: "delete" },
        "aria-label": `Delete ${name}`, onclick: (e) => on.onDelete(r, e.currentTarget) }, "Delete")));
}

/** Errors and warnings found in a run (GET /api/runs/{id}/diagnostics lists them). */
function findingsCell(r) {
  const f = r.findings || {};
  const errors = f.error || 0;
  const warnings = f.warning || 0;
  const info = f.info || 0;
  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
  return h("td", { class: "col-findings", dataset: { errors, warnings, info },
    title: `${plural(errors, "error")}, ${plural(warnings, "warning")}, ${info} info` },
  errors ? h("span", { class: "fcount fcount-error" }, plural(errors, "error")) : null,
  warnings ? h("span", { class: "fcount fcount-warning" }, plural(warnings, "warning")) : null,
  !errors && !warnings ? h("span", { class: "muted" }, info ? `${info} info` : "none") : null);
}

/** No run on the server yet: how to attach the hook, for this server's address (`origin`). */
export function emptyState(origin) {
  const code = "import gradwatch\nw = gradwatch.watch(optimizer, model=model, run=\"name\")\n# ...train as usual: the run shows up here, live";
  const copy = h("button", {
    type: "button", class: "btn btn-quiet copy",
    onclick: async () => {
      try { await navigator.clipboard.writeText(code); copy.textContent = "Copied"; } catch { copy.textContent = "Select and copy"; }
    },
  }, "Copy");
  return h("div", { class: "empty" },
    h("h2", {}, "No runs yet: attach the hook to a training script"),
    h("p", {}, "Add two lines after you create the optimizer. Each run appears here as soon as it takes its first step."),
    h("div", { class: "snippet" }, h("pre", {}, h("code", {}, code)), copy),
    origin === DEFAULT_SERVER
      ? h("p", { class: "muted" }, "The hook sends to ", h("code", {}, DEFAULT_SERVER), ", this server, by default.")
      : h("p", { class: "muted" }, "This server is at ", h("code", {}, origin), ": pass ",
        h("code", {}, `server="${origin}"`), " to watch(), or set ", h("code", {}, `GRADWATCH_SERVER=${origin}`), "."));
}
