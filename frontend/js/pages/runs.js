// The run list (/): every run with its status kept live from /ws/live `run` events, a
// filter (text, project, status, tag) and a sort kept in the URL, each run's findings counts,
// a selection to compare runs, and per run: edit (name and tags) and delete, each in a modal
// <dialog> (views/run-dialogs.js). The table is views/run-table.js. index.html calls init().

import { api, compareUrl, liveUrl, UnreachableError } from "../api.js";
import { byId, h, notice, setChildren } from "../dom.js";
import { fmtCount, runDuration } from "../format.js";
import { startIt, unreachableNotice } from "../page.js";
import { LiveSocket, renderLiveStatus } from "../live.js";
import { queryValue, readQuery, writeQuery } from "../url.js";
import { deleteRunDialog, editRunDialog } from "../views/run-dialogs.js";
import { emptyState, runTable } from "../views/run-table.js";

const PAGE = 500;
const POLL_MS = 5000; // while a run is running: refresh steps and durations

/** Sortable columns: key -> [header, value of a run, first direction]. */
export const SORTS = {
  name: ["Run", (r) => String(r.name || r.id).toLowerCase(), "asc"],
  project: ["Project", (r) => String(r.project || "").toLowerCase(), "asc"],
  status: ["Status", (r) => String(r.status || ""), "asc"],
  steps: ["Steps", (r) => r.steps ?? 0, "desc"],
  created: ["Started", (r) => r.created_at ?? 0, "desc"],
  duration: ["Duration", (r) => runDuration(r) ?? -1, "desc"],
};
export const DEFAULT_SORT = "created";

/**
 * The runs a filter lets through, sorted: `f` is {text, project, status, tag, sort, dir}.
 * Text matches name, project, id, optimizer or a tag (case-insensitive); ties go newest
 * first, then by id, so the order never depends on arrival.
 */
export function visibleRuns(runs, f) {
  const text = f.text.trim().toLowerCase();
  const rows = runs.filter((r) =>
    (!f.project || (r.project || "") === f.project)
    && (!f.status || r.status === f.status)
    && (!f.tag || (r.tags || []).includes(f.tag))
    && (!text || [r.name, r.project, r.id, r.optimizer, ...(r.tags || [])]
      .some((v) => String(v || "").toLowerCase().includes(text))));
  const value = SORTS[f.sort][1];
  const sign = f.dir === "asc" ? 1 : -1;
  const created = SORTS.created[1];
  return rows.sort((a, b) => sign * compare(value(a), value(b)) || compare(created(b), created(a)) || compare(a.id, b.id));
}

function compare(a, b) {
  if (typeof a === "string" || typeof b === "string") return String(a).localeCompare(String(b));
  return a < b ? -1 : a > b ? 1 : 0;
}

let state;
let el; // the page's elements

