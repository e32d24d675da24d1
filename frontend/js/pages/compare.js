// The comparison page (/compare?runs=ID,ID,...): the same metrics of several runs, overlaid
// or side by side, aligned by step or by wall time (views/compare-card.js); a table of each
// run's settings and findings (views/compare-settings.js); and any parameter, picked by name,
// drawn for every run that has a parameter of that name (views/compare-params.js). Run status
// follows /ws/live. compare.html calls init().
//
// The URL holds the view: ?runs=A,B&x=step|time&layout=overlay|side&scalar=KEY&metric=METRIC
// &param=NAME&param=NAME (x and layout are left out at their defaults, step and overlay).
// Once a view is drawn, body[data-drawn] is "<x>:<layout>" (the browser tests wait on it).

import { api, ApiError, liveUrl, runPageUrl, UnreachableError } from "../api.js";
import { byId, h, notice, setChildren, statusBadge } from "../dom.js";
import { shareXRange, startIt, unreachableNotice } from "../page.js";
import { fmtCount, fmtDuration, runDuration } from "../format.js";
import { sharedGroups } from "../groups.js";
import { isUserScalar, mostShared } from "../names.js";
import { LiveSocket, renderLiveStatus } from "../live.js";
import { smoothWeight } from "../smoothing.js";
import { queryValue, readQuery, writeQuery } from "../url.js";
import { compareCard, swatch } from "../views/compare-card.js";
import { compareParamPicker } from "../views/compare-params.js";
import { countFindings, settingsTable } from "../views/compare-settings.js";
import { smoothingControl } from "../views/smoothing-control.js";
import { zoomNote } from "../views/zoom-note.js";

const MAX_PARAMS = 6;
const X_MODES = { step: "step", time: "wall time" };
const LAYOUTS = { overlay: "overlaid", side: "side by side" };
export const FIXED_SCALARS = ["grad_norm_total", "loss"];
const isLr = (k) => /^lr\/\d+$/.test(k);

/** Each run's label: its name, with its id when another run of the comparison has the same name. */
export function runLabel(runs, ids, i) {
  const r = runs[i];
  if (!r) return ids[i];
  const name = r.name || r.id;
  const dup = runs.filter((o) => o && (o.name || o.id) === name).length > 1;
  return dup ? `${name} (${r.id})` : name;
}

/**
 * What the page holds between events; only this module writes it. The cards read it too
 * (views/compare-card.js: its state, each run's label, the shared zoom, the list of cards).
 */
const page = {
  state: null,
  el: null,          // the page's elements
  cards: [],         // every compare card, fixed and per parameter
  paramCards: [],
  lrCards: [],       // one per param group, matched by name across the runs
  extraCard: null,
  picker: null,
  extraSelect: null,
  note: null,        // the zoom, said in the top bar
  label: (i) => label(i),
  onXRange: (range) => onXRange(range),
};

