// The run list (/): every run with its status kept live from /ws/live `run` events, a
// filter (text, project, status, tag) and a sort kept in the URL, each run's findings counts,
// a selection to compare runs, and per run: edit (name and tags) and delete, each in a modal
// <dialog> (delete asks first). Writes send the server's token once given (api.js).

import { api, ApiError, compareUrl, getToken, liveUrl, runPageUrl, setToken, UnreachableError } from "../api.js";
import { byId, h, notice, setChildren, statusBadge } from "../dom.js";
import { fmtAgo, fmtCount, fmtDuration, fmtTime, runDuration } from "../format.js";
import { LiveSocket, renderLiveStatus } from "../live.js";
import { queryValue, readQuery, writeQuery } from "../url.js";

const PAGE = 500;
const DEFAULT_SERVER = "http://127.0.0.1:8765"; // where the hook sends unless told otherwise
const POLL_MS = 5000; // while a run is running: refresh steps and durations

/** Sortable columns: key -> [header, value of a run, first direction]. */
const SORTS = {
  name: ["Run", (r) => String(r.name || r.id).toLowerCase(), "asc"],
  project: ["Project", (r) => String(r.project || "").toLowerCase(), "asc"],
  status: ["Status", (r) => String(r.status || ""), "asc"],
  steps: ["Steps", (r) => r.steps ?? 0, "desc"],
  created: ["Started", (r) => r.created_at ?? 0, "desc"],
  duration: ["Duration", (r) => runDuration(r) ?? -1, "desc"],
};
const DEFAULT_SORT = "created";

