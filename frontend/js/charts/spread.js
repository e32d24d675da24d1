// The spread of a per-parameter metric across the parameters at each step (GET .../params/spread):
// the median as a line, the interquartile range as a darker band and min..max as a light one, so
// the shape of the whole network's gradients shows at a glance. Steps where some parameters had
// NaN/Inf (left out of the statistics) are red markers along the top. Live steps are summarised
// here from the `step` message's arrays, the same way the server does (spreadOf).

import { isNonFinite, plotlyText } from "../format.js";
import { Chart } from "./base.js";
import { attachCrosshair } from "./crosshair.js";
import { markerLayout, markMarkers, sameMarkers } from "./markers.js";
import { Pacer } from "./pacer.js";
import { withAlpha } from "./line-figure.js";
import { baseConfig, baseLayout, MARGIN, plotly, registerChart, seriesColor, theme } from "./theme.js";

export const STATS = ["min", "q25", "median", "q75", "max"];

/** numpy's default quantile (linear interpolation) of sorted finite values. */
export function quantile(sorted, q) {
  const pos = (sorted.length - 1) * q;
  const lo = Math.floor(pos);
  const hi = Math.ceil(pos);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}

/** One step's point from every parameter's value (numbers, NaN, ±Infinity or null for ABSENT). */
export function spreadOf(values) {
  const finite = values.filter((v) => v !== null && Number.isFinite(v)).sort((a, b) => a - b);
  const nonfinite = values.filter((v) => v !== null && isNonFinite(v)).length;
  const point = { params: finite.length, nonfinite };
  for (const [i, q] of [0, 0.25, 0.5, 0.75, 1].entries()) point[STATS[i]] = finite.length ? quantile(finite, q) : null;
  return point;
}

/** An API answer ({step, params, nonfinite, min, ...}) as columns of numbers (null where none). */
export function columnsOf(answer) {
  const num = (v) => (v === null || v === undefined ? null : Number(v));
  const out = { step: (answer.step || []).slice(), params: (answer.params || []).slice(), nonfinite: (answer.nonfinite || []).slice() };
  for (const k of STATS) out[k] = (answer[k] || []).map(num);
  return out;
}

/** The traces: min..max band, q25..q75 band, the median line, and the NaN/Inf markers. */
export function spreadTraces(data, { log }, t) {
  const color = seriesColor(0, t);
  const y = (v) => (v === null || (log && v <= 0) ? null : v);
  const band = (lo, hi, alpha, name) => [
    { type: "scatter", mode: "lines", x: data.step, y: data[lo].map(y), line: { width: 0, color }, hoverinfo: "skip", showlegend: false },
    { type: "scatter", mode: "lines", x: data.step, y: data[hi].map(y), line: { width: 0, color }, fill: "tonexty",
      fillcolor: withAlpha(color, alpha), name, hoverinfo: "skip", showlegend: false },
  ];
  const text = data.step.map((s, j) => `step ${s}: median <b>${fmt(data.median[j])}</b><br>quartiles ${fmt(data.q25[j])} – ${fmt(data.q75[j])}`
    + `<br>min ${fmt(data.min[j])} · max ${fmt(data.max[j])}<br>${data.params[j]} parameters${data.nonfinite[j] ? `, ${data.nonfinite[j]} NaN/Inf left out` : ""}`);
  const traces = [...band("min", "max", 0.14, "min – max"), ...band("q25", "q75", 0.34, "quartiles"),
    { type: "scatter", mode: data.step.length < 60 ? "lines+markers" : "lines", name: "median", x: data.step,
      y: data.median.map(y), line: { width: 1.8, color }, marker: { size: 4 }, text, hovertemplate: "%{text}<extra></extra>" }];
  const bad = data.step.map((s, j) => [s, data.nonfinite[j]]).filter(([, n]) => n > 0);
  if (bad.length) {
    traces.push({ type: "scatter", mode: "markers", name: "NaN / Inf", yaxis: "y2", x: bad.map(([s]) => s), y: bad.map(() => 0.97),
      text: bad.map(([s, n]) => `step ${s}: ${n} parameter${n === 1 ? "" : "s"} NaN/Inf`), hovertemplate: "%{text}<extra></extra>",
      marker: { color: t.nonfinite, size: 10, symbol: "x" }, cliponaxis: false });
  }
  return traces;
}

