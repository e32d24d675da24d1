// Parameter x step heatmaps (GET .../heatmap?metric=M): the gradient buffer status with a
// four-colour legend, and the gradient norm on a log colour scale. Rows are grouped by module
// (modules.js). Cells come as float32 (grid.js). Live columns come from the `step` message
// (grad_status, params[metric]) in /params order. Zoomed to a window of steps (zoom), the window
// is fetched again, at full resolution when it has no more steps than columns are asked for.

import { api } from "../api.js";
import { h } from "../dom.js";
import { GRAD_STATUS } from "../format.js";
import { gridCells, gridColumns, liveColumn } from "../grid.js";
import { moduleOrder } from "../modules.js";
import { HeatmapChart } from "../charts/heatmap.js";
import { chartCard } from "./card.js";
import { windowZoom } from "./zoom.js";

// The most columns asked of the server, for the run and for a zoomed window. Fewer when the
// chart has fewer pixels across: a column narrower than a pixel cannot be seen. More would
// not pay: over a long run the server answers up to about this many from its per-block
// summaries, and reads every stored step beyond (docs/api.md, "Long windows").
const MAX_STEPS = 400;
const PLOT_MARGINS_PX = 130; // the y labels and the colour bar, roughly: what is left is the plot

/** Columns to ask for a heatmap in `el`: one per pixel of its plot across, at most MAX_STEPS. */
function stepsFor(el) {
  const px = (el.clientWidth || 0) - PLOT_MARGINS_PX;
  return px > 0 ? Math.max(50, Math.min(MAX_STEPS, px)) : MAX_STEPS;
}

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
  const columnsOf = (res) => gridColumns(gridCells(res, isStatus), (res.step || []).length, order);
  const zoomer = windowZoom(chart, {
    overviewEnough: () => !order.length || (fullRes && !chart.halved),
    fetchDetail: async (ctx, win, signal) => {
      const res = await api.heatmap(ctx.state.runId, o.metric, { start: win[0], end: win[1], maxSteps: stepsFor(plot) }, { signal });
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
        await chart.setColumns([], [], []);
        return;
      }
      const res = await api.heatmap(ctx.state.runId, o.metric, { maxSteps: stepsFor(plot) });
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
        if (Array.isArray(arr)) cols.push({ step: m.step, values: liveColumn(arr, rowIndex, isStatus) });
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
