// The comparison page (/compare?runs=ID,ID,...): the same metrics of several runs, overlaid
// (one chart, a line per run) or side by side (a panel per run, every panel of a card on the
// same x and y ranges), aligned by step or by wall time (seconds since each run's first step);
// a table of each run's settings and findings; and any parameter, picked by name, drawn for
// every run that has a parameter of that name. Run status follows /ws/live.
//
// The URL holds the view: ?runs=A,B&x=step|time&layout=overlay|side&scalar=KEY&metric=METRIC
// &param=NAME&param=NAME (x and layout are left out at their defaults, step and overlay).
// Once a view is drawn, body[data-drawn] is "<x>:<layout>" (the browser tests wait on it).

import { api, ApiError, liveUrl, runPageUrl, UnreachableError } from "../api.js";
import { byId, h, notice, setChildren, statusBadge } from "../dom.js";
import { fmtCount, fmtDuration, fmtNum, runDuration, toNumber, toNumbers } from "../format.js";
import { LineChart } from "../charts/line.js";
import { seriesColor } from "../charts/theme.js";
import { LiveSocket, renderLiveStatus } from "../live.js";
import { queryValue, readQuery, writeQuery } from "../url.js";
import { chartCard, toggle } from "../views/card.js";

const MAX_PARAMS = 6;
const X_MODES = { step: "step", time: "wall time" };
const LAYOUTS = { overlay: "overlaid", side: "side by side" };
const FIXED_SCALARS = ["grad_norm_total", "loss", "lr/0"];

const q = readQuery();
const ids = [...new Set((queryValue(q, "runs", "") || "").split(",").map((s) => s.trim()).filter(Boolean))];
const state = {
  ids,
  runs: [],            // RunPublic per id (null when missing)
  metrics: [],         // /metrics per id
  params: [],          // parameter names per id
  groups: [],          // param groups per id (null when unknown)
  findings: [],        // {error, warning, info} per id, from /diagnostics (null when unknown)
  extra: queryValue(q, "scalar"),
  metric: queryValue(q, "metric", "grad_norm"),
  chosen: q.param ? [...new Set(q.param)].slice(0, MAX_PARAMS) : null, // null: the first shared parameter
  x: queryValue(q, "x") === "time" ? "time" : "step",
  layout: queryValue(q, "layout") === "side" ? "side" : "overlay",
  xRange: null,
};

const runsEl = byId("compare-runs");
const controlsEl = byId("compare-controls");
const settingsEl = byId("settings");
const settingsBody = byId("settings-body");
const grid = byId("charts");
const pageNotice = byId("page-notice");
const cards = [];    // every compare card, fixed and per parameter

function onXRange(range) {
  state.xRange = range;
  for (const c of cards) c.setXRange(range);
}

// ---- the x axis: steps, or seconds since the run's first step ------------------------------

function xAxisOpts() {
  return state.x === "time"
    ? { xTitle: "seconds since the run's first step", xHover: "%{x:.3~f} s", xText: (x) => `${fmtNum(x)} s` }
    : { xTitle: "step", xHover: "step %{x}", xText: (x) => `step ${x}` };
}

function xValues(d) {
  if (state.x === "step") return d.step;
  if (!d.time || d.time0 === null) return [];
  return d.time.map((t) => (t === null || !Number.isFinite(t) ? null : Math.round((t - d.time0) * 1000) / 1000));
}

/** [lo, hi] of every drawable value of `series` (lines and downsampling bands), or null. */
function sharedYRange(series, log) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const s of series) {
    for (const arr of [s.y, s.min, s.max]) {
      for (const v of arr || []) {
        if (v === null || !Number.isFinite(v) || (log && v <= 0)) continue;
        if (v < lo) lo = v;
        if (v > hi) hi = v;
      }
    }
  }
  if (!Number.isFinite(lo)) return null;
  if (log) {
    const f = lo === hi ? 1.5 : (hi / lo) ** 0.05;
    return [lo / f, hi * f];
  }
  const pad = lo === hi ? Math.abs(lo) * 0.05 || 1 : (hi - lo) * 0.05;
  return [lo - pad, hi + pad];
}

