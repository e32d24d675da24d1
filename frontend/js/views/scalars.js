// A chart of one or more per-step scalars (GET .../series?key=K), live from `step` messages.
// Used for the total gradient norm, the loss, learning rates, memory and other scalars.
// Zoomed to a window of steps (zoom), the window is fetched again: at full resolution when it
// has no more steps than the chart has pixels across (pointsFor).

import { api } from "../api.js";
import { byteUnit, isNonFinite, toNumber, toNumbers } from "../format.js";
import { LineChart } from "../charts/line.js";
import { withSmoothing } from "../smoothing.js";
import { chartCard, toggle } from "./card.js";
import { windowZoom } from "./zoom.js";

export const MAX_POINTS = 2000; // the most points per series asked of the server

/**
 * Points per series to ask for a chart in `el`: one per device pixel of its width (more
 * cannot be seen; the server keeps each bucket's min and max, so no spike is lost), at most
 * MAX_POINTS. A zoomed window with no more steps than this comes at full resolution.
 */
export function pointsFor(el) {
  const px = Math.round((el.clientWidth || 0) * Math.min(2, window.devicePixelRatio || 1));
  return px > 0 ? Math.max(200, Math.min(MAX_POINTS, px)) : MAX_POINTS;
}

/**
 * @param {{id: string, title: string, help?: string, keys: (scalars: string[]) => string[],
 *          label?: (key: string) => string, log?: boolean, bytes?: boolean, emptyText?: string,
 *          wide?: boolean, onXRange: Function, extraTools?: Node[], logWhenSpread?: number}} o
 *   logWhenSpread: draw on a log axis when the largest value is this many times the smallest
 *   (memory: process RSS beside a small model's parameters), until the user sets the toggle.
 */
export function scalarView(o) {
  const label = o.label || ((k) => k);
  const tools = [...(o.extraTools || [])];
  let logChosen = false; // the user set the toggle: it stays as they left it
  const logToggle = toggle("log", Boolean(o.log), (on) => { logChosen = true; chart.setLog(on); }, "Logarithmic y axis");
  tools.push(logToggle);
  const { card, plot } = chartCard({ id: o.id, title: o.title, help: o.help, tools, wide: o.wide });
  const chart = new LineChart(plot, {
    name: o.id, log: Boolean(o.log), emptyText: o.emptyText || "No data yet", onXRange: o.onXRange,
  });
  let keys = [];
  let lastStep = 0;
  let fullRes = true; // every series has every step: a zoom has nothing to fetch
  const zoomer = windowZoom(chart, {
    overviewEnough: () => fullRes || !keys.length,
    fetchDetail: async (ctx, win, signal) => {
      const ask = { start: win[0], end: win[1], maxPoints: pointsFor(plot) };
      const results = await Promise.all(keys.map((k) => api.series(ctx.state.runId, k, ask, { signal })));
      // A window's smoothing needs the steps before it: the server's, always.
      const series = await withSmoothing(results.map((r, i) => seriesOf(r, label(keys[i]))), ctx.state.smooth, false,
        () => Promise.all(keys.map((k) => api.series(ctx.state.runId, k, { ...ask, smooth: ctx.state.smooth }, { signal }))));
      return { start: win[0], end: windowEnd(results, win), series };
    },
  });

  return {
    card,
    chart,
    /** The keys shown, chosen from the run's scalar names. */
    keysFor: (scalars) => o.keys(scalars),
    get keys() { return keys; },

    async load(ctx) {
      zoomer.cancel();
      keys = o.keys(ctx.state.metrics.scalars || []);
      const maxPoints = pointsFor(plot);
      const results = await Promise.all(keys.map((k) => api.series(ctx.state.runId, k, { maxPoints })));
      fullRes = !results.some((r) => r.downsampled);
      chart.opts.smooth = ctx.state.smooth || 0;
      const series = await withSmoothing(results.map((r, i) => seriesOf(r, label(keys[i]))), chart.opts.smooth, fullRes,
        () => Promise.all(keys.map((k) => api.series(ctx.state.runId, k, { maxPoints, smooth: chart.opts.smooth }))));
      lastStep = Math.max(0, ...series.map((s) => (s.x.length ? s.x[s.x.length - 1] : 0)));
      if (o.bytes) {
        let peak = 0;
        for (const s of series) for (const v of s.y) if (v !== null && !isNonFinite(v)) peak = Math.max(peak, Math.abs(v));
        const [unit, size] = byteUnit(peak || 1);
        chart.setScale(size, unit);
        chart.opts.yTitle = unit;
      }
      if (o.logWhenSpread && !logChosen) {
        const log = spread(series) >= o.logWhenSpread;
        chart.opts.log = log;
        logToggle.querySelector("input").checked = log;
      }
      for (const [i, k] of keys.entries()) {
        const ys = series[i].y;
        if (ys.length) ctx.state.latest[k] = ys[ys.length - 1];
      }
      await chart.setSeries(series);
      return series;
    },

    /** Show steps [win[0], win[1]] (zoom.js); null: the overview. */
    zoom: zoomer.zoom,

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
    setXRange: zoomer.setXRange,
  };
}

/** How many times the largest positive finite value of `series` is the smallest (1 when none). */
export function spread(series) {
  let lo = Infinity;
  let hi = 0;
  for (const s of series) {
    for (const v of s.y) {
      if (v === null || !Number.isFinite(v) || v <= 0) continue;
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
  }
  return hi > 0 ? hi / lo : 1;
}

/** A series answer ({step, value, min, max, downsampled}) as a chart series. */
export function seriesOf(r, name) {
  return {
    name,
    x: r.step || [],
    y: toNumbers(r.value),
    min: r.downsampled && r.min ? toNumbers(r.min) : null,
    max: r.downsampled && r.max ? toNumbers(r.max) : null,
  };
}

/**
 * Where a fetched window's data ends: its last step when every step came (live steps after it
 * are the overview's to show), else the window's end as asked (a bucket's x is its first step).
 */
export function windowEnd(results, win) {
  if (results.some((r) => r.downsampled)) return win[1];
  return Math.max(win[0], ...results.map((r) => (r.step && r.step.length ? r.step[r.step.length - 1] : win[0])));
}