const fmt = (v) => (v === null ? "—" : plotlyText(Number(v).toPrecision(4)));

export class SpreadChart extends Chart {
  /** @param {HTMLElement} el @param {{name: string, log?: boolean, onXRange?: Function, emptyText?: string}} opts */
  constructor(el, opts) {
    super(el);
    this.opts = { log: true, emptyText: "No data yet", ...opts };
    this.data = columnsOf({});
    this.markers = [];
    this.pacer = new Pacer(el, () => this.draw());
    this.unregister = registerChart(this);
  }

  /** The overview (a REST answer's columns). */
  setData(data) {
    this.data = data;
    this.detail = null;
    return this.draw();
  }

  /** The drawn columns: the overview, with the zoomed window's detail (same columns) in its place. */
  view() {
    const d = this.detail;
    if (!d) return this.data;
    const keep = this.data.step.map((s) => s < d.start || s > d.end);
    const at = this.data.step.findIndex((s) => s > d.end);
    const out = {};
    for (const k of Object.keys(this.data)) {
      const before = this.data[k].filter((_, j) => keep[j] && this.data.step[j] < d.start);
      const after = at < 0 ? [] : this.data[k].slice(at);
      out[k] = [...before, ...d.data[k], ...after];
    }
    return out;
  }

  /** Live points ({step, ...spreadOf}), drawn when the pacer lets it. */
  append(points) {
    for (const p of points) for (const k of Object.keys(this.data)) this.data[k].push(k === "step" ? p.step : p[k]);
    if (points.length) this.pacer.request();
  }

  setLog(log) {
    this.opts.log = log;
    return this.draw();
  }

  setMarkers(markers) {
    if (sameMarkers(markers, this.markers)) return Promise.resolve();
    this.markers = markers.slice();
    return this.drawn ? this.draw() : Promise.resolve();
  }

  render() {
    this.stale = false;
    const t = theme();
    const data = this.view();
    const empty = !data.step.length;
    const layout = baseLayout({
      xaxis: { ...(this.xRange ? { range: this.xRange.slice(), autorange: false } : { autorange: true }), visible: !empty },
      yaxis: { type: this.opts.log ? "log" : "linear", visible: !empty, exponentformat: "power" },
      yaxis2: { overlaying: "y", range: [0, 1], visible: false, fixedrange: true },
      showlegend: false,
      margin: { ...MARGIN },
      uirevision: this.opts.name,
      ...markerLayout(empty ? [] : this.markers, t),
    }, t);
    const first = !this.drawn;
    this.drawn = true;
    return plotly().react(this.el, spreadTraces(data, this.opts, t), layout, baseConfig(this.opts.name)).then(() => {
      if (first) this.listen();
      this.el.dataset.points = String(data.step.length);
      this.el.dataset.nonfinite = String(data.nonfinite.filter((n) => n > 0).length);
      markMarkers(this.el, empty ? [] : this.markers);
      if (empty) this.el.dataset.empty = this.opts.emptyText;
      else delete this.el.dataset.empty;
      this.markDrawn(!empty);
    });
  }

  listen() {
    attachCrosshair(this.el, "step");
    this.el.on("plotly_relayout", (ev) => {
      if (this.syncing || !this.opts.onXRange) return;
      if (ev["xaxis.autorange"]) this.opts.onXRange((this.xRange = null));
      else if (ev["xaxis.range[0]"] !== undefined) this.opts.onXRange((this.xRange = [ev["xaxis.range[0]"], ev["xaxis.range[1]"]]));
    });
  }
}