function sharedXRange(series) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const s of series) {
    for (const x of s.x) {
      if (x === null || !Number.isFinite(x)) continue;
      if (x < lo) lo = x;
      if (x > hi) hi = x;
    }
  }
  if (!Number.isFinite(lo)) return null;
  return lo === hi ? [lo - 1, hi + 1] : [lo, hi];
}

// ---- cards -----------------------------------------------------------------------------------

/**
 * A card comparing one series across the runs: `fetchOne(run)` resolves to a /series-shaped
 * answer ({step, value, min, max, time, time0}) or null when the run has none. Overlaid, it is
 * one chart; side by side, a panel per run, all on the same x and y ranges.
 */
function compareCard(id, title, help, fetchOne, { log = false, tools = [], wide = false, parent = grid } = {}) {
  const logToggle = toggle("log", log, (on) => { entry.log = on; entry.draw(); }, "Logarithmic y axis");
  const { card, plot } = chartCard({ id, title, help, tools: [...tools, logToggle], wide });
  const panelsEl = h("div", { class: "panels", hidden: true });
  plot.after(panelsEl);
  const overlay = new LineChart(plot, { name: id, log, emptyText: "None of these runs has this", onXRange });
  let panels = [];

  function destroyPanels() {
    for (const p of panels) p.chart.destroy();
    panels = [];
    panelsEl.replaceChildren();
  }

  function ensurePanels() {
    if (panels.length === state.runs.length) return;
    destroyPanels();
    panels = state.runs.map((r, i) => {
      const el = h("div", { class: "chart", dataset: { chart: `${id}-${i}`, points: "0", empty: "Loading…" }, role: "img" });
      const titleEl = h("p", { class: "panel-title" });
      panelsEl.appendChild(h("div", { class: "panel", dataset: { run: state.ids[i] } }, titleEl, el));
      const chart = new LineChart(el, {
        name: `${id}-${i}`, log: entry.log, legend: false, onXRange,
        emptyText: r ? "This run has none" : "Run not found",
      });
      return { el, titleEl, chart };
    });
  }

  const entry = {
    card,
    log,
    data: [],   // per run: {step, time, time0, y, min, max} or null

    async load() {
      const results = await Promise.all(state.runs.map((r) => (r ? fetchOne(r).catch(() => null) : null)));
      this.data = results.map((res) => res && {
        step: res.step || [],
        time: res.time ? toNumbers(res.time) : null,
        time0: res.time0 ?? null,
        y: toNumbers(res.value),
        min: res.downsampled && res.min ? toNumbers(res.min) : null,
        max: res.downsampled && res.max ? toNumbers(res.max) : null,
      });
      await this.draw();
    },

    /** One series per run, in run order, so each run keeps its colour (empty when it has none). */
    series() {
      return state.runs.map((r, i) => {
        const d = this.data[i];
        return d ? { name: label(i), x: xValues(d), y: d.y, min: d.min, max: d.max } : { name: label(i), x: [], y: [] };
      });
    },

    async draw() {
      const series = this.series();
      const axis = xAxisOpts();
      if (state.layout === "overlay") {
        destroyPanels();
        panelsEl.hidden = true;
        card.classList.remove("card-auto-wide");
        plot.hidden = false;
        Object.assign(overlay.opts, axis, { log: this.log, yRange: null });
        overlay.xRange = state.xRange;
        await overlay.setSeries(series);
        return;
      }
      plot.hidden = true;
      panelsEl.hidden = false;
      card.classList.add("card-auto-wide"); // the panels of a card side by side in one row
      ensurePanels();
      const yRange = sharedYRange(series, this.log);
      const xRange = state.xRange || sharedXRange(series);
      await Promise.all(panels.map((p, i) => {
        setChildren(p.titleEl, swatch(i), label(i));
        p.el.setAttribute("aria-label", `${title}: ${label(i)}`);
        Object.assign(p.chart.opts, axis, { log: this.log, yRange });
        p.chart.xRange = xRange;
        // The run's own series in its slot, the others empty: the line keeps the run's colour.
        return p.chart.setSeries(series.map((s, j) => (j === i ? s : { name: s.name, x: [], y: [] })));
      }));
    },

    setXRange(range) {
      if (state.layout === "overlay") overlay.setXRange(range);
      else {
        const shared = range || sharedXRange(this.series());
        for (const p of panels) p.chart.setXRange(shared);
      }
    },

    destroy() {
      overlay.destroy();
      destroyPanels();
      card.remove();
      cards.splice(cards.indexOf(entry), 1);
    },
  };
  cards.push(entry);
  parent.appendChild(card);
  return entry;
}

