// What a line chart draws, as pure functions of its series and options: the Plotly traces
// (lines, downsampling bands, NaN/Inf and log-zero markers), the legend's entries and the layout.
// charts/line.js hands the result to Plotly; nothing here touches the DOM or Plotly, so each
// piece can be checked on its own (tests/frontend/).

import { isNonFinite, nonFiniteLabel, plotlyText } from "../format.js";
import { markerLayout } from "./markers.js";

const TOP = 0.97;    // where non-finite markers sit, in the marker axis (0..1 of the plot)
const BOTTOM = 0.03; // -Inf, and zeros on a log axis
const STAGGER = 0.035;
export const MARKERS_UP_TO = 60; // a series with fewer points shows each as a marker
export const RAW_OPACITY = 0.3;  // a smoothed series' raw line, faint behind the smoothed one
export const NONFINITE_KEY = "nonfinite"; // legend keys of the marker traces; a series' key is "s:" + its name
export const ZERO_KEY = "zero";
export const seriesKey = (name) => `s:${name}`;

/**
 * @typedef {{name: string, x: number[], y: (number|null)[], min?: (number|null)[]|null,
 *            max?: (number|null)[]|null, smooth?: (number|null)[]|null}} Series
 *   y holds numbers from format.toNumber: finite, NaN, ±Infinity, or null (ABSENT: a gap).
 *   smooth, when the chart is smoothed (smoothing.js), is the smoothed y at the same x: drawn as
 *   the series' line, the raw y faint behind it.
 * @typedef {{log: boolean, scale: number, unit: string, legend?: boolean, name: string,
 *            xTitle: string, xHover: string, xText: (x: number) => string, yTitle?: string,
 *            yRange?: number[]|null, emptyText?: string}} LineOpts
 * @typedef {{fg: string, muted: string, card: string, nonfinite: string, zero: string,
 *            palette: string[], severity: Object<string, string>}} Theme  (charts/theme.js)
 */

const colorOf = (i, t) => t.palette[i % t.palette.length];

/**
 * The series as drawn: the overview's points outside the detail's window, the detail's inside.
 * `detail` is {start, end, series}: series[i], {x, y, min?, max?}, stands for series[i]
 * within steps [start, end]; null: the overview alone (copied).
 * @param {Series[]} series
 */
export function mergeDetail(series, detail) {
  const copy = (s) => ({ name: s.name, x: s.x.slice(), y: s.y.slice(), min: s.min ? s.min.slice() : null,
    max: s.max ? s.max.slice() : null, smooth: s.smooth ? s.smooth.slice() : null });
  if (!detail) return series.map(copy);
  return series.map((s, i) => {
    const w = detail.series[i];
    if (!w) return copy(s);
    let a = 0;
    while (a < s.x.length && s.x[a] < detail.start) a++;
    let b = a;
    while (b < s.x.length && s.x[b] <= detail.end) b++;
    const band = (key) => {
      if (!s[key] && !w[key]) return null;
      return [...(s[key] || s.y).slice(0, a), ...(w[key] || w.y), ...(s[key] || s.y).slice(b)];
    };
    return {
      name: s.name,
      x: [...s.x.slice(0, a), ...w.x, ...s.x.slice(b)],
      y: [...s.y.slice(0, a), ...w.y, ...s.y.slice(b)],
      min: band("min"),
      max: band("max"),
      smooth: s.smooth && w.smooth ? [...s.smooth.slice(0, a), ...w.smooth, ...s.smooth.slice(b)] : null,
    };
  });
}

/** A value as drawn on the line: non-finite values and log-axis zeros become gaps; scaled. */
export function plotValue(y, { log, scale }) {
  if (y === null || isNonFinite(y)) return null;
  if (log && y <= 0) return null;
  return y / scale;
}

/**
 * Add point (x, y) of series `i` (named `name`) to the NaN/Inf markers `nf` or the log-zero
 * markers `zero` ({x, y, text} lists) when it is one; finite values on the line add nothing.
 */