const q = readQuery();
const sortKey = queryValue(q, "sort", DEFAULT_SORT);
const state = {
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

const listEl = byId("runs");
const countEl = byId("run-count");
const textInput = byId("filter-text");
const projectSelect = byId("filter-project");
const statusSelect = byId("filter-status");
const compareBtn = byId("compare");
const liveEl = byId("live");
const bannerEl = byId("banner");
const toolbarEl = byId("filters");

byId("filters").addEventListener("submit", (e) => e.preventDefault());
textInput.value = state.text;
statusSelect.value = state.status;
textInput.addEventListener("input", () => { state.text = textInput.value; changed(); });
projectSelect.addEventListener("change", () => { state.project = projectSelect.value; changed(); });
statusSelect.addEventListener("change", () => { state.status = statusSelect.value; changed(); });
compareBtn.addEventListener("click", () => { location.href = compareUrl([...state.selected]); });
document.addEventListener("keydown", (e) => {
  if (e.key === "/" && document.activeElement === document.body) {
    e.preventDefault();
    textInput.focus();
  }
});

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

function visible() {
  const text = state.text.trim().toLowerCase();
  const rows = state.runs.filter((r) =>
    (!state.project || (r.project || "") === state.project)
    && (!state.status || r.status === state.status)
    && (!state.tag || (r.tags || []).includes(state.tag))
    && (!text || [r.name, r.project, r.id, r.optimizer, ...(r.tags || [])]
      .some((v) => String(v || "").toLowerCase().includes(text))));
  const value = SORTS[state.sort][1];
  const sign = state.dir === "asc" ? 1 : -1;
  const created = SORTS.created[1];
  // Ties: newest first, then by id, so the order never depends on arrival.
  return rows.sort((a, b) => sign * compare(value(a), value(b)) || compare(created(b), created(a)) || compare(a.id, b.id));
}

function compare(a, b) {
  if (typeof a === "string" || typeof b === "string") return String(a).localeCompare(String(b));
  return a < b ? -1 : a > b ? 1 : 0;
}

function render() {
  document.body.dataset.state = state.phase;
  setChildren(bannerEl, state.stale ? notice("error", "The gradwatch server is unreachable",
    h("p", {}, "Showing the runs as they were; this page reconnects by itself.")) : null);
  toolbarEl.hidden = state.phase === "ready" && !state.runs.length;
  renderProjects();
  renderTagFilter();
  compareBtn.disabled = state.selected.size < 2;
  compareBtn.textContent = state.selected.size ? `Compare ${state.selected.size} runs` : "Compare runs";
  if (state.phase === "loading") {
    countEl.textContent = "";
    return setChildren(listEl, notice("loading", "Loading runs…"));
  }
  if (state.phase === "unreachable") {
    countEl.textContent = "";
    return setChildren(listEl, notice("error", "The gradwatch server is unreachable",
      h("p", {}, "Start it with ", h("code", {}, "gradwatch serve"), ". This page reconnects by itself.")));
  }
  if (state.phase === "error") {
    return setChildren(listEl, notice("error", "The runs could not be loaded", h("p", {}, state.error)));
  }
  if (!state.runs.length) {
    countEl.textContent = "";
    return setChildren(listEl, emptyState());
  }
  const rows = visible();
  countEl.textContent = rows.length === state.runs.length
    ? `${fmtCount(state.count)} run${state.count === 1 ? "" : "s"}`
    : `${rows.length} of ${fmtCount(state.count)} runs`;
  if (!rows.length) {
    return setChildren(listEl, notice("empty", "No runs match the filter",
      h("button", { type: "button", class: "btn", onclick: clearFilter }, "Clear the filter")));
  }
  const more = state.count > state.runs.length
    ? h("p", { class: "muted table-foot" }, `Showing the newest ${fmtCount(state.runs.length)} of ${fmtCount(state.count)} runs.`) : null;
  // The table is rebuilt on every change: keep the keyboard focus where it was.
  const active = document.activeElement;
  const focusKey = active && listEl.contains(active) && active.dataset ? active.dataset.focus : null;
  const focusRow = focusKey && active.closest("tr[data-run-id]");
  const header = (key, num) => {
    const [title] = SORTS[key];
    const on = state.sort === key;
    return h("th", { scope: "col", class: num ? "num" : "", "aria-sort": on ? (state.dir === "asc" ? "ascending" : "descending") : "none" },
      h("button", {
        type: "button", class: `sort${on ? " sort-on" : ""}`, dataset: { sort: key, focus: `sort:${key}` },
        title: `Sort by ${title.toLowerCase()}`, onclick: () => sortBy(key),
      }, title, h("span", { class: "sort-mark", "aria-hidden": "true" }, on ? (state.dir === "asc" ? "▲" : "▼") : "↕")));
  };
  setChildren(listEl, h("div", { class: "table-wrap" }, h("table", { class: "runs-table" },
    h("thead", {}, h("tr", {},
      h("th", { class: "col-check" }, h("span", { class: "sr-only" }, "Compare")),
      header("name"), header("project"), header("status"), header("steps", true), header("created"), header("duration"),
      h("th", { scope: "col", class: "num" }, "Parameters"),
      h("th", { scope: "col" }, "Optimizer"),
      h("th", { scope: "col" }, "Findings"),
      h("th", { scope: "col", class: "col-actions" }, h("span", { class: "sr-only" }, "Actions")))),
    h("tbody", {}, rows.map(row)))), more);
  if (focusKey) {
    const scope = focusRow
      ? [...listEl.querySelectorAll("tr[data-run-id]")].find((el) => el.dataset.runId === focusRow.dataset.runId)
      : listEl;
    const target = scope && [...scope.querySelectorAll("[data-focus]")].find((el) => el.dataset.focus === focusKey);
    if (target) target.focus();
  }
}

function row(r) {
  const name = r.name || r.id;
  const tags = r.tags || [];
  return h("tr", { dataset: { runId: r.id, status: r.status } },
    h("td", { class: "col-check" }, h("input", {
      type: "checkbox", checked: state.selected.has(r.id), "aria-label": `Select ${name} to compare`,
      dataset: { focus: "check" },
      onchange: (e) => { if (e.target.checked) state.selected.add(r.id); else state.selected.delete(r.id); render(); },
    })),
    h("td", { class: "col-name" }, h("a", { href: runPageUrl(r.id), class: "run-link", dataset: { focus: "link" } }, name),
      name !== r.id ? h("span", { class: "run-id" }, r.id) : null,
      tags.length ? h("span", { class: "tags" }, tags.map((t) => h("button", {
        type: "button", class: "tag", dataset: { tag: t, focus: `tag:${t}` }, title: `Show only runs tagged ${t}`,
        onclick: () => filterTag(t),
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
        "aria-label": `Edit the name and tags of ${name}`, onclick: (e) => editDialog.open(r, e.currentTarget) }, "Edit"),
      h("button", { type: "button", class: "btn btn-small btn-danger", dataset: { action: "delete", focus: "delete" },
        "aria-label": `Delete ${name}`, onclick: (e) => deleteDialog.open(r, e.currentTarget) }, "Delete")));
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

/** The active tag filter, as a chip that clears it. */
function renderTagFilter() {
  let el = document.getElementById("filter-tag");
  if (!state.tag) {
    if (el) el.remove();
    return;
  }
  if (!el) {
    el = h("span", { id: "filter-tag", class: "chip" });
    statusSelect.after(el);
  }
  setChildren(el, h("span", { class: "muted" }, "tag"), h("span", { class: "chip-name" }, state.tag),
    h("button", { type: "button", class: "chip-x", "aria-label": `Stop filtering by tag ${state.tag}`,
      onclick: () => { filterTag(""); textInput.focus(); } }, "×"));
}

function renderProjects() {
  const projects = [...new Set(state.runs.map((r) => r.project || ""))].filter(Boolean).sort();
  if (state.project && !projects.includes(state.project)) projects.push(state.project);
  const current = [...projectSelect.options].map((o) => o.value).join("\n");
  const next = ["", ...projects].join("\n");
  if (current !== next) {
    setChildren(projectSelect, h("option", { value: "" }, "All projects"),
      projects.map((p) => h("option", { value: p }, p)));
  }
  projectSelect.value = state.project;
}

function clearFilter() {
  state.text = state.project = state.status = state.tag = "";
  textInput.value = "";
  statusSelect.value = "";
  changed();
}

function emptyState() {
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
    location.origin === DEFAULT_SERVER
      ? h("p", { class: "muted" }, "The hook sends to ", h("code", {}, DEFAULT_SERVER), ", this server, by default.")
      : h("p", { class: "muted" }, "This server is at ", h("code", {}, location.origin), ": pass ",
        h("code", {}, `server="${location.origin}"`), " to watch(), or set ", h("code", {}, `GRADWATCH_SERVER=${location.origin}`), "."));
}

// ---- edit and delete -------------------------------------------------------------------------

/**
 * A modal <dialog> (focus trapped, Escape cancels) with a form. `fields` are nodes of the form;
 * `submit(run)` does the write and throws ApiError on refusal: its message is shown, and a 401
 * shows a field for the server's token, kept for this tab and sent with the retry.
 */
function formDialog({ id, title, fields, submitLabel, danger = false, submit }) {
  const heading = h("h2", { id: `${id}-title` });
  const message = h("p", { class: "dialog-error", role: "alert" });
  const tokenInput = h("input", { class: "input", type: "password", autocomplete: "off", id: `${id}-token` });
  const tokenRow = h("label", { class: "field", hidden: true }, h("span", {}, "Server token"), tokenInput,
    h("span", { class: "field-help" }, "This server was started with --token: writes need it. It is kept for this tab only."));
  const cancel = h("button", { type: "button", class: "btn", value: "cancel", onclick: () => dialog.close("cancel") }, "Cancel");
  const ok = h("button", { type: "submit", class: `btn ${danger ? "btn-danger" : "btn-primary"}` }, submitLabel);
  const form = h("form", { method: "dialog" }, heading, fields, tokenRow, message, h("div", { class: "dialog-actions" }, cancel, ok));
  const dialog = h("dialog", { id, class: "dialog", "aria-labelledby": `${id}-title` }, form);
  document.body.appendChild(dialog);
  let run = null;
  let opener = null;
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    if (tokenInput.value) setToken(tokenInput.value.trim());
    ok.disabled = true;
    message.textContent = "";
    try {
      await submit(run);
      dialog.close("ok");
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) {
        tokenRow.hidden = false;
        message.textContent = getToken() ? "The server refused this token." : "This server needs its token.";
        tokenInput.focus();
      } else {
        message.textContent = err instanceof UnreachableError ? err.message : String(err.message || err);
      }
    } finally {
      ok.disabled = false;
    }
  });
  dialog.addEventListener("close", () => {
    dialog.dataset.result = dialog.returnValue || "cancel";
    // Back to the button that opened the dialog (the row may have been redrawn meanwhile).
    const row = run && [...listEl.querySelectorAll("tr[data-run-id]")].find((el) => el.dataset.runId === run.id);
    const target = (row && opener && row.querySelector(`[data-action="${opener.dataset.action}"]`)) || compareBtn;
    if (target && !target.disabled) target.focus();
  });
  return {
    dialog, heading,
    open(r, from, setup) {
      run = r;
      opener = from;
      message.textContent = "";
      tokenRow.hidden = true;
      tokenInput.value = "";
      delete dialog.dataset.result;
      if (setup) setup(r);
      dialog.showModal();
    },
  };
}