function label(i) {
  const r = state.runs[i];
  if (!r) return state.ids[i];
  const name = r.name || r.id;
  const dup = state.runs.filter((o) => o && (o.name || o.id) === name).length > 1;
  return dup ? `${name} (${r.id})` : name;
}

function swatch(i) {
  return h("span", { class: "swatch", style: `background:${seriesColor(i)}`, "aria-hidden": "true" });
}

const has = (key) => (r, i) => (state.metrics[i] && state.metrics[i].scalars || []).includes(key);
const seriesIf = (key) => (r) => {
  const i = state.runs.indexOf(r);
  return has(key)(r, i) ? api.series(r.id, key, { time: true }) : Promise.resolve(null);
};

const extraSelect = h("select", {
  class: "input input-small", "aria-label": "Scalar to compare",
  onchange: (e) => { state.extra = e.target.value; save(); extraCard.load(); },
});

compareCard("compare-grad-norm-total", "Total gradient norm", "‖grad‖₂ over all parameters", seriesIf("grad_norm_total"), { log: true });
compareCard("compare-loss", "Loss", "As each training script reported it", seriesIf("loss"));
compareCard("compare-lr", "Learning rate", "Parameter group 0", seriesIf("lr/0"));
const extraCard = compareCard("compare-scalar", "Another scalar", "Pick any scalar the runs report",
  (r) => (state.extra ? seriesIf(state.extra)(r) : Promise.resolve(null)), { tools: [extraSelect] });

// ---- parameters, matched by name across the runs -----------------------------------------------

const metricSelect = h("select", {
  class: "input input-small", "aria-label": "Per-parameter metric",
  onchange: (e) => { state.metric = e.target.value; save(); rebuildParamCards(); },
});
const paramInput = h("input", {
  class: "input", type: "search", list: "compare-param-names", placeholder: "Parameter name…",
  "aria-label": "Parameter to show for every run that has it", autocomplete: "off", spellcheck: "false",
});
const paramNames = h("datalist", { id: "compare-param-names" });
const paramChips = h("div", { class: "chips", "aria-label": "Parameters shown" });
const paramMessage = h("span", { class: "picker-error", role: "status" });
const paramCardsEl = h("div", { class: "param-cards" });
const pickerCard = h("section", { class: "card card-wide", dataset: { card: "compare-params" }, "aria-labelledby": "title-compare-params" },
  h("header", { class: "card-head" },
    h("div", { class: "card-titles" }, h("h2", { id: "title-compare-params" }, "Parameters, matched by name"),
      h("p", { class: "card-help" }, `Pick a parameter name: it is drawn for every run that has it (up to ${MAX_PARAMS})`)),
    h("div", { class: "card-tools" }, metricSelect)),
  h("div", { class: "picker" },
    h("form", { class: "picker-form", onsubmit: (e) => { e.preventDefault(); addParam(paramInput.value.trim()); } },
      paramInput, paramNames, h("button", { type: "submit", class: "btn" }, "Show")),
    paramChips, paramMessage));