export function markerPoint(i, name, x, y, opts, nf, zero) {
  const label = plotlyText(name);
  const unit = opts.unit ? ` ${opts.unit}` : "";
  if (isNonFinite(y)) {
    nf.x.push(x);
    nf.y.push(y === -Infinity ? BOTTOM + i * STAGGER : TOP - i * STAGGER);
    nf.text.push(`<b>${nonFiniteLabel(y)}</b> · ${label}<br>${plotlyText(opts.xText(x))}`);
  } else if (opts.log && y !== null && y <= 0) {
    zero.x.push(x);
    zero.y.push(BOTTOM + i * STAGGER);
    zero.text.push(`${y}${unit} · ${label}<br>${plotlyText(opts.xText(x))} (not drawable on a log axis)`);
  }
}

/** How many points of `view` are NaN/Inf (in the line or its band), and zeros on a log axis. */
export function markerCounts(view, log) {
  let nonfinite = 0;
  let zero = 0;
  for (const s of view) {
    for (let j = 0; j < s.y.length; j++) {
      const vals = [s.y[j], s.min ? s.min[j] : null, s.max ? s.max[j] : null];
      if (vals.some(isNonFinite)) nonfinite++;
      else if (log && s.y[j] !== null && s.y[j] <= 0) zero++;
    }
  }
  return { nonfinite, zero };
}

/**
 * Every trace of `view`: per series its band (two traces, when downsampled), then the lines,
 * then the NaN/Inf and zero markers. `hidden`: legend keys hidden by the user. A series with
 * `smooth` has its raw line faint (RAW_OPACITY) and the smoothed line over it, after all lines.
 * @returns {{traces: object[], idx: {line: number[], band: number[], smooth: number[], nonfinite: number,
 *            zero: number, markers: boolean}}}
 *   idx: where each series' traces are, for live extendTraces (smooth[i]: -1 when not smoothed).
 */
export function lineTraces(view, opts, t, hidden = new Set()) {
  const traces = [];
  const idx = { line: [], band: [], smooth: [], nonfinite: -1, zero: -1, markers: false };
  const unit = opts.unit ? ` ${plotlyText(opts.unit)}` : "";
  const nf = { x: [], y: [], text: [] };
  const zero = { x: [], y: [], text: [] };
  const single = view.length === 1;
  const y = (v) => plotValue(v, opts);

  view.forEach((s, i) => {
    const color = colorOf(i, t);
    idx.band[i] = -1;
    if (s.min && s.max && s.min.some((v, j) => v !== s.y[j])) {
      idx.band[i] = traces.length;
      const band = (vals, fill) => ({
        type: "scatter", mode: "lines", x: s.x.slice(), y: vals.map(y),
        line: { width: 0, color }, fill, fillcolor: withAlpha(color, 0.16), hoverinfo: "skip",
        showlegend: false, connectgaps: false, text: s.x.map(() => ""), visible: !hidden.has(seriesKey(s.name)),
      });
      traces.push(band(s.min, "none"), band(s.max, "tonexty"));
    }
    s.x.forEach((x, j) => {
      const worst = [s.y[j], s.min ? s.min[j] : null, s.max ? s.max[j] : null].find(isNonFinite);
      markerPoint(i, s.name, x, worst === undefined ? s.y[j] : worst, opts, nf, zero);
    });
  });
  view.forEach((s, i) => {
    idx.line[i] = traces.length;
    if (s.x.length < MARKERS_UP_TO) idx.markers = true;
    const name = plotlyText(s.name);
    const raw = s.smooth ? " (raw)" : "";
    traces.push({
      type: "scatter", mode: s.x.length < MARKERS_UP_TO ? "lines+markers" : "lines",
      name, x: s.x.slice(), y: s.y.map(y), text: s.x.map(() => ""),
      line: { width: s.smooth ? 1.2 : 1.8, color: colorOf(i, t) }, marker: { size: 4 }, showlegend: opts.legend !== false,
      opacity: s.smooth ? RAW_OPACITY : 1,
      hovertemplate: `${single ? "" : `${name}<br>`}${opts.xHover}${raw}: <b>%{y:.4~g}${unit}</b><extra></extra>`,
      visible: !hidden.has(seriesKey(s.name)),
    });
  });
  view.forEach((s, i) => {
    idx.smooth[i] = -1;
    if (!s.smooth) return;
    idx.smooth[i] = traces.length;
    const name = plotlyText(s.name);
    traces.push({
      type: "scatter", mode: "lines", name: `${name} (smoothed)`, x: s.x.slice(), y: s.smooth.map(y),
      text: s.x.map(() => ""), line: { width: 2, color: colorOf(i, t) }, showlegend: false, connectgaps: true,
      hovertemplate: `${single ? "" : `${name}<br>`}${opts.xHover} smoothed: <b>%{y:.4~g}${unit}</b><extra></extra>`,
      visible: !hidden.has(seriesKey(s.name)),
    });
  });
  if (nf.x.length) {
    idx.nonfinite = traces.length;
    traces.push({
      type: "scatter", mode: "markers", name: "NaN / Inf", yaxis: "y2", ...nf,
      marker: { color: t.nonfinite, size: 10, symbol: "x", line: { width: 1, color: t.nonfinite } },
      hovertemplate: "%{text}<extra></extra>", cliponaxis: false, visible: !hidden.has(NONFINITE_KEY),
    });
  }
  if (zero.x.length) {
    idx.zero = traces.length;
    traces.push({
      type: "scatter", mode: "markers", name: "zero", yaxis: "y2", ...zero,
      marker: { color: t.zero, size: 7, symbol: "line-ew-open", line: { width: 2, color: t.zero } },
      hovertemplate: "%{text}<extra></extra>", cliponaxis: false, visible: !hidden.has(ZERO_KEY),
    });
  }
  return { traces, idx };
}