/** Read the URL, lay out the cards, load the runs and follow /ws/live. */
export function init() {
  const q = readQuery();
  page.state = {
    ids: [...new Set((queryValue(q, "runs", "") || "").split(",").map((s) => s.trim()).filter(Boolean))],
    runs: [],            // RunPublic per id (null when missing)
    metrics: [],         // /metrics per id
    params: [],          // parameter names per id
    groups: [],          // param groups per id (null when unknown)
    findings: [],        // {error, warning, info} per id, from /diagnostics (null when unknown)
    deleted: [],         // per id: true when the server says the run was deleted
    extra: queryValue(q, "scalar"),
    metric: queryValue(q, "metric", "grad_norm"),
    chosen: q.param ? [...new Set(q.param)].slice(0, MAX_PARAMS) : null, // null: the first shared parameter
    x: queryValue(q, "x") === "time" ? "time" : "step",
    layout: queryValue(q, "layout") === "side" ? "side" : "overlay",
    xRange: null,
    smooth: smoothWeight(queryValue(q, "smooth")), // the charts' EMA weight (?smooth=), 0: off
  };
  page.el = {
    runs: byId("compare-runs"), controls: byId("compare-controls"), settings: byId("settings"),
    settingsBody: byId("settings-body"), grid: byId("charts"), notice: byId("page-notice"),
  };
  page.note = zoomNote(() => onXRange(null));

  page.extraSelect = h("select", {
    class: "input input-small", "aria-label": "Scalar to compare",
    onchange: (e) => { page.state.extra = e.target.value; save(); page.extraCard.load(); },
  });
  const card = (id, title, help, fetchOne, opts = {}) => compareCard(page, id, title, help, fetchOne, { parent: page.el.grid, ...opts });
  card("compare-grad-norm-total", "Total gradient norm", "‖grad‖₂ over all parameters", seriesIf("grad_norm_total"), { log: true });
  card("compare-loss", "Loss", "As each training script reported it", seriesIf("loss"));
  page.extraCard = card("compare-scalar", "Another scalar", "Pick any scalar the runs report",
    (r, extra) => (page.state.extra ? seriesIf(page.state.extra)(r, extra) : Promise.resolve(null)), { tools: [page.extraSelect] });

  page.picker = compareParamPicker({
    maxParams: MAX_PARAMS,
    onMetric: (m) => { page.state.metric = m; save(); rebuildParamCards(); },
    onAdd: addParam,
    onRemove: removeParam,
  });
  page.el.paramCards = h("div", { class: "param-cards" });
  page.el.grid.appendChild(page.picker.card);
  page.el.grid.appendChild(page.el.paramCards);

  byId("refresh").addEventListener("click", () => load());

  new LiveSocket(liveUrl(), {
    onMessage: (msg) => {
      if (msg.type !== "run" || !msg.run) return;
      const i = page.state.ids.indexOf(msg.run.id);
      if (i >= 0 && page.state.runs[i]) {
        page.state.runs[i] = { ...page.state.runs[i], ...msg.run };
        renderRuns();
        renderSettings();
      }
    },
    onStatus: (s, ms) => renderLiveStatus(byId("live"), s, ms),
    onOpen: (reconnected) => { if (reconnected) load(); },
  }).start();

  load();
}

/**
 * A learning-rate card per param group (groups.js matches them across the runs by name), placed
 * before `before`; the first keeps the id compare-lr.
 */
function rebuildLrCards(before) {
  for (const c of page.lrCards.splice(0)) c.destroy();
  const shared = sharedGroups(page.state.runs.map((r, i) => (r ? page.state.groups[i] : [])));
  shared.forEach(({ label: name, at }, k) => {
    const entry = compareCard(page, k ? `compare-lr-${k}` : "compare-lr", shared.length > 1 ? `Learning rate · ${name}` : "Learning rate",
      `Param group ${name}`, (r) => {
        const i = page.state.runs.indexOf(r);
        return at[i] >= 0 ? seriesIf(`lr/${at[i]}`)(r) : Promise.resolve(null);
      }, { parent: page.el.grid, before });
    entry.card.dataset.group = name;
    page.lrCards.push(entry);
  });
}

function onXRange(range) {
  shareXRange(page.state, page.note, page.cards, range, page.state.x === "time" ? "seconds" : "steps");
}

function label(i) {
  return runLabel(page.state.runs, page.state.ids, i);
}

const has = (key) => (r, i) => (page.state.metrics[i] && page.state.metrics[i].scalars || []).includes(key);
const seriesIf = (key) => (r, { smooth } = {}) => {
  const i = page.state.runs.indexOf(r);
  return has(key)(r, i) ? api.series(r.id, key, { time: true, smooth }) : Promise.resolve(null);
};

// ---- parameters, matched by name across the runs -----------------------------------------------

/** Every parameter name of the runs, in the order of the first run that has it. */
function allParamNames() {
  return [...new Set(page.state.params.filter(Boolean).flat())];
}

function runsWith(name) {
  return page.state.params.map((names, i) => (names && names.includes(name) ? i : -1)).filter((i) => i >= 0);
}

function addParam(name) {
  page.picker.say("");
  if (!name) return;
  if (!allParamNames().includes(name)) {
    page.picker.say(`No run has a parameter named “${name}”.`);
    return;
  }
  if (page.state.chosen.includes(name)) return;
  if (page.state.chosen.length >= MAX_PARAMS) {
    page.picker.say(`At most ${MAX_PARAMS} parameters at once: remove one first.`);
    return;
  }
  page.state.chosen.push(name);
  page.picker.input.value = "";
  save();
  rebuildParamCards();
}

