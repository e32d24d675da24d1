// Per-parameter series (GET .../params/series?metric=M): the gradient norms of the chosen
// parameters, with a picker: the top k largest or smallest at the last step (?top=&order=;
// the 5 largest by default), any parameter by name (?param=, repeatable), or every parameter
// of a module (?module=PATH, up to MODULE_MAX of them). The same view, without the picker,
// draws the optimizer-state norms of the same parameters. Live values come from the `step`
// message's arrays, in /params order. Zoomed to a window of steps, the window is fetched
// again (at full resolution when it has no more steps than the chart has pixels across).

import { api } from "../api.js";
import { h, setChildren } from "../dom.js";
import { toNumber, toNumbers } from "../format.js";
import { moduleList, moduleParams } from "../modules.js";
import { LineChart } from "../charts/line.js";
import { withSmoothing } from "../smoothing.js";
import { seriesColor } from "../charts/theme.js";
import { chartCard, toggle } from "./card.js";
import { pointsFor, windowEnd } from "./scalars.js";
import { windowZoom } from "./zoom.js";

export const TOP = 5;
export const MAX_TOP = 50;     // the most parameters a top-k shows
export const MODULE_MAX = 50;  // the most parameters of one module drawn at once
const MATCHES_SHOWN = 8;       // names listed under the picker's box as it is typed

/**
 * The parameters the picker chooses, from the state: {names, missing, module?}; no names means
 * the top k. `missing`: names asked for (?param=) that the run does not have.
 */
export function chosenParams(state) {
  if (state.module) {
    const all = moduleParams(state.params.map((p) => p.name), state.module);
    return { names: all.slice(0, MODULE_MAX), missing: [], module: { path: state.module, count: all.length } };
  }
  const known = state.selected.filter((n) => state.paramIndex.has(n));
  return { names: known, missing: state.selected.filter((n) => !state.paramIndex.has(n)) };
}

/**
 * @param {{id: string, title: string, help?: string, metric: string, picker?: boolean,
 *          log?: boolean, wide?: boolean, onXRange: Function,
 *          onSelect?: (names: string[]) => void, onModule?: (path: string) => void,
 *          onTop?: (k: number, order: "desc"|"asc") => void, rankBy?: string}} o
 *   With `picker`, this view decides which parameters are shown (state.shown); without, it
 *   follows them: it asks for the same choice (the same names, or the same top k ranked by
 *   the picker's metric, `rankBy`) at the same time, and pages/run.js loads it again by name
 *   (load(ctx, names)) if the picker's answer came out different.
 */