grid.appendChild(pickerCard);
grid.appendChild(paramCardsEl);

/** Every parameter name of the runs, in the order of the first run that has it. */
function allParamNames() {
  return [...new Set(state.params.filter(Boolean).flat())];
}

function runsWith(name) {
  return state.params.map((names, i) => (names && names.includes(name) ? i : -1)).filter((i) => i >= 0);
}

function addParam(name) {
  paramMessage.textContent = "";
  if (!name) return;
  if (!allParamNames().includes(name)) {
    paramMessage.textContent = `No run has a parameter named “${name}”.`;
    return;
  }
  if (state.chosen.includes(name)) return;
  if (state.chosen.length >= MAX_PARAMS) {
    paramMessage.textContent = `At most ${MAX_PARAMS} parameters at once: remove one first.`;
    return;
  }
  state.chosen.push(name);
  paramInput.value = "";
  save();
  rebuildParamCards();
}

function removeParam(name) {
  state.chosen = state.chosen.filter((n) => n !== name);
  save();
  rebuildParamCards();
  paramInput.focus();
}

function renderParamPicker() {
  const metrics = [...new Set(state.metrics.flatMap((m) => (m ? m.params || [] : [])))].filter((m) => m !== "grad_status").sort();
  if (!metrics.includes(state.metric)) state.metric = metrics.includes("grad_norm") ? "grad_norm" : metrics[0] || null;
  setChildren(metricSelect, metrics.map((m) => h("option", { value: m, selected: m === state.metric }, m)));
  const names = allParamNames();
  setChildren(paramNames, names.map((n) => h("option", { value: n })));
  setChildren(paramChips, state.chosen.map((n) => h("span", { class: "chip", dataset: { param: n } },
    h("span", { class: "chip-name" }, n),
    h("span", { class: "muted" }, `${runsWith(n).length}/${state.runs.length}`),
    h("button", { type: "button", class: "chip-x", "aria-label": `Remove ${n}`, onclick: () => removeParam(n) }, "×"))));
  pickerCard.hidden = !names.length || !metrics.length;
}

const paramCards = [];

function rebuildParamCards() {
  for (const c of paramCards.splice(0)) c.destroy();
  renderParamPicker();
  if (pickerCard.hidden || !state.metric) return Promise.resolve();
  const metric = state.metric;
  state.chosen.forEach((name, k) => {
    const having = runsWith(name);
    const missing = state.runs.map((r, i) => i).filter((i) => !having.includes(i)).map(label);
    const help = missing.length ? `In ${having.length} of ${state.runs.length} runs; not in ${missing.join(", ")}` : `In all ${state.runs.length} runs`;
    const entry = compareCard(`compare-param-${k}`, `${metric} · ${name}`, help, async (r) => {
      const i = state.runs.indexOf(r);
      if (!having.includes(i)) return null;
      const res = await api.paramSeries(r.id, metric, { params: [name], time: true });
      const s = (res.series || [])[0];
      return s ? { step: res.step, value: s.value, min: s.min, max: s.max, downsampled: res.downsampled, time: res.time, time0: res.time0 } : null;
    }, { log: true, wide: state.chosen.length === 1, parent: paramCardsEl });
    entry.card.dataset.param = name;
    paramCards.push(entry);
  });
  return Promise.all(paramCards.map((c) => c.load()));
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
  const focused = document.activeElement && controlsEl.contains(document.activeElement)
    ? [document.activeElement.closest("[data-control]").dataset.control, document.activeElement.dataset.value] : null;
  setChildren(controlsEl,
    segmented("x", "Align by", X_MODES, state.x, (v) => switchView({ x: v })),
    segmented("layout", "Layout", LAYOUTS, state.layout, (v) => switchView({ layout: v })));
  if (focused) {
    const el = controlsEl.querySelector(`[data-control="${focused[0]}"] [data-value="${focused[1]}"]`);
    if (el) el.focus();
  }
}

