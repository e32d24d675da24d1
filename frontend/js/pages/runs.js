// The run list (/): every run with its status kept live from /ws/live `run` events, a
// filter (text, project, status) kept in the URL, and a selection to compare runs.

import { api, compareUrl, liveUrl, runPageUrl, UnreachableError } from "../api.js";
import { byId, h, notice, setChildren, statusBadge } from "../dom.js";
import { fmtAgo, fmtCount, fmtDuration, fmtTime, runDuration } from "../format.js";
import { LiveSocket, renderLiveStatus } from "../live.js";
import { queryValue, readQuery, writeQuery } from "../url.js";

const PAGE = 500;
const DEFAULT_SERVER = "http://127.0.0.1:8765"; // where the hook sends unless told otherwise
const POLL_MS = 5000; // while a run is running: refresh steps and durations

const q = readQuery();
const state = {
  runs: [],          // RunPublic, newest first
  count: 0,          // all runs on the server
  phase: "loading",  // loading | ready | unreachable | error
  stale: false,      // ready, but the last refresh failed: the list may be out of date
  error: "",
  text: queryValue(q, "q", ""),
  project: queryValue(q, "project", ""),
  status: queryValue(q, "status", ""),
  selected: new Set(),
};

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
  writeQuery({ q: state.text.trim(), project: state.project, status: state.status });
  render();
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
  return state.runs.filter((r) =>
    (!state.project || (r.project || "") === state.project)
    && (!state.status || r.status === state.status)
    && (!text || [r.name, r.project, r.id, r.optimizer].some((v) => String(v || "").toLowerCase().includes(text))));
}

function render() {
  document.body.dataset.state = state.phase;
  setChildren(bannerEl, state.stale ? notice("error", "The gradwatch server is unreachable",
    h("p", {}, "Showing the runs as they were; this page reconnects by itself.")) : null);
  toolbarEl.hidden = state.phase === "ready" && !state.runs.length;
  renderProjects();
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
  const focused = document.activeElement && document.activeElement.closest && document.activeElement.closest("tr[data-run-id]");
  const refocus = focused ? [focused.dataset.runId, document.activeElement.tagName] : null;
  setChildren(listEl, h("div", { class: "table-wrap" }, h("table", { class: "runs-table" },
    h("thead", {}, h("tr", {},
      h("th", { class: "col-check" }, h("span", { class: "sr-only" }, "Compare")),
      ["Run", "Project", "Status", "Steps", "Started", "Duration", "Parameters", "Optimizer"].map((t, i) =>
        h("th", { scope: "col", class: i === 3 || i === 6 ? "num" : "" }, t)))),
    h("tbody", {}, rows.map(row)))), more);
  if (refocus) {
    const tr = [...listEl.querySelectorAll("tr[data-run-id]")].find((el) => el.dataset.runId === refocus[0]);
    const target = tr && tr.querySelector(refocus[1] === "INPUT" ? "input" : "a");
    if (target) target.focus();
  }
}

function row(r) {
  const name = r.name || r.id;
  return h("tr", { dataset: { runId: r.id, status: r.status } },
    h("td", { class: "col-check" }, h("input", {
      type: "checkbox", checked: state.selected.has(r.id), "aria-label": `Select ${name} to compare`,
      onchange: (e) => { if (e.target.checked) state.selected.add(r.id); else state.selected.delete(r.id); render(); },
    })),
    h("td", { class: "col-name" }, h("a", { href: runPageUrl(r.id), class: "run-link" }, name),
      name !== r.id ? h("span", { class: "run-id" }, r.id) : null),
    h("td", {}, r.project || "—"),
    h("td", {}, statusBadge(r.status)),
    h("td", { class: "num" }, fmtCount(r.steps)),
    h("td", { title: fmtTime(r.created_at) }, fmtAgo(r.created_at)),
    h("td", {}, fmtDuration(runDuration(r))),
    h("td", { class: "num", title: r.param_numel ? `${fmtCount(r.param_numel)} values` : null },
      r.param_numel ? fmtCount(r.param_numel, true) : "—",
      r.param_count != null ? h("span", { class: "run-id" }, `${fmtCount(r.param_count)} tensors`) : null),
    h("td", {}, r.optimizer || "—"));
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
  state.text = state.project = state.status = "";
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