/** Read the URL, draw the list and follow /ws/live. */
export function init() {
  const q = readQuery();
  const sortKey = queryValue(q, "sort", DEFAULT_SORT);
  state = {
    runs: [],          // RunPublic, newest first
    count: 0,          // all runs on the server
    phase: "loading",  // loading | ready | unreachable | error
    stale: false,      // ready, but the last refresh failed: the list may be out of date
    error: "",
    text: queryValue(q, "q", ""),
    project: queryValue(q, "project", ""),
    status: queryValue(q, "status", ""),
    tag: queryValue(q, "tag", ""),
    sort: sortKey in SORTS ? sortKey : DEFAULT_SORT,
    dir: "",           // asc | desc; "" is the column's first direction
    selected: new Set(),
  };
  state.dir = ["asc", "desc"].includes(queryValue(q, "dir")) ? queryValue(q, "dir") : SORTS[state.sort][2];

  el = {
    list: byId("runs"), count: byId("run-count"), text: byId("filter-text"), project: byId("filter-project"),
    status: byId("filter-status"), tag: byId("filter-tag-select"), compare: byId("compare"), live: byId("live"), banner: byId("banner"), toolbar: byId("filters"),
  };
  el.toolbar.addEventListener("submit", (e) => e.preventDefault());
  el.text.value = state.text;
  el.status.value = state.status;
  el.text.addEventListener("input", () => { state.text = el.text.value; changed(); });
  el.project.addEventListener("change", () => { state.project = el.project.value; changed(); });
  el.status.addEventListener("change", () => { state.status = el.status.value; changed(); });
  el.tag.addEventListener("change", () => filterTag(el.tag.value));
  el.compare.addEventListener("click", () => { location.href = compareUrl([...state.selected]); });
  document.addEventListener("keydown", (e) => {
    if (e.key === "/" && document.activeElement === document.body) {
      e.preventDefault();
      el.text.focus();
    }
  });

  // Back to the button that opened a dialog (the row may have been redrawn meanwhile).
  const returnFocus = (run, action) => {
    const row = run && [...el.list.querySelectorAll("tr[data-run-id]")].find((r) => r.dataset.runId === run.id);
    return (row && action && row.querySelector(`[data-action="${action}"]`)) || el.compare;
  };
  dialogs.edit = editRunDialog({ onSaved: replaceRun, returnFocus });
  dialogs.delete = deleteRunDialog({
    returnFocus,
    onDeleted: (run) => {
      state.runs = state.runs.filter((r) => r.id !== run.id);
      state.count = Math.max(0, state.count - 1);
      state.selected.delete(run.id);
      render();
    },
  });

  new LiveSocket(liveUrl(), {
    onMessage: (msg) => { if (msg.type === "run" && msg.run && msg.run.id) upsert(msg.run); },
    onStatus: (s, ms) => {
      renderLiveStatus(el.live, s, ms);
      if (s === "reconnecting" && state.phase === "ready" && !state.stale) load(); // down? then say so
    },
    onOpen: (reconnected) => { if (reconnected || state.phase !== "ready") load(); },
  }).start();

  setInterval(() => {
    if (state.phase === "ready" && !document.hidden && state.runs.some((r) => r.status === "running")) load();
  }, POLL_MS);

  load();
}

const dialogs = { edit: null, delete: null };

function changed() {
  const defaultSort = state.sort === DEFAULT_SORT && state.dir === SORTS[DEFAULT_SORT][2];
  writeQuery({
    q: state.text.trim(), project: state.project, status: state.status, tag: state.tag,
    sort: defaultSort ? null : state.sort, dir: defaultSort ? null : state.dir,
  });
  render();
}

function sortBy(key) {
  if (state.sort === key) state.dir = state.dir === "asc" ? "desc" : "asc";
  else {
    state.sort = key;
    state.dir = SORTS[key][2];
  }
  changed();
}

function filterTag(tag) {
  state.tag = tag;
  changed();
}

async function load() {
  try {
    const res = await api.runs({ limit: PAGE });
    state.runs = res.data || [];
    state.count = res.count ?? state.runs.length;
    state.phase = "ready";
    state.stale = false;
  } catch (err) {
    console.error(err);
    if (state.phase === "ready") state.stale = true; // keep showing what we have, with a banner
    else state.phase = err instanceof UnreachableError ? "unreachable" : "error";
    state.error = String(err.message || err);
  }
  render();
  document.body.dataset.ready = "1";
}

