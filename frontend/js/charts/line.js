// A line chart of one or more series over steps that never drops a value silently:
// NaN and ±Inf are drawn as red markers along the top (-Inf along the bottom) with hover
// text naming them, and on a log axis exact zeros are drawn as grey markers along the
// bottom. Live points are added with Plotly.extendTraces; the series are kept here too so
// that switching the axis or the theme redraws without asking the server again.
// A zoomed chart draws its window from `detail` (the window's points fetched at full
// resolution) and the overview's points around it, so panning never shows a hole.
// The legend is HTML over the top of the chart (legend.js), so that each draw is one pass.

import { isNonFinite, nonFiniteLabel, plotlyText } from "../format.js";
import { markerLayout, markMarkers, sameMarkers } from "./markers.js";
import { Chart, noteLive } from "./base.js";
import { attachCrosshair } from "./crosshair.js";
import { Legend } from "./legend.js";
import { Pacer } from "./pacer.js";
import { baseConfig, baseLayout, MARGIN, plotly, registerChart, seriesColor, theme } from "./theme.js";

const TOP = 0.97;    // where non-finite markers sit, in the marker axis (0..1 of the plot)
const BOTTOM = 0.03; // -Inf, and zeros on a log axis
const STAGGER = 0.035;
const MARKERS_UP_TO = 60; // a series with fewer points shows each as a marker
const NONFINITE_KEY = "nonfinite"; // legend keys of the marker traces; a series' key is "s:" + its name
const ZERO_KEY = "zero";
const seriesKey = (name) => `s:${name}`;

/**
 * @typedef {{name: string, x: number[], y: (number|null)[], min?: (number|null)[]|null,
 *            max?: (number|null)[]|null}} Series
 *   y holds numbers from format.toNumber: finite, NaN, ±Infinity, or null (ABSENT: a gap).
 */

export class LineChart extends Chart {
  /**
   * @param {HTMLElement} el  the plot element; gets data-points / data-nonfinite after each draw
   * @param {{name: string, log?: boolean, yTitle?: string, scale?: number, unit?: string,
   *          legend?: boolean, emptyText?: string, onXRange?: (range: number[]|null) => void,
   *          xTitle?: string, xHover?: string, xText?: (x: number) => string, yRange?: number[]|null}} opts
   *   scale divides every value (bytes -> MiB); unit is appended in hover text; legend: false
   *   leaves the series out of the legend (a picker shows their colours instead). The x axis
   *   is steps unless told otherwise: xTitle names it, xHover is its Plotly hover template
   *   ("step %{x}"), xText its words in marker text. yRange ([lo, hi] in values, before scale)
   *   fixes the y axis, so that charts side by side share it.
   */
  constructor(el, opts) {
    super(el);
    this.opts = {
      log: false, scale: 1, unit: "", emptyText: "No data yet",
      xTitle: "step", xHover: "step %{x}", xText: (x) => `step ${x}`, yRange: null, ...opts,
    };
    this.series = [];     // the overview (and live points): what the page fetched for the whole run
    this.view = [];       // what is drawn: the series, with the detail's window put in
    this.layoutIndex = null;
    this.pending = [];   // live points not drawn yet, per series
    this.markers = [];   // findings drawn as vertical lines (charts/markers.js)
    this.pacer = new Pacer(el, () => this.flush());
    this.legend = new Legend(el, () => this.showHidden());
    this.legend.el.style.paddingLeft = `${MARGIN.l}px`; // entries start where the plot does
    // A resize can wrap the legend onto more or fewer rows: move the plot's top to fit it again.
    new ResizeObserver(() => {
      const top = this.legendTop();
      if (this.drawn && this.el.layout && Math.abs(this.el.layout.margin.t - top) > 1) plotly().relayout(this.el, { "margin.t": top });
    }).observe(this.legend.el);
    this.unregister = registerChart(this);
  }

  /** Replace all series (after a REST fetch). */
  setSeries(series) {
    this.detail = null;
    this.series = series.map((s) => ({
      name: s.name,
      x: s.x.slice(),
      y: s.y.slice(),
      min: s.min ? s.min.slice() : null,
      max: s.max ? s.max.slice() : null,
    }));
    return this.draw();
  }

  /** Show where findings began (markers.js); redraws only the shapes. */
  setMarkers(markers) {
    if (sameMarkers(markers, this.markers)) return Promise.resolve();
    this.markers = markers.slice();
    if (!this.drawn) return Promise.resolve();
    const empty = !this.series.some((s) => s.x.length);
    return plotly().relayout(this.el, markerLayout(empty ? [] : this.markers, theme())).then(() => this.mark());
  }

  setLog(log) {
    this.opts.log = log;
    return this.draw();
  }

