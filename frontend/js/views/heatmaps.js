// Parameter x step heatmaps (GET .../heatmap?metric=M): the gradient buffer status with a
// four-colour legend, and the gradient norm on a log colour scale. Rows are grouped by module
// (modules.js). Live columns come from the `step` message (grad_status, params[metric]) in
// /params order. Zoomed to a window of steps (zoom), the window is fetched again, at full
// resolution when it has at most MAX_STEPS steps.

import { api } from "../api.js";
import { h } from "../dom.js";
import { GRAD_STATUS, statusCode, toNumber, toNumbers } from "../format.js";
import { moduleOrder } from "../modules.js";
import { HeatmapChart } from "../charts/heatmap.js";
import { chartCard } from "./card.js";
import { windowZoom } from "./zoom.js";

const MAX_STEPS = 400; // columns asked of the server, for the run and for a zoomed window

const STATUS_HELP = {
  none: ".grad is None",
  zero: "all zeros (zero_grad(set_to_none=False))",
  nonzero: "a gradient",
  nonfinite: "NaN or Inf in the gradient",
};

/**
 * @param {{id: string, title: string, help?: string, metric: string, onXRange: Function}} o
 *   metric "grad_status" draws the status grid; any other metric a log-scale magnitude grid.
 */
export function heatmapView(o) {
  const isStatus = o.metric === "grad_status";
  const legend = isStatus ? statusLegend() : null;
  const { card, plot } = chartCard({ id: o.id, title: o.title, help: o.help, wide: true, legend });
  const chart = new HeatmapChart(plot, {
    name: o.id, kind: isStatus ? "status" : "log", label: o.label || o.metric, onXRange: o.onXRange,
    maxSteps: MAX_STEPS,
  });
  let rowIndex = [];  // row -> index in the live arrays
  let order = [];     // row -> row of the server's answer (its /params order)
  let lastStep = 0;
  let fullRes = true; // the overview has every step: a zoom has nothing to fetch

  /** The server's grid as this chart's columns, rows in module order. */
  const columnsOf = (res) => {
    const z = (res.z || []).map((r) => (isStatus ? r.map(statusCode) : toNumbers(r)));
    return (res.step || []).map((_, j) => order.map((i) => (z[i] ? z[i][j] : null)));
  };
  const zoomer = windowZoom(chart, {
    overviewEnough: () => !order.length || (fullRes && !chart.halved),
    fetchDetail: async (ctx, win, signal) => {
      const res = await api.heatmap(ctx.state.runId, o.metric, { start: win[0], end: win[1], maxSteps: MAX_STEPS }, { signal });
      if ((res.params || []).length !== order.length) return null;
      const steps = res.step || [];
      // The window's end: its last step when every step came, else as asked (a bucket's x is its first step).
      const end = res.downsampled ? win[1] : (steps.length ? steps[steps.length - 1] : win[0]);
      return { start: win[0], end, steps, cols: columnsOf(res) };
    },
  });

  return {
    card,
    chart,
    async load(ctx) {
      zoomer.cancel();
      if (!ctx.state.metrics.params.includes(o.metric) && !(isStatus && ctx.state.metrics.params.includes("grad_norm"))) {
        rowIndex = [];
        order = [];
        await chart.setData([], [], []);
        return;
      }
      const res = await api.heatmap(ctx.state.runId, o.metric, { maxSteps: MAX_STEPS });
      const names = res.params || [];
      order = moduleOrder(names);
      const rows = order.map((i) => names[i]);
      rowIndex = rows.map((name) => ctx.state.paramIndex.get(name));
      const steps = res.step || [];
      lastStep = steps.length ? steps[steps.length - 1] : 0;
      // A bucket's x is its first step: the last bucket may hold steps up to the run's last.
      if (res.downsampled) lastStep = Math.max(lastStep, ctx.state.run.last_step || 0);
      fullRes = !res.downsampled;
      await chart.setColumns(rows, steps, columnsOf(res));
    },

    /** Show steps [win[0], win[1]] (zoom.js); null: the overview. */
    zoom: zoomer.zoom,

    append(msgs) {
      const fresh = msgs.filter((m) => m.step > lastStep);
      if (!fresh.length || !rowIndex.length) return;
      lastStep = fresh[fresh.length - 1].step;
      const cols = [];
      for (const m of fresh) {
        const arr = isStatus ? m.grad_status : m.params && m.params[o.metric];
        if (!Array.isArray(arr)) continue;
        cols.push({
          step: m.step,
          values: rowIndex.map((i) => (i === undefined ? null : isStatus ? statusCode(arr[i]) : toNumber(arr[i]))),
        });
      }
      if (cols.length) chart.appendColumns(cols);
    },

    fail: (err) => chart.fail(err),
    pointsPerSeries: () => 0,
    setXRange: zoomer.setXRange,
  };
}

function statusLegend() {
  return h("ul", { class: "status-legend", "aria-label": "Colours" },
    GRAD_STATUS.map((s) => h("li", {},
      h("span", { class: `swatch status-${s}`, "aria-hidden": "true" }),
      h("b", {}, s), " ", h("span", { class: "muted" }, STATUS_HELP[s]))));
}
