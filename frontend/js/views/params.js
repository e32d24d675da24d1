// Per-parameter series (GET .../params/series?metric=M): the gradient norms of the chosen
// parameters (the top 5 by default, or those in ?param=), with a picker to add any parameter
// by name; the same view, without the picker, draws the optimizer-state norms of the same
// parameters. Live values come from the `step` message's arrays, in /params order.

import { api } from "../api.js";
import { h, setChildren } from "../dom.js";
import { toNumber, toNumbers } from "../format.js";
import { LineChart } from "../charts/line.js";
import { seriesColor } from "../charts/theme.js";
import { chartCard, toggle } from "./card.js";

export const TOP = 5;

/**
 * @param {{id: string, title: string, help?: string, metric: string, picker?: boolean,
 *          log?: boolean, wide?: boolean, onXRange: Function,
 *          onSelect?: (names: string[]) => void}} o
 *   With `picker`, this view decides which parameters are shown (state.shown); without,
 *   it follows them.
 */
export function paramMetricView(o) {
  const tools = [toggle("log", o.log !== false, (on) => chart.setLog(on), "Logarithmic y axis")];
  const picker = o.picker ? paramPicker(o.onSelect) : null;
  const { card, plot, help } = chartCard({ id: o.id, title: o.title, help: o.help, tools, wide: o.wide, legend: picker && picker.el });
  const chart = new LineChart(plot, {
    name: o.id, log: o.log !== false, emptyText: "No data yet", onXRange: o.onXRange, legend: !o.picker,
  });
  let shown = [];   // [{name, index}]
  let lastStep = 0;

  return {
    card,
    chart,
    metric: o.metric,

    async load(ctx) {
      const { state } = ctx;
      const byName = o.picker && state.selected.length ? state.selected : (o.picker ? [] : state.shown);
      if ((!o.picker && !byName.length) || !state.metrics.params.includes(o.metric)) {
        shown = [];
        if (o.picker) {
          state.shown = [];
          picker.render(state);
        }
        await chart.setSeries([]);
        return;
      }
      const res = await api.paramSeries(state.runId, o.metric, byName.length ? { params: byName } : { top: TOP });
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
      if (o.picker) {
        state.shown = shown.map((s) => s.name);
        const missing = byName.filter((n) => !state.shown.includes(n));
        picker.render(state, missing);
        help.textContent = state.selected.length
          ? `${o.help} · ${shown.length} chosen parameter${shown.length === 1 ? "" : "s"}`
          : `${o.help} · the ${TOP} largest at the last step`;
      }
      await chart.setSeries(series);
    },

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
    setXRange: (r) => chart.setXRange(r),
  };
}

/** Chips for the shown parameters, a search box (with a datalist of every name) to add one. */
function paramPicker(onSelect) {
  const chips = h("div", { class: "chips", role: "list", "aria-label": "Parameters shown" });
  const error = h("span", { class: "picker-error", role: "status", "aria-live": "polite" });
  const input = h("input", {
    type: "search", class: "input", list: "param-names", placeholder: "Add a parameter by name…",
    "aria-label": "Add a parameter by name", autocomplete: "off", spellcheck: "false",
  });
  let state = null;
  const form = h("form", {
    class: "picker-form", role: "search",
    onsubmit: (e) => {
      e.preventDefault();
      const name = input.value.trim();
      if (!name || !state) return;
      if (!state.paramIndex.has(name)) {
        const matches = [...state.paramIndex.keys()].filter((n) => n.includes(name));
        if (matches.length !== 1) {
          error.textContent = matches.length ? `${matches.length} parameters match; pick one from the list` : `No parameter named "${name}"`;
          return;
        }
        input.value = matches[0];
        return form.requestSubmit();
      }
      error.textContent = "";
      input.value = "";
      if (!state.shown.includes(name)) onSelect([...state.shown, name]);
    },
  }, input, h("button", { type: "submit", class: "btn" }, "Add"));
  const reset = h("button", { type: "button", class: "btn btn-quiet", onclick: () => onSelect([]) }, `Top ${TOP}`);
  const el = h("div", { class: "picker" }, chips, form, reset, error);

  return {
    el,
    render(s, missing = []) {
      state = s;
      reset.hidden = !s.selected.length;
      error.textContent = missing.length ? `Not in this run: ${missing.join(", ")}` : "";
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