function removeParam(name) {
  page.state.chosen = page.state.chosen.filter((n) => n !== name);
  save();
  rebuildParamCards();
  page.picker.input.focus();
}

function renderParamPicker() {
  const metrics = [...new Set(page.state.metrics.flatMap((m) => (m ? m.params || [] : [])))].filter((m) => m !== "grad_status").sort();
  if (!metrics.includes(page.state.metric)) page.state.metric = metrics.includes("grad_norm") ? "grad_norm" : metrics[0] || null;
  page.picker.render({
    metrics, metric: page.state.metric, names: allParamNames(), chosen: page.state.chosen,
    having: (n) => runsWith(n).length, runs: page.state.runs.length,
  });
}

function rebuildParamCards() {
  for (const c of page.paramCards.splice(0)) c.destroy();
  renderParamPicker();
  if (page.picker.card.hidden || !page.state.metric) return Promise.resolve();
  const metric = page.state.metric;
  page.state.chosen.forEach((name, k) => {
    const having = runsWith(name);
    const missing = page.state.runs.map((r, i) => i).filter((i) => !having.includes(i)).map(label);
    const help = missing.length ? `In ${having.length} of ${page.state.runs.length} runs; not in ${missing.join(", ")}` : `In all ${page.state.runs.length} runs`;
    const entry = compareCard(page, `compare-param-${k}`, `${metric} · ${name}`, help, async (r, { smooth } = {}) => {
      const i = page.state.runs.indexOf(r);
      if (!having.includes(i)) return null;
      const res = await api.paramSeries(r.id, metric, { params: [name], time: true, smooth });
      const s = (res.series || [])[0];
      return s ? { step: res.step, value: s.value, min: s.min, max: s.max, downsampled: res.downsampled, time: res.time, time0: res.time0 } : null;
    }, { log: true, wide: page.state.chosen.length === 1, parent: page.el.paramCards });
    entry.card.dataset.param = name;
    page.paramCards.push(entry);
  });
  return Promise.all(page.paramCards.map((c) => c.load()));
}

// ---- view switches, runs, settings ------------------------------------------------------------

function segmented(key, title, options, current, onPick) {
  return h("div", { class: "segmented", role: "group", "aria-label": title, dataset: { control: key } },
    h("span", { class: "seg-label" }, title),
    Object.entries(options).map(([value, text]) => h("button", {
      type: "button", "aria-pressed": String(value === current), dataset: { value }, onclick: () => onPick(value),
    }, text)));
}

function renderControls() {
  const controls = page.el.controls;
  const focused = document.activeElement && controls.contains(document.activeElement)
    ? [document.activeElement.closest("[data-control]").dataset.control, document.activeElement.dataset.value] : null;
  setChildren(controls,
    segmented("x", "Align by", X_MODES, page.state.x, (v) => switchView({ x: v })),
    segmented("layout", "Layout", LAYOUTS, page.state.layout, (v) => switchView({ layout: v })),
    smoothingControl(page.state.smooth, (w) => {
      page.state.smooth = w;
      save();
      Promise.all(page.cards.map((c) => c.load())).catch((err) => console.warn("gradwatch: smoothing:", err));
    }));
  if (focused) {
    const target = controls.querySelector(`[data-control="${focused[0]}"] [data-value="${focused[1]}"]`);
    if (target) target.focus();
  }
}

async function switchView(change) {
  if ((change.x ?? page.state.x) === page.state.x && (change.layout ?? page.state.layout) === page.state.layout) return;
  Object.assign(page.state, change);
  page.state.xRange = null;
  page.note.render(null);
  delete document.body.dataset.drawn;
  save();
  renderControls();
  await Promise.all(page.cards.map((c) => c.draw()));
  document.body.dataset.drawn = `${page.state.x}:${page.state.layout}`;
}

function save() {
  writeQuery({
    runs: page.state.ids.join(","), x: page.state.x === "step" ? null : page.state.x, layout: page.state.layout === "overlay" ? null : page.state.layout,
    scalar: page.state.extra, metric: page.state.metric, param: page.state.chosen || [], smooth: page.state.smooth || null,
  });
}