/**
 * The legend's entries for the traces of `idx`: each series (unless opts.legend is false),
 * then the NaN/Inf and zero markers; none when that is a single series.
 */
export function legendEntries(view, idx, opts, t) {
  const entries = opts.legend === false ? [] : view.map((s, i) => ({ key: seriesKey(s.name), name: s.name, color: colorOf(i, t) }));
  if (idx.nonfinite >= 0) entries.push({ key: NONFINITE_KEY, name: "NaN / Inf", color: t.nonfinite, kind: "nonfinite" });
  if (idx.zero >= 0) entries.push({ key: ZERO_KEY, name: "zero", color: t.zero, kind: "zero" });
  return entries.length > (opts.legend === false ? 0 : 1) ? entries : [];
}

/** [lo, hi] of the drawable values of `view` (lines and bands; > 0 on a log axis) with x within `xRange` (all: null), or null. */
export function valueRange(view, log, xRange = null) {
  const [x0, x1] = xRange ? [Math.min(xRange[0], xRange[1]), Math.max(xRange[0], xRange[1])] : [-Infinity, Infinity];
  let lo = Infinity;
  let hi = -Infinity;
  for (const s of view) {
    for (const arr of [s.y, s.min, s.max]) {
      if (!arr) continue;
      for (let j = 0; j < arr.length; j++) {
        const v = arr[j];
        if (s.x[j] < x0 || s.x[j] > x1 || v === null || isNonFinite(v) || (log && v <= 0)) continue;
        if (v < lo) lo = v;
        if (v > hi) hi = v;
      }
    }
  }
  return Number.isFinite(lo) ? [lo, hi] : null;
}

/**
 * Ticks that stay readable: on a log axis spanning a few decades, plain numbers rather than
 * Plotly's small digits (Plotly's own within one decade, powers of ten past three).
 */
