// Parameter x step heatmaps (GET .../heatmap?metric=M): the gradient buffer status with a
// four-colour legend, and the gradient norm on a log colour scale. Live columns come from
// the `step` message (grad_status, params[metric]) in /params order.

import { api } from "../api.js";
import { h } from "../dom.js";
import { GRAD_STATUS, statusCode, toNumber, toNumbers } from "../format.js";
import { HeatmapChart } from "../charts/heatmap.js";
import { chartCard } from "./card.js";

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
  });
  let rowIndex = [];
  let lastStep = 0;

  return {
    card,
    chart,
    async load(ctx) {
      if (!ctx.state.metrics.params.includes(o.metric) && !(isStatus && ctx.state.metrics.params.includes("grad_norm"))) {
        rowIndex = [];
        await chart.setData([], [], []);
        return;
      }
      const res = await api.heatmap(ctx.state.runId, o.metric);
      const rows = res.params || [];
      const z = (res.z || []).map((r) => (isStatus ? r.map(statusCode) : toNumbers(r)));
      rowIndex = rows.map((name) => ctx.state.paramIndex.get(name));
      const steps = res.step || [];
      lastStep = steps.length ? steps[steps.length - 1] : 0;
      // A bucket's x is its first step: the last bucket may hold steps up to the run's last.
      if (res.downsampled) lastStep = Math.max(lastStep, ctx.state.run.last_step || 0);
      await chart.setData(rows, steps, z);
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
    setXRange: (r) => chart.setXRange(r),
  };
}

function statusLegend() {
  return h("ul", { class: "status-legend", "aria-label": "Colours" },
    GRAD_STATUS.map((s) => h("li", {},
      h("span", { class: `swatch status-${s}`, "aria-hidden": "true" }),
      h("b", {}, s), " ", h("span", { class: "muted" }, STATUS_HELP[s]))));
}