function renderRuns() {
  setChildren(page.el.runs, h("ul", { class: "compare-list" }, page.state.ids.map((id, i) => {
    const r = page.state.runs[i];
    return h("li", { class: "compare-run" },
      swatch(i),
      r ? [h("a", { href: runPageUrl(r.id) }, r.name || r.id), " ", statusBadge(r.status),
        h("span", { class: "muted" }, ` ${r.project || "default"} · ${fmtCount(r.steps)} steps · ${fmtDuration(runDuration(r))}`)]
        : [h("code", {}, id), h("span", { class: "muted" }, page.state.deleted[i] ? " was deleted" : " not found")]);
  })));
}

function renderSettings() {
  page.el.settings.hidden = !page.state.runs.length;
  setChildren(page.el.settingsBody, settingsTable(page.state));
}

/**
 * The scalar and parameter shown first: what every compared run has (else what most have), a
 * user's scalar before the hook's; a choice from the URL stays.
 */
function fillSelects() {
  const extra = (m) => (m ? (m.scalars || []).filter((k) => !FIXED_SCALARS.includes(k) && !isLr(k)).sort() : null);
  const perRun = page.state.metrics.map(extra);
  const scalars = [...new Set(perRun.filter(Boolean).flat())].sort();
  if (!scalars.includes(page.state.extra)) page.state.extra = mostShared(perRun, isUserScalar);
  setChildren(page.extraSelect, scalars.map((k) => h("option", { value: k, selected: k === page.state.extra }, k)));
  page.extraCard.card.hidden = !scalars.length;

  const names = allParamNames();
  if (page.state.chosen === null) {
    const first = mostShared(page.state.params);
    page.state.chosen = first === null ? [] : [first];
  }
  page.state.chosen = page.state.chosen.filter((n) => names.includes(n));
}

async function load() {
  if (page.state.ids.length === 0) {
    setChildren(page.el.notice, notice("empty", "Nothing to compare",
      h("p", {}, "Pick runs on the ", h("a", { href: "/" }, "run list"), " and press Compare.")));
    page.el.grid.hidden = true;
    page.el.controls.hidden = true;
    document.body.dataset.ready = "1";
    return;
  }
  try {
    const got = await Promise.all(page.state.ids.map(async (id) => {
      try {
        const [run, metrics, params] = await Promise.all([api.run(id), api.metrics(id), api.params(id)]);
        // The settings table's extras: a failure there leaves a dash, not a broken page.
        const [groups, found] = await Promise.all([
          api.groups(id).then((g) => g.data || []).catch(() => null),
          api.diagnostics(id).catch(() => null),
        ]);
        return [run, metrics, (params.data || []).map((p) => p.name), groups, countFindings(found)];
      } catch (err) {
        if (err instanceof ApiError && err.status === 404) return [null, null, null, null, null, err.body && err.body.run === "deleted"];
        throw err;
      }
    }));
    [page.state.runs, page.state.metrics, page.state.params, page.state.groups, page.state.findings, page.state.deleted] = [0, 1, 2, 3, 4, 5].map((k) => got.map((g) => g[k]));
    document.title = `Compare ${page.state.runs.filter(Boolean).map((r) => r.name || r.id).join(", ")} · gradwatch`;
    delete document.body.dataset.drawn;
    renderRuns();
    renderControls();
    renderSettings();
    rebuildLrCards(page.extraCard.card);
    fillSelects();
    save();
    await Promise.all([...page.cards.filter((c) => !c.card.hidden && !page.paramCards.includes(c)).map((c) => c.load()), rebuildParamCards()]);
    setChildren(page.el.notice);
    document.body.dataset.drawn = `${page.state.x}:${page.state.layout}`;
  } catch (err) {
    console.error(err);
    setChildren(page.el.notice, err instanceof UnreachableError
      ? unreachableNotice(...startIt(), "; this page reconnects by itself.")
      : notice("error", "The runs could not be loaded", h("p", {}, String(err.message || err))));
  }
  document.body.dataset.ready = "1";
}