export function yAxisTicks(view, opts) {
  if (!opts.log) return {};
  const found = valueRange(view.map((s) => ({ ...s, min: null, max: null })), true);
  if (!found) return {};
  let [lo, hi] = found;
  const fixed = opts.yRange;
  if (fixed && fixed[0] > 0 && fixed[0] < fixed[1]) [lo, hi] = fixed; // ticks for what is shown
  const decades = Math.log10(hi / lo);
  if (decades < 0.8) return { tickformat: "~g" };
  return decades <= 3 ? { tickformat: "~g", dtick: "D2" } : {};
}

/**
 * The y axis's range, in Plotly's units (log10 on a log axis): opts.yRange when fixed (panels
 * side by side share it); else, zoomed to `xRange`, what the window's values span (lines and
 * bands), padded, so that a zoom shows the values it holds and not the whole run's; else
 * Plotly's autorange, but for a flat series on a linear axis, which gets a range around its value.
 */
export function yAxisRange(view, opts, xRange = null) {
  const fixed = fixedYRange(opts);
  if (fixed.range) return fixed;
  const found = xRange ? valueRange(view, opts.log, xRange) : valueRange(view.map((s) => ({ ...s, min: null, max: null })), opts.log);
  if (!found) return { autorange: true };
  const [lo, hi] = [found[0] / opts.scale, found[1] / opts.scale];
  if (opts.log) {
    if (!xRange) return { autorange: true };
    const [a, b] = [Math.log10(lo), Math.log10(hi)];
    const pad = b > a ? (b - a) * 0.05 : 0.1;
    return { range: [a - pad, b + pad], autorange: false };
  }
  if (!xRange && hi !== lo) return { autorange: true };
  const pad = hi > lo ? (hi - lo) * 0.05 : Math.abs(lo) * 0.05 || 1 / opts.scale;
  return { range: [lo - pad, hi + pad], autorange: false };
}

/** The y axis range of opts.yRange, in Plotly's units (log10 on a log axis); {} when none. */
export function fixedYRange(opts) {
  const r = opts.yRange;
  if (!r || !(r[0] < r[1]) || (opts.log && !(r[0] > 0))) return {};
  const [lo, hi] = [r[0] / opts.scale, r[1] / opts.scale];
  return { range: opts.log ? [Math.log10(lo), Math.log10(hi)] : [lo, hi], autorange: false };
}

/**
 * The layout's own part (charts/theme.js's baseLayout fills in the rest): the x axis (the
 * shared zoom `xRange`, or autorange), the y axis (log or linear, ticks, a fixed range), the
 * markers' axis, the finding markers and the top margin `top` (room for the HTML legend).
 */
export function lineLayout(view, { opts, xRange, markers, top, margin }, t) {
  const empty = !view.some((s) => s.x.length);
  return {
    xaxis: {
      ...(xRange ? { range: xRange.slice(), autorange: false } : { autorange: true }), visible: !empty,
      title: { text: plotlyText(opts.xTitle), font: { color: t.muted, size: 11 } },
    },
    yaxis: {
      visible: !empty,
      type: opts.log ? "log" : "linear",
      title: opts.yTitle ? { text: plotlyText(opts.yTitle), font: { color: t.muted, size: 11 } } : undefined,
      exponentformat: "power",
      ...yAxisTicks(view, opts),
      ...yAxisRange(view, opts, xRange),
    },
    yaxis2: { overlaying: "y", range: [0, 1], visible: false, fixedrange: true },
    showlegend: false,
    margin: { ...margin, t: top },
    uirevision: opts.name,
    ...markerLayout(empty ? [] : markers, t),
  };
}

/** "#rrggbb" or "rgb(r, g, b)" with an alpha. */
export function withAlpha(color, alpha) {
  const c = color.trim();
  if (/^#[0-9a-f]{6}$/i.test(c)) {
    const n = parseInt(c.slice(1), 16);
    return `rgba(${n >> 16}, ${(n >> 8) & 255}, ${n & 255}, ${alpha})`;
  }
  const m = c.match(/^rgba?\(([^)]+)\)$/);
  if (m) {
    const [r, g, b] = m[1].split(",").map((v) => v.trim());
    return `rgba(${r}, ${g}, ${b}, ${alpha})`;
  }
  return c;
}