async function switchView(change) {
  if ((change.x ?? state.x) === state.x && (change.layout ?? state.layout) === state.layout) return;
  Object.assign(state, change);
  state.xRange = null;
  delete document.body.dataset.drawn;
  save();
  renderControls();
  await Promise.all(cards.map((c) => c.draw()));
  document.body.dataset.drawn = `${state.x}:${state.layout}`;
}

function save() {
  writeQuery({
    runs: state.ids.join(","), x: state.x === "step" ? null : state.x, layout: state.layout === "overlay" ? null : state.layout,
    scalar: state.extra, metric: state.metric, param: state.chosen || [],
  });
}

function renderRuns() {
  setChildren(runsEl, h("ul", { class: "compare-list" }, state.ids.map((id, i) => {
    const r = state.runs[i];
    return h("li", { class: "compare-run" },
      swatch(i),
      r ? [h("a", { href: runPageUrl(r.id) }, r.name || r.id), " ", statusBadge(r.status),
        h("span", { class: "muted" }, ` ${r.project || "default"} · ${fmtCount(r.steps)} steps · ${fmtDuration(runDuration(r))}`)]
        : [h("code", {}, id), h("span", { class: "muted" }, " not found")]);
  })));
}

/** "group 0 3e-4" per param group: the learning rate each group started with. */
function learningRates(groups) {
  if (!groups) return "—";
  if (!groups.length) return "none reported";
  const several = groups.some((g) => g.optimizer > 0);
  return groups.map((g) => {
    const name = `${several ? `optimizer ${g.optimizer} · ` : ""}${g.name || `group ${g.index}`}`;
    const lr = g.hparams && "lr" in g.hparams ? g.hparams.lr : undefined;
    const value = typeof lr === "number" || typeof lr === "string" ? fmtNum(toNumber(lr), 3) : "—";
    return h("div", { class: "lr", title: JSON.stringify(g.hparams || {}) }, h("span", { class: "muted" }, `${name} `), value);
  });
}

function findingsCell(counts) {
  if (!counts) return h("td", { dataset: { field: "findings" } }, "—");
  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
  return h("td", { dataset: { field: "findings", errors: counts.error, warnings: counts.warning, info: counts.info } },
    counts.error ? h("span", { class: "fcount fcount-error" }, plural(counts.error, "error")) : null,
    counts.warning ? h("span", { class: "fcount fcount-warning" }, plural(counts.warning, "warning")) : null,
    counts.info ? h("span", { class: "fcount" }, `${counts.info} info`) : null,
    !counts.error && !counts.warning && !counts.info ? h("span", { class: "muted" }, "none") : null);
}

function renderSettings() {
  settingsEl.hidden = !state.runs.length;
  setChildren(settingsBody, h("table", { class: "runs-table settings-table" },
    h("thead", {}, h("tr", {}, ["Run", "Status", "Optimizer", "Learning rate per group", "Parameters", "Steps", "Findings"]
      .map((t, i) => h("th", { scope: "col", class: i === 4 || i === 5 ? "num" : "" }, t)))),
    h("tbody", {}, state.ids.map((id, i) => {
      const r = state.runs[i];
      if (!r) return h("tr", { dataset: { runId: id } }, h("td", {}, swatch(i), " ", h("code", {}, id)), h("td", { colspan: 6, class: "muted" }, "not found"));
      return h("tr", { dataset: { runId: r.id } },
        h("td", { class: "col-name" }, swatch(i), " ", h("a", { href: runPageUrl(r.id), class: "run-link" }, r.name || r.id)),
        h("td", { dataset: { field: "status" } }, statusBadge(r.status)),
        h("td", { dataset: { field: "optimizer" } }, r.optimizer || "—"),
        h("td", { class: "lrs", dataset: { field: "lr" } }, learningRates(state.groups[i])),
        h("td", { class: "num", dataset: { field: "params" } }, `${fmtCount(r.param_count)} tensors`,
          r.param_numel ? h("span", { class: "run-id" }, `${fmtCount(r.param_numel, true)} values`) : null),
        h("td", { class: "num", dataset: { field: "steps" } }, fmtCount(r.steps)),
        findingsCell(state.findings[i]));
    }))));
}