  setScale(scale, unit) {
    this.opts.scale = scale;
    this.opts.unit = unit;
  }

  /**
   * The series as drawn: the overview's points outside the detail's window, the detail's inside.
   * A line chart's detail (setDetail) is {start, end, series}: series[i], {x, y, min?, max?},
   * stands for this.series[i] within steps [start, end].
   */
  merged() {
    const d = this.detail;
    if (!d) return this.series;
    return this.series.map((s, i) => {
      const w = d.series[i];
      let a = 0;
      while (a < s.x.length && s.x[a] < d.start) a++;
      let b = a;
      while (b < s.x.length && s.x[b] <= d.end) b++;
      if (!w) {
        return { name: s.name, x: s.x.slice(), y: s.y.slice(), min: s.min ? s.min.slice() : null, max: s.max ? s.max.slice() : null };
      }
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
      };
    });
  }

  /**
   * Append live points: `points[i]` is a list of [x, y] for series i (y as toNumber gives).
   * They are drawn by the pacer: one extendTraces for everything that arrived since the last
   * draw, and a full redraw only when they bring the chart's first points, its first
   * non-finite value or its first zero on a log axis.
   */
  append(points) {
    points.forEach((pts, i) => {
      const s = this.series[i];
      if (!s || !pts || !pts.length) return;
      // With a detail drawn, the drawn series are copies: they get the live points too.
      for (const t of this.view !== this.series && this.view[i] ? [s, this.view[i]] : [s]) {
        for (const [x, y] of pts) {
          t.x.push(x);
          t.y.push(y);
          if (t.min) t.min.push(y);
          if (t.max) t.max.push(y);
        }
      }
      (this.pending[i] ||= []).push(...pts);
    });
    if (this.pending.some((p) => p && p.length)) this.pacer.request();
  }

  /** Draw the pending points (called by the pacer). */
  flush() {
    if (this.stale) return this.draw();
    const pending = this.pending;
    this.pending = [];
    let top = -Infinity;
    for (const pts of pending) if (pts && pts.length) top = Math.max(top, pts[pts.length - 1][0]);
    const live = () => { if (top > -Infinity) noteLive(this.opts.name, top); };
    const idx = this.layoutIndex;
    if (!this.drawn || !idx) return this.draw().then(live);
    // Past MARKERS_UP_TO points a line drops its point markers (styling each costs every draw).
    if (idx.markers && this.view.some((s) => s.x.length >= MARKERS_UP_TO)) return this.draw().then(live);
    const upd = { x: [], y: [], text: [] };
    const traces = [];
    const push = (trace, xs, ys, texts) => {
      traces.push(trace);
      upd.x.push(xs);
      upd.y.push(ys);
      upd.text.push(texts);
    };
    const nf = { x: [], y: [], text: [] };
    const zero = { x: [], y: [], text: [] };
    pending.forEach((pts, i) => {
      if (!pts || !pts.length || !this.series[i]) return;
      const xs = pts.map((p) => p[0]);
      const ys = pts.map((p) => this.plotY(p[1]));
      const blank = pts.map(() => "");
      push(idx.line[i], xs, ys, blank);
      if (idx.band[i] >= 0) {
        push(idx.band[i], xs, ys, blank);
        push(idx.band[i] + 1, xs, ys, blank);
      }
      for (const [x, y] of pts) this.markerPoint(i, x, y, nf, zero);
    });
    // A first marker needs a trace (and a legend entry) that is not there yet.
    if ((nf.x.length && idx.nonfinite < 0) || (zero.x.length && idx.zero < 0)) return this.draw().then(live);
    if (nf.x.length) push(idx.nonfinite, nf.x, nf.y, nf.text);
    if (zero.x.length) push(idx.zero, zero.x, zero.y, zero.text);
    if (!traces.length) return Promise.resolve();
    return plotly().extendTraces(this.el, upd, traces).then(() => {
      this.mark();
      live();
    });
  }

  /** A value as drawn on the line: non-finite values and log-axis zeros become gaps. */
  plotY(y) {
    if (y === null || isNonFinite(y)) return null;
    if (this.opts.log && y <= 0) return null;
    return y / this.opts.scale;
  }

  markerPoint(i, x, y, nf, zero) {
    const name = plotlyText(this.view[i].name);
    const unit = this.opts.unit ? ` ${this.opts.unit}` : "";
    if (isNonFinite(y)) {
      nf.x.push(x);
      nf.y.push(y === -Infinity ? BOTTOM + i * STAGGER : TOP - i * STAGGER);
      nf.text.push(`<b>${nonFiniteLabel(y)}</b> · ${name}<br>${plotlyText(this.opts.xText(x))}`);
    } else if (this.opts.log && y !== null && y <= 0) {
      zero.x.push(x);
      zero.y.push(BOTTOM + i * STAGGER);
      zero.text.push(`${y}${unit} · ${name}<br>${plotlyText(this.opts.xText(x))} (not drawable on a log axis)`);
    }
  }

  markerCounts() {
    let nonfinite = 0;
    let zero = 0;
    for (const s of this.view) {
      for (let j = 0; j < s.y.length; j++) {
        const vals = [s.y[j], s.min ? s.min[j] : null, s.max ? s.max[j] : null];
        if (vals.some(isNonFinite)) nonfinite++;
        else if (this.opts.log && s.y[j] !== null && s.y[j] <= 0) zero++;
      }
    }
    return { nonfinite, zero };
  }

  /** Build every trace from this.series and (re)draw with Plotly.react. */
  render() {
    this.pending = [];
    this.pacer.clear();
    this.stale = false;
    this.view = this.merged();
    const t = theme();
    const traces = [];
    const idx = { line: [], band: [], nonfinite: -1, zero: -1, markers: false };
    const unit = this.opts.unit ? ` ${plotlyText(this.opts.unit)}` : "";
    const nf = { x: [], y: [], text: [] };
    const zero = { x: [], y: [], text: [] };
    const single = this.view.length === 1;

    const hidden = this.legend.hidden;
    this.view.forEach((s, i) => {
      const color = seriesColor(i, t);
      idx.band[i] = -1;
      if (s.min && s.max && s.min.some((v, j) => v !== s.y[j]) ) {
        idx.band[i] = traces.length;
        const band = (vals, fill) => ({
          type: "scatter", mode: "lines", x: s.x.slice(), y: vals.map((v) => this.plotY(v)),
          line: { width: 0, color }, fill, fillcolor: withAlpha(color, 0.16), hoverinfo: "skip",
          showlegend: false, connectgaps: false, text: s.x.map(() => ""), visible: !hidden.has(seriesKey(s.name)),
        });
        traces.push(band(s.min, "none"), band(s.max, "tonexty"));
      }
      s.x.forEach((x, j) => {
        const worst = [s.y[j], s.min ? s.min[j] : null, s.max ? s.max[j] : null].find(isNonFinite);
        this.markerPoint(i, x, worst === undefined ? s.y[j] : worst, nf, zero);
      });
    });
    this.view.forEach((s, i) => {
      idx.line[i] = traces.length;
      if (s.x.length < MARKERS_UP_TO) idx.markers = true;
      const name = plotlyText(s.name);
      traces.push({
        type: "scatter", mode: s.x.length < MARKERS_UP_TO ? "lines+markers" : "lines",
        name, x: s.x.slice(), y: s.y.map((v) => this.plotY(v)), text: s.x.map(() => ""),
        line: { width: 1.8, color: seriesColor(i, t) }, marker: { size: 4 }, showlegend: this.opts.legend !== false,
        hovertemplate: `${single ? "" : `${name}<br>`}${this.opts.xHover}: <b>%{y:.4~g}${unit}</b><extra></extra>`,
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
    this.legend.render(this.legendEntries(idx, t));

    const empty = !this.view.some((s) => s.x.length);
    const layout = baseLayout({
      xaxis: {
        ...(this.xRange ? { range: this.xRange.slice(), autorange: false } : { autorange: true }), visible: !empty,
        title: { text: plotlyText(this.opts.xTitle), font: { color: t.muted, size: 11 } },
      },
      yaxis: {
        visible: !empty,
        type: this.opts.log ? "log" : "linear",
        title: this.opts.yTitle ? { text: plotlyText(this.opts.yTitle), font: { color: t.muted, size: 11 } } : undefined,
        exponentformat: "power",
        ...this.yAxisTicks(),
        ...this.fixedYRange(),
      },
      yaxis2: { overlaying: "y", range: [0, 1], visible: false, fixedrange: true },
      showlegend: false,
      margin: { ...MARGIN, t: this.legendTop() },
      uirevision: this.opts.name,
      ...markerLayout(empty ? [] : this.markers, t),
    }, t);

    this.layoutIndex = idx;
    const first = !this.drawn;
    this.drawn = true;
    return plotly().react(this.el, traces, layout, baseConfig(this.opts.name)).then(() => {
      if (first) this.listen();
      this.mark();
      this.markDrawn(!empty);
    });
  }

  /**
   * The legend's entries for the traces of `idx`: each series (unless opts.legend is false),
   * then the NaN/Inf and zero markers; none when that is a single series.
   */
  legendEntries(idx, t) {
    const entries = this.opts.legend === false ? [] : this.view.map((s, i) => ({ key: seriesKey(s.name), name: s.name, color: seriesColor(i, t) }));
    if (idx.nonfinite >= 0) entries.push({ key: NONFINITE_KEY, name: "NaN / Inf", color: t.nonfinite, kind: "nonfinite" });
    if (idx.zero >= 0) entries.push({ key: ZERO_KEY, name: "zero", color: t.zero, kind: "zero" });
    return entries.length > (this.opts.legend === false ? 0 : 1) ? entries : [];
  }

  /** The plot's top margin: room for the legend above it. */
  legendTop() {
    return Math.max(MARGIN.t, this.legend.height() + 4);
  }

  /** Hide or show traces as the legend says (a click on it), without drawing anything else. */
  showHidden() {
    const idx = this.layoutIndex;
    if (!this.drawn || !idx) return;
    const hidden = this.legend.hidden;
    const traces = [];
    const visible = [];
    const set = (trace, key) => {
      if (trace < 0) return;
      traces.push(trace);
      visible.push(!hidden.has(key));
    };
    this.view.forEach((s, i) => {
      set(idx.line[i], seriesKey(s.name));
      if (idx.band[i] >= 0) {
        set(idx.band[i], seriesKey(s.name));
        set(idx.band[i] + 1, seriesKey(s.name));
      }
    });
    set(idx.nonfinite, NONFINITE_KEY);
    set(idx.zero, ZERO_KEY);
    plotly().restyle(this.el, { visible }, traces);
  }

  /**
   * Ticks that stay readable: on a log axis spanning a few decades, plain numbers rather
   * than Plotly's small digits; on a linear axis, a flat series gets a range around its value.
   */
  yAxisTicks() {
    let lo = Infinity;
    let hi = -Infinity;
    for (const s of this.view) {
      for (const v of s.y) {
        if (v === null || isNonFinite(v) || (this.opts.log && v <= 0)) continue;
        if (v < lo) lo = v;
        if (v > hi) hi = v;
      }
    }
    if (!Number.isFinite(lo)) return {};
    const fixed = this.opts.yRange;
    if (fixed && fixed[0] < fixed[1] && (!this.opts.log || fixed[0] > 0)) [lo, hi] = fixed; // ticks for what is shown
    if (this.opts.log) {
      // Plain numbers up to a few decades (ticks at 1-2-5 past one decade, Plotly's own
      // within one); powers of ten beyond.
      const decades = Math.log10(hi / lo);
      if (decades < 0.8) return { tickformat: "~g" };
      return decades <= 3 ? { tickformat: "~g", dtick: "D2" } : {};
    }
    if (hi === lo) {
      const pad = Math.abs(lo) * 0.05 || 1;
      return { range: [(lo - pad) / this.opts.scale, (hi + pad) / this.opts.scale], autorange: false };
    }
    return {};
  }

  /** The y axis range of opts.yRange, in Plotly's units (log10 on a log axis). */
  fixedYRange() {
    const r = this.opts.yRange;
    if (!r || !(r[0] < r[1]) || (this.opts.log && !(r[0] > 0))) return {};
    const [lo, hi] = [r[0] / this.opts.scale, r[1] / this.opts.scale];
    return { range: this.opts.log ? [Math.log10(lo), Math.log10(hi)] : [lo, hi], autorange: false };
  }

  listen() {
    const steps = this.opts.xTitle === "step";
    attachCrosshair(this.el, steps ? "step" : `x:${this.opts.xTitle}`, steps ? Math.round : (x) => x);
    this.el.on("plotly_relayout", (ev) => {
      if (this.syncing || !this.opts.onXRange) return;
      if (ev["xaxis.autorange"]) {
        this.xRange = null;
        this.opts.onXRange(null);
      } else if (ev["xaxis.range[0]"] !== undefined) {
        this.xRange = [ev["xaxis.range[0]"], ev["xaxis.range[1]"]];
        this.opts.onXRange(this.xRange);
      } else if (Array.isArray(ev["xaxis.range"])) {
        this.xRange = ev["xaxis.range"].slice();
        this.opts.onXRange(this.xRange);
      }
    });
  }

  /** Publish what is drawn for tests and people: data-points, data-nonfinite, data-empty. */
  mark() {
    const points = this.view.reduce((n, s) => n + s.x.length, 0);
    const { nonfinite } = this.markerCounts();
    this.el.dataset.points = String(points);
    this.el.dataset.nonfinite = String(nonfinite);
    this.el.dataset.series = String(this.view.length);
    if (this.detail) this.el.dataset.window = `${this.detail.start}-${this.detail.end}`;
    else delete this.el.dataset.window;
    markMarkers(this.el, points ? this.markers : []);
    if (points === 0) {
      this.el.dataset.empty = this.opts.emptyText;
    } else {
      delete this.el.dataset.empty;
    }
  }
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