/** Tags as typed: comma-separated, trimmed, empty ones and repeats dropped. */
function parseTags(text) {
  return [...new Set(text.split(",").map((t) => t.trim()).filter(Boolean))];
}

function replaceRun(updated) {
  const i = state.runs.findIndex((r) => r.id === updated.id);
  if (i >= 0) state.runs[i] = { ...state.runs[i], ...updated };
  render();
}

const editDialog = (() => {
  const nameInput = h("input", { class: "input", id: "edit-name", required: true, maxlength: 256, autocomplete: "off", spellcheck: "false" });
  const tagsInput = h("input", { class: "input", id: "edit-tags", autocomplete: "off", spellcheck: "false", placeholder: "baseline, lr-sweep" });
  const d = formDialog({
    id: "edit-dialog", submitLabel: "Save",
    fields: [
      h("label", { class: "field", for: "edit-name" }, h("span", {}, "Name"), nameInput),
      h("label", { class: "field", for: "edit-tags" }, h("span", {}, "Tags"), tagsInput,
        h("span", { class: "field-help" }, "Separated by commas; up to 32, each up to 64 characters.")),
    ],
    async submit(run) {
      const changes = { tags: parseTags(tagsInput.value) };
      const name = nameInput.value.trim();
      if (name !== (run.name || run.id)) changes.name = name;
      replaceRun(await api.updateRun(run.id, changes));
    },
  });
  return {
    open(run, from) {
      d.open(run, from, (r) => {
        d.heading.textContent = "Edit run";
        nameInput.value = r.name || r.id;
        tagsInput.value = (r.tags || []).join(", ");
      });
      nameInput.select();
    },
  };
})();

