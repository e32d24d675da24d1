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
  let zoomSeq = 0;    // answers to an older zoom (or one before a reload) are dropped
  let abort = null;

  /** The server's grid as this chart's columns, rows in module order. */
  const columnsOf = (res) => {
    const z = (res.z || []).map((r) => (isStatus ? r.map(statusCode) : toNumbers(r)));
    return (res.step || []).map((_, j) => order.map((i) => (z[i] ? z[i][j] : null)));
  };
  const cancel = () => {
    zoomSeq += 1;
    if (abort) abort.abort();
    abort = null;
  };
  let held = false;   // the chart took the zoom without drawing it: zoom() draws it
  /** Whether zoom(ctx, window of `range`) will draw: it has a window to fetch, or one to drop. */
  const willFetch = (range) => (range ? Boolean(order.length && !(fullRes && !chart.halved)) : Boolean(chart.detail));

  return {
    card,
    chart,
    async load(ctx) {
      cancel();
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

    /**
     * Show steps [win[0], win[1]] at the resolution the server gives for the window alone;
     * null: the overview. Resolves once drawn, or at once when a newer zoom or load took over,
     * or when the chart is out of view (then the window is fetched when it comes into view).
     */
    async zoom(ctx, win) {
      cancel();
      const seq = zoomSeq;
      if (!win || !order.length || (fullRes && !chart.halved)) {
        if (chart.detail) await chart.setDetail(null);
        else if (held) chart.setXRange(chart.xRange);
        held = false;
        return;
      }
      if (!chart.pacer.visible) {
        // Out of view: fetch the window once the chart is scrolled to, unless a newer zoom came.
        chart.pacer.whenVisible(() => {
          if (seq === zoomSeq) this.zoom(ctx, win).catch((err) => console.warn("gradwatch: zoom:", err));
        });
        return;
      }
      abort = new AbortController();
      let res;
      try {
        res = await api.heatmap(ctx.state.runId, o.metric, { start: win[0], end: win[1], maxSteps: MAX_STEPS },
          { signal: abort.signal });
      } catch (err) {
        if (err && err.name === "AbortError") return;
        chart.setXRange(chart.xRange); // the window could not come: the zoom, on the overview
        throw err;
      }
      if (seq !== zoomSeq || (res.params || []).length !== order.length) return;
      const steps = res.step || [];
      // The window's end: its last step when every step came, else as asked (a bucket's x is its first step).
      const end = res.downsampled ? win[1] : (steps.length ? steps[steps.length - 1] : win[0]);
      await chart.setDetail({ start: win[0], end, steps, cols: columnsOf(res) });
    },

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
    /** The shared zoom: drawn by zoom() when it will fetch the window (or drop one), else now. */
    setXRange: (r) => {
      held = willFetch(r);
      if (held) chart.holdXRange(r);
      else chart.setXRange(r);
    },
  };
}

function statusLegend() {
  return h("ul", { class: "status-legend", "aria-label": "Colours" },
    GRAD_STATUS.map((s) => h("li", {},
      h("span", { class: `swatch status-${s}`, "aria-hidden": "true" }),
      h("b", {}, s), " ", h("span", { class: "muted" }, STATUS_HELP[s]))));
}