export function paramMetricView(o) {
  const tools = [toggle("log", o.log !== false, (on) => chart.setLog(on), "Logarithmic y axis")];
  const picker = o.picker ? paramPicker(o) : null;
  const { card, plot, help } = chartCard({ id: o.id, title: o.title, help: o.help, tools, wide: o.wide, legend: picker && picker.el });
  const chart = new LineChart(plot, {
    name: o.id, log: o.log !== false, emptyText: "No data yet", onXRange: o.onXRange, legend: !o.picker,
  });
  let shown = [];   // [{name, index}]
  let lastStep = 0;
  let fullRes = true; // the overview has every step: a zoom has nothing to fetch
  const zoomer = windowZoom(chart, {
    overviewEnough: () => fullRes || !shown.length,
    fetchDetail: async (ctx, win, signal) => {
      const ask = { params: shown.map((s) => s.name), start: win[0], end: win[1], maxPoints: pointsFor(plot) };
      const res = await api.paramSeries(ctx.state.runId, o.metric, ask, { signal });
      const byParam = new Map((res.series || []).map((s) => [s.param, s]));
      const steps = res.step || [];
      const found = shown.map(({ name }) => {
        const s = byParam.get(name);
        return s ? {
          name, x: steps, y: toNumbers(s.value),
          min: res.downsampled && s.min ? toNumbers(s.min) : null,
          max: res.downsampled && s.max ? toNumbers(s.max) : null,
        } : null;
      });
      // A window's smoothing needs the steps before it: the server's, always.
      const present = found.filter(Boolean);
      const smoothed = await withSmoothing(present, ctx.state.smooth, false,
        () => smoothedOf(ctx, present.map((s) => s.name), { ...ask, smooth: ctx.state.smooth }, signal));
      const series = found.map((s) => (s ? smoothed[present.indexOf(s)] : null));
      return { start: win[0], end: windowEnd([res], win), series };
    },
  });

  /** The server's smoothed series of `names` (one {step, value} each, in that order). */
  async function smoothedOf(ctx, names, ask, signal = undefined) {
    const res = await api.paramSeries(ctx.state.runId, o.metric, { ...ask, params: names }, { signal });
    const byParam = new Map((res.series || []).map((s) => [s.param, s]));
    return names.map((n) => (byParam.has(n) ? { step: res.step || [], value: byParam.get(n).value } : null));
  }

  return {
    card,
    chart,
    metric: o.metric,

    /** The parameters drawn, by name. */
    params: () => shown.map((s) => s.name),

    async load(ctx, names = null) {
      zoomer.cancel();
      const { state } = ctx;
      const chosen = names ? { names, missing: [] } : chosenParams(state);
      const byName = chosen.names;
      if (!state.metrics.params.includes(o.metric) || (names && !names.length)) {
        shown = [];
        if (o.picker) {
          state.shown = [];
          picker.render(state);
        }
        await chart.setSeries([]);
        return;
      }
      const top = Math.max(1, Math.min(MAX_TOP, state.top || TOP));
      const order = state.order === "asc" ? "asc" : "desc";
      const maxPoints = pointsFor(plot);
      const rankBy = !o.picker && o.rankBy && state.metrics.params.includes(o.rankBy) ? o.rankBy : undefined;
      const res = await api.paramSeries(state.runId, o.metric, byName.length
        ? { params: byName, maxPoints } : { top, order, rankBy, maxPoints });
      fullRes = !res.downsampled;
      const list = res.series || [];
      shown = list.map((s) => ({ name: s.param, index: s.index ?? state.paramIndex.get(s.param) }));
      const steps = res.step || [];
      const series = list.map((s) => ({
        name: s.param,
        x: steps,
        y: toNumbers(s.value),
        min: res.downsampled && s.min ? toNumbers(s.min) : null,
        max: res.downsampled && s.max ? toNumbers(s.max) : null,
      }));
      lastStep = steps.length ? steps[steps.length - 1] : 0;
      chart.opts.smooth = state.smooth || 0;
      const drawn = await withSmoothing(series, chart.opts.smooth, fullRes,
        () => smoothedOf(ctx, series.map((s) => s.name), { maxPoints, smooth: chart.opts.smooth }));
      if (o.picker) {
        state.shown = shown.map((s) => s.name);
        picker.render(state, chosen.missing, chosen.module && !chosen.module.count ? `No module ${state.module} in this run` : "");
        const m = chosen.module;
        help.textContent = m && m.count
          ? `${o.help} · module ${m.path}: ${m.count} parameter${m.count === 1 ? "" : "s"}${m.count > shown.length ? `, the first ${shown.length} shown` : ""}`
          : byName.length
            ? `${o.help} · ${shown.length} chosen parameter${shown.length === 1 ? "" : "s"}`
            : `${o.help} · the ${top} ${order === "asc" ? "smallest" : "largest"} at the last step`;
      }
      await chart.setSeries(drawn);
    },

    /** Show steps [win[0], win[1]] of the same parameters (zoom.js); null: the overview. */
    zoom: zoomer.zoom,

    append(msgs) {
      const fresh = msgs.filter((m) => m.step > lastStep);
      if (!fresh.length || !shown.length) return;
      lastStep = fresh[fresh.length - 1].step;
      const pts = shown.map(({ index }) => fresh
        .filter((m) => m.params && Array.isArray(m.params[o.metric]))
        .map((m) => [m.step, index === undefined ? null : toNumber(m.params[o.metric][index])]));
      chart.append(pts);
    },

    fail: (err) => chart.fail(err),
    pointsPerSeries: () => Math.max(0, ...chart.series.map((s) => s.x.length)),
    setXRange: zoomer.setXRange,
  };
}

/**
 * The run's parameter names that contain `text`, case-insensitively: the exact name first,
 * then those that start with it, then the rest, each in the run's order. Empty text: none.
 */
export function matchParams(names, text) {
  const t = text.trim().toLowerCase();
  if (!t) return [];
  const rank = (n) => {
    const l = n.toLowerCase();
    return l === t ? 0 : l.startsWith(t) ? 1 : 2;
  };
  return names.map((n, i) => [n, i]).filter(([n]) => n.toLowerCase().includes(t))
    .sort((a, b) => rank(a[0]) - rank(b[0]) || a[1] - b[1]).map(([n]) => n);
}

/**
 * Chips for the shown parameters; a box to add one by part of its name (the matches listed as
 * it is typed; Enter takes the first); a list of the run's modules to show one whole; the top
 * k largest or smallest.
 */