const deleteDialog = (() => {
  const what = h("p", { class: "dialog-text" });
  const d = formDialog({
    id: "delete-dialog", submitLabel: "Delete", danger: true,
    fields: [what],
    async submit(run) {
      try {
        await api.deleteRun(run.id);
      } catch (err) {
        if (!(err instanceof ApiError && err.status === 404)) throw err; // gone already: fine
      }
      state.runs = state.runs.filter((r) => r.id !== run.id);
      state.count = Math.max(0, state.count - 1);
      state.selected.delete(run.id);
      render();
    },
  });
  return {
    open(run, from) {
      d.open(run, from, (r) => {
        d.heading.textContent = "Delete this run?";
        setChildren(what, "The run ", h("strong", { class: "dialog-name" }, r.name || r.id), ` (${r.id}) and all its `,
          `${fmtCount(r.steps)} stored steps will be deleted from the server. This cannot be undone.`);
      });
      d.dialog.querySelector(".dialog-actions .btn").focus(); // Cancel first: the safe choice
    },
  };
})();

// ---- live ------------------------------------------------------------------------------------

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

new LiveSocket(liveUrl(), {
  onMessage: (msg) => { if (msg.type === "run" && msg.run && msg.run.id) upsert(msg.run); },
  onStatus: (s, ms) => {
    renderLiveStatus(liveEl, s, ms);
    if (s === "reconnecting" && state.phase === "ready" && !state.stale) load(); // down? then say so
  },
  onOpen: (reconnected) => { if (reconnected || state.phase !== "ready") load(); },
}).start();

setInterval(() => {
  if (state.phase === "ready" && !document.hidden && state.runs.some((r) => r.status === "running")) load();
}, POLL_MS);

load();
