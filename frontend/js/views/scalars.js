// A chart of one or more per-step scalars (GET .../series?key=K), live from `step` messages.
// Used for the total gradient norm, the loss, learning rates, memory and other scalars.

import { api } from "../api.js";
import { byteUnit, isNonFinite, toNumber, toNumbers } from "../format.js";
import { LineChart } from "../charts/line.js";
import { chartCard, toggle } from "./card.js";

/**
 * @param {{id: string, title: string, help?: string, keys: (scalars: string[]) => string[],
 *          label?: (key: string) => string, log?: boolean, bytes?: boolean, emptyText?: string,
 *          wide?: boolean, onXRange: Function, extraTools?: Node[]}} o
 */
export function scalarView(o) {
  const label = o.label || ((k) => k);
  const tools = [...(o.extraTools || [])];
  tools.push(toggle("log", Boolean(o.log), (on) => chart.setLog(on), "Logarithmic y axis"));
  const { card, plot } = chartCard({ id: o.id, title: o.title, help: o.help, tools, wide: o.wide });
  const chart = new LineChart(plot, {
    name: o.id, log: Boolean(o.log), emptyText: o.emptyText || "No data yet", onXRange: o.onXRange,
  });
  let keys = [];
  let lastStep = 0;

  return {
    card,
    chart,
    /** The keys shown, chosen from the run's scalar names. */
    keysFor: (scalars) => o.keys(scalars),
    get keys() { return keys; },

    async load(ctx) {
      keys = o.keys(ctx.state.metrics.scalars || []);
      const results = await Promise.all(keys.map((k) => api.series(ctx.state.runId, k)));
      const series = results.map((r, i) => ({
        name: label(keys[i]),
        x: r.step || [],
        y: toNumbers(r.value),
        min: r.downsampled && r.min ? toNumbers(r.min) : null,
        max: r.downsampled && r.max ? toNumbers(r.max) : null,
      }));
      lastStep = Math.max(0, ...series.map((s) => (s.x.length ? s.x[s.x.length - 1] : 0)));
      if (o.bytes) {
        let peak = 0;
        for (const s of series) for (const v of s.y) if (v !== null && !isNonFinite(v)) peak = Math.max(peak, Math.abs(v));
        const [unit, size] = byteUnit(peak || 1);
        chart.setScale(size, unit);
        chart.opts.yTitle = unit;
      }
      for (const [i, k] of keys.entries()) {
        const ys = series[i].y;
        if (ys.length) ctx.state.latest[k] = ys[ys.length - 1];
      }
      await chart.setSeries(series);
      return series;
    },

    /** Live: add the steps of `msgs` this chart does not have yet. */
    append(msgs) {
      const fresh = msgs.filter((m) => m.step > lastStep);
      if (!fresh.length || !keys.length) return;
      lastStep = fresh[fresh.length - 1].step;
      const pts = keys.map((k) => fresh
        .filter((m) => m.scalars && k in m.scalars)
        .map((m) => [m.step, toNumber(m.scalars[k])]));
      chart.append(pts);
    },

    fail: (err) => chart.fail(err),
    pointsPerSeries: () => Math.max(0, ...chart.series.map((s) => s.x.length)),
    setXRange: (r) => chart.setXRange(r),
  };
}