function fillSelects() {
  const scalars = [...new Set(state.metrics.flatMap((m) => (m ? m.scalars || [] : [])))]
    .filter((k) => !FIXED_SCALARS.includes(k)).sort();
  if (!scalars.includes(state.extra)) state.extra = scalars[0] || null;
  setChildren(extraSelect, scalars.map((k) => h("option", { value: k, selected: k === state.extra }, k)));
  extraCard.card.hidden = !scalars.length;

  const names = allParamNames();
  if (state.chosen === null) {
    const lists = state.params.filter(Boolean);
    const common = lists.length ? lists[0].filter((n) => lists.every((l) => l.includes(n))) : [];
    state.chosen = common.length ? [common[0]] : names.slice(0, 1);
  }
  state.chosen = state.chosen.filter((n) => names.includes(n));
}

function countFindings(found) {
  if (!Array.isArray(found)) return null;
  const counts = { error: 0, warning: 0, info: 0 };
  for (const f of found) if (f.severity in counts) counts[f.severity] += 1;
  return counts;
}

async function load() {
  if (state.ids.length === 0) {
    setChildren(pageNotice, notice("empty", "Nothing to compare",
      h("p", {}, "Pick runs on the ", h("a", { href: "/" }, "run list"), " and press Compare.")));
    grid.hidden = true;
    controlsEl.hidden = true;
    document.body.dataset.ready = "1";
    return;
  }
  try {
    const got = await Promise.all(state.ids.map(async (id) => {
      try {
        const [run, metrics, params] = await Promise.all([api.run(id), api.metrics(id), api.params(id)]);
        // The settings table's extras: a failure there leaves a dash, not a broken page.
        const [groups, found] = await Promise.all([
          api.groups(id).then((g) => g.data || []).catch(() => null),
          api.diagnostics(id).catch(() => null),
        ]);
        return [run, metrics, (params.data || []).map((p) => p.name), groups, countFindings(found)];
      } catch (err) {
        if (err instanceof ApiError && err.status === 404) return [null, null, null, null, null];
        throw err;
      }
    }));
    [state.runs, state.metrics, state.params, state.groups, state.findings] = [0, 1, 2, 3, 4].map((k) => got.map((g) => g[k]));
    document.title = `Compare ${state.runs.filter(Boolean).map((r) => r.name || r.id).join(", ")} · gradwatch`;
    delete document.body.dataset.drawn;
    renderRuns();
    renderControls();
    renderSettings();
    fillSelects();
    save();
    await Promise.all([...cards.filter((c) => !c.card.hidden && !paramCards.includes(c)).map((c) => c.load()), rebuildParamCards()]);
    setChildren(pageNotice);
    document.body.dataset.drawn = `${state.x}:${state.layout}`;
  } catch (err) {
    console.error(err);
    setChildren(pageNotice, err instanceof UnreachableError
      ? notice("error", "The gradwatch server is unreachable", h("p", {}, "Start it with ", h("code", {}, "gradwatch serve"), "; this page reconnects by itself."))
      : notice("error", "The runs could not be loaded", h("p", {}, String(err.message || err))));
  }
  document.body.dataset.ready = "1";
}

byId("refresh").addEventListener("click", () => load());

new LiveSocket(liveUrl(), {
  onMessage: (msg) => {
    if (msg.type !== "run" || !msg.run) return;
    const i = state.ids.indexOf(msg.run.id);
    if (i >= 0 && state.runs[i]) {
      state.runs[i] = { ...state.runs[i], ...msg.run };
      renderRuns();
      renderSettings();
    }
  },
  onStatus: (s, ms) => renderLiveStatus(byId("live"), s, ms),
  onOpen: (reconnected) => { if (reconnected) load(); },
}).start();

load();