function paramPicker({ onSelect, onModule, onTop }) {
  const chips = h("div", { class: "chips", role: "list", "aria-label": "Parameters shown" });
  const error = h("span", { class: "picker-error", role: "status", "aria-live": "polite" });
  const input = h("input", {
    type: "search", class: "input", placeholder: "Add a parameter by name…", role: "combobox",
    "aria-label": "Add a parameter by name", autocomplete: "off", spellcheck: "false",
    "aria-controls": "param-matches", "aria-expanded": "false", "aria-autocomplete": "list",
  });
  const matchList = h("ul", { id: "param-matches", class: "picker-matches", role: "listbox", "aria-label": "Matching parameters", hidden: true });
  let state = null;
  const names = () => (state ? state.params.map((p) => p.name) : []);
  const add = (name) => {
    error.textContent = "";
    input.value = "";
    showMatches([]);
    if (!state.shown.includes(name)) onSelect([...state.shown, name]);
  };
  const showMatches = (matches) => {
    setChildren(matchList, matches.slice(0, MATCHES_SHOWN).map((name) => h("li", { role: "option" },
      h("button", { type: "button", class: "picker-match", dataset: { param: name }, onclick: () => add(name) }, name))),
    matches.length > MATCHES_SHOWN ? h("li", { class: "muted picker-more" }, `and ${matches.length - MATCHES_SHOWN} more: type more of the name`) : null);
    matchList.hidden = !matches.length;
    input.setAttribute("aria-expanded", String(!matchList.hidden));
  };
  input.addEventListener("input", () => {
    error.textContent = "";
    showMatches(matchParams(names(), input.value));
  });
  input.addEventListener("keydown", (e) => { if (e.key === "Escape") showMatches([]); });
  const form = h("form", {
    class: "picker-form", role: "search",
    onsubmit: (e) => {
      e.preventDefault();
      const text = input.value.trim();
      if (!text || !state) return;
      const matches = matchParams(names(), text);
      if (!matches.length) {
        showMatches([]);
        error.textContent = `No parameter matches “${text}”`;
        return;
      }
      add(matches[0]);
    },
  }, h("span", { class: "picker-box" }, input, matchList), h("button", { type: "submit", class: "btn" }, "Add"));

  const moduleSelect = h("select", {
    class: "input input-small", "aria-label": "Show every parameter of a module", dataset: { role: "module" },
    onchange: (e) => { if (e.target.value) onModule(e.target.value); },
  });
  let modulesOf = null; // the params list the options were made from
  const fillModules = (s) => {
    if (modulesOf === s.params) return;
    modulesOf = s.params;
    const names = s.params.map((p) => p.name);
    setChildren(moduleSelect, h("option", { value: "" }, "Whole module…"),
      moduleList(names).map((m) => h("option", { value: m.path },
        `${"\u00a0\u00a0".repeat(m.depth - 1)}${m.path} (${m.count})`)));
  };

  const topK = h("input", {
    type: "number", class: "input input-small input-k", min: 1, max: MAX_TOP, value: TOP, "aria-label": "How many parameters",
  });
  const topOrder = h("select", { class: "input input-small", "aria-label": "Largest or smallest" },
    h("option", { value: "desc" }, "largest"), h("option", { value: "asc" }, "smallest"));
  const topForm = h("form", {
    class: "picker-form picker-top",
    onsubmit: (e) => {
      e.preventDefault();
      const k = Math.round(Number(topK.value));
      if (!(k >= 1 && k <= MAX_TOP)) {
        error.textContent = `Top k: a number from 1 to ${MAX_TOP}`;
        return;
      }
      error.textContent = "";
      onTop(k, topOrder.value === "asc" ? "asc" : "desc");
    },
  }, h("span", { class: "muted" }, "Top"), topK, topOrder, h("button", { type: "submit", class: "btn" }, "Show"));
  topOrder.addEventListener("change", () => topForm.requestSubmit());

  const el = h("div", { class: "picker" }, chips, form, moduleSelect, topForm, error);

  return {
    el,
    render(s, missing = [], problem = "") {
      state = s;
      fillModules(s);
      moduleSelect.value = s.module && moduleSelect.querySelector(`option[value="${CSS.escape(s.module)}"]`) ? s.module : "";
      topK.value = String(s.top || TOP);
      topOrder.value = s.order === "asc" ? "asc" : "desc";
      error.textContent = problem || (missing.length ? `Not in this run: ${missing.join(", ")}` : "");
      setChildren(chips, s.shown.map((name, i) => h("span", { class: "chip", role: "listitem" },
        h("span", { class: "swatch", style: `background:${seriesColor(i)}`, "aria-hidden": "true" }),
        h("span", { class: "chip-name" }, name),
        h("button", {
          type: "button", class: "chip-x", "aria-label": `Remove ${name}`, title: `Remove ${name}`,
          onclick: () => onSelect(s.shown.filter((n) => n !== name)),
        }, "×"))));
    },
  };
}