function render() {
  document.body.dataset.state = state.phase;
  setChildren(el.banner, state.stale ? unreachableNotice("Showing the runs as they were; this page reconnects by itself.") : null);
  el.toolbar.hidden = state.phase === "ready" && !state.runs.length;
  renderProjects();
  renderTags();
  renderTagFilter();
  el.compare.disabled = state.selected.size < 2;
  el.compare.textContent = state.selected.size ? `Compare ${state.selected.size} runs` : "Compare runs";
  if (state.phase === "loading") {
    el.count.textContent = "";
    return setChildren(el.list, notice("loading", "Loading runs…"));
  }
  if (state.phase === "unreachable") {
    el.count.textContent = "";
    return setChildren(el.list, unreachableNotice(...startIt(), ". This page reconnects by itself."));
  }
  if (state.phase === "error") {
    return setChildren(el.list, notice("error", "The runs could not be loaded", h("p", {}, state.error)));
  }
  if (!state.runs.length) {
    el.count.textContent = "";
    return setChildren(el.list, emptyState(location.origin));
  }
  const rows = visibleRuns(state.runs, state);
  el.count.textContent = rows.length === state.runs.length
    ? `${fmtCount(state.count)} run${state.count === 1 ? "" : "s"}`
    : `${rows.length} of ${fmtCount(state.count)} runs`;
  if (!rows.length) {
    return setChildren(el.list, notice("empty", "No runs match the filter",
      h("button", { type: "button", class: "btn", onclick: clearFilter }, "Clear the filter")));
  }
  const more = state.count > state.runs.length
    ? h("p", { class: "muted table-foot" }, `Showing the newest ${fmtCount(state.runs.length)} of ${fmtCount(state.count)} runs.`) : null;
  // The table is rebuilt on every change: keep the keyboard focus where it was.
  const active = document.activeElement;
  const focusKey = active && el.list.contains(active) && active.dataset ? active.dataset.focus : null;
  const focusRow = focusKey && active.closest("tr[data-run-id]");
  setChildren(el.list, runTable(rows, { sorts: SORTS, sort: state.sort, dir: state.dir, selected: state.selected, tag: state.tag }, {
    onSort: sortBy,
    onCheck: (id, on) => { if (on) state.selected.add(id); else state.selected.delete(id); render(); },
    onTag: filterTag,
    onEdit: (r, from) => dialogs.edit.open(r, from),
    onDelete: (r, from) => dialogs.delete.open(r, from),
  }), more);
  if (focusKey) {
    const scope = focusRow
      ? [...el.list.querySelectorAll("tr[data-run-id]")].find((r) => r.dataset.runId === focusRow.dataset.runId)
      : el.list;
    const target = scope && [...scope.querySelectorAll("[data-focus]")].find((t) => t.dataset.focus === focusKey);
    if (target) target.focus();
  }
}

/** The active tag filter, as a chip that clears it. */
function renderTagFilter() {
  let chip = document.getElementById("filter-tag");
  if (!state.tag) {
    if (chip) chip.remove();
    return;
  }
  if (!chip) {
    chip = h("span", { id: "filter-tag", class: "chip", role: "status" });
    el.tag.after(chip);
  }
  setChildren(chip, h("span", { class: "muted" }, "only runs tagged"), h("span", { class: "chip-name" }, state.tag),
    h("button", { type: "button", class: "chip-x", "aria-label": `Stop filtering by tag ${state.tag}`,
      onclick: () => { filterTag(""); el.text.focus(); } }, "×"));
}

function renderProjects() {
  const projects = [...new Set(state.runs.map((r) => r.project || ""))].filter(Boolean).sort();
  if (state.project && !projects.includes(state.project)) projects.push(state.project);
  const current = [...el.project.options].map((o) => o.value).join("\n");
  const next = ["", ...projects].join("\n");
  if (current !== next) {
    setChildren(el.project, h("option", { value: "" }, "All projects"),
      projects.map((p) => h("option", { value: p }, p)));
  }
  el.project.value = state.project;
}

/** The tag filter's choices: every tag of the runs (and the active one); hidden while no run has a tag. */
function renderTags() {
  const tags = [...new Set(state.runs.flatMap((r) => r.tags || []))].sort();
  if (state.tag && !tags.includes(state.tag)) tags.push(state.tag);
  const current = [...el.tag.options].map((o) => o.value).join("\n");
  if (current !== ["", ...tags].join("\n")) {
    setChildren(el.tag, h("option", { value: "" }, "Any tag"), tags.map((t) => h("option", { value: t }, `tag: ${t}`)));
  }
  el.tag.value = state.tag;
  el.tag.hidden = !tags.length;
}

function clearFilter() {
  state.text = state.project = state.status = state.tag = "";
  el.text.value = "";
  el.status.value = "";
  changed();
}

function replaceRun(updated) {
  const i = state.runs.findIndex((r) => r.id === updated.id);
  if (i >= 0) state.runs[i] = { ...state.runs[i], ...updated };
  render();
}

function upsert(run) {
  const i = state.runs.findIndex((r) => r.id === run.id);
  if (i >= 0) state.runs[i] = { ...state.runs[i], ...run };
  else {
    state.runs.unshift(run);
    state.count += 1;
  }
  if (state.phase !== "ready") state.phase = "ready";
  render();
}
