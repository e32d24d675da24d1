// A line chart of one or more series over steps that never drops a value silently:
// NaN and ±Inf are drawn as red markers along the top (-Inf along the bottom) with hover
// text naming them, and on a log axis exact zeros are drawn as grey markers along the
// bottom. Live points are added with Plotly.extendTraces; the series are kept here too so
// that switching the axis or the theme redraws without asking the server again.
// A zoomed chart draws its window from `detail` (the window's points fetched at full
// resolution) and the overview's points around it, so panning never shows a hole.
// The legend is HTML over the top of the chart (legend.js), so that each draw is one pass.

import { markMarkers, markerLayout, sameMarkers } from "./markers.js";
import { Chart, noteLive } from "./base.js";
import { attachCrosshair } from "./crosshair.js";
import { Legend } from "./legend.js";
import {
  legendEntries, lineLayout, lineTraces, markerCounts, markerPoint, MARKERS_UP_TO, mergeDetail, NONFINITE_KEY,
  plotValue, seriesKey, yAxisRange, ZERO_KEY,
} from "./line-figure.js";
import { Pacer } from "./pacer.js";
import { Ema } from "../smoothing.js";
import { baseConfig, baseLayout, MARGIN, plotly, registerChart, theme } from "./theme.js";

/** @typedef {import("./line-figure.js").Series} Series */

export class LineChart extends Chart {
  /**
   * @param {HTMLElement} el  the plot element; gets data-points / data-nonfinite after each draw
   * @param {{name: string, log?: boolean, yTitle?: string, scale?: number, unit?: string,
   *          legend?: boolean, emptyText?: string, onXRange?: (range: number[]|null) => void,
   *          xTitle?: string, xHover?: string, xText?: (x: number) => string, yRange?: number[]|null,
   *          smooth?: number}} opts
   *   scale divides every value (bytes -> MiB); unit is appended in hover text; legend: false
   *   leaves the series out of the legend (a picker shows their colours instead). The x axis
   *   is steps unless told otherwise: xTitle names it, xHover is its Plotly hover template
   *   ("step %{x}"), xText its words in marker text. yRange ([lo, hi] in values, before scale)
   *   fixes the y axis, so that charts side by side share it. smooth: the smoothing weight the
   *   series' `smooth` arrays were made with (smoothing.js); live points continue them.
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

  /**
   * Replace all series (after a REST fetch). A series with `smooth` goes on smoothing live points
   * from its last smoothed value (`count`: how many finite values it averaged, the series' own
   * when it has every step, else its last step).
   */
  setSeries(series) {
    this.detail = null;
    this.series = series.map((s) => ({
      name: s.name,
      x: s.x.slice(),
      y: s.y.slice(),
      min: s.min ? s.min.slice() : null,
      max: s.max ? s.max.slice() : null,
      smooth: s.smooth ? s.smooth.slice() : null,
    }));
    this.emas = this.series.map((s) => {
      if (!s.smooth || !this.opts.smooth) return null;
      let j = s.smooth.length - 1;
      while (j >= 0 && !Number.isFinite(s.smooth[j])) j--;
      if (j < 0) return new Ema(this.opts.smooth);
      const count = s.min ? s.x[s.x.length - 1] : s.y.filter((v) => Number.isFinite(v)).length;
      return Ema.from(this.opts.smooth, s.smooth[j], Math.max(1, count));
    });
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

  /**
   * The shared zoom: x restricted to `range` (null: everything), and y to what that window's
   * values span (yAxisRange). Out of view, drawn when the chart comes into view.
   */
  setXRange(range) {
    this.xRange = range;
    if (!this.drawn) return;
    if (!this.pacer.visible) {
      this.stale = true;
      this.pacer.request();
      return;
    }
    this.syncing = true;
    const x = range ? { "xaxis.range": range.slice(), "xaxis.autorange": false } : { "xaxis.autorange": true };
    const y = yAxisRange(this.view, this.opts, range);
    const upd = { ...x, ...(y.range ? { "yaxis.range": y.range, "yaxis.autorange": false } : { "yaxis.autorange": true }) };
    plotly().relayout(this.el, upd).finally(() => { this.syncing = false; });
  }

  setScale(scale, unit) {
    this.opts.scale = scale;
    this.opts.unit = unit;
  }

  /** The series as drawn: the overview's points, with the detail's window put in (line-figure.js). */
  merged() {
    return this.detail ? mergeDetail(this.series, this.detail) : this.series;
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
      const ema = this.emas && this.emas[i];
      const full = pts.map(([x, y]) => [x, y, ema ? ema.push(y) : null]);
      // With a detail drawn, the drawn series are copies: they get the live points too.
      for (const t of this.view !== this.series && this.view[i] ? [s, this.view[i]] : [s]) {
        for (const [x, y, sm] of full) {
          t.x.push(x);
          t.y.push(y);
          if (t.min) t.min.push(y);
          if (t.max) t.max.push(y);
          if (t.smooth) t.smooth.push(sm);
        }
      }
      (this.pending[i] ||= []).push(...full);
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
      const ys = pts.map((p) => plotValue(p[1], this.opts));
      const blank = pts.map(() => "");
      push(idx.line[i], xs, ys, blank);
      if (idx.band[i] >= 0) {
        push(idx.band[i], xs, ys, blank);
        push(idx.band[i] + 1, xs, ys, blank);
      }
      if (idx.smooth[i] >= 0) push(idx.smooth[i], xs, pts.map((p) => plotValue(p[2], this.opts)), blank);
      for (const [x, y] of pts) markerPoint(i, this.view[i].name, x, y, this.opts, nf, zero);
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

  /** Build every trace and the layout from this.series (line-figure.js) and (re)draw with Plotly.react. */
  render() {
    this.pending = [];
    this.pacer.clear();
    this.stale = false;
    this.view = this.merged();
    const t = theme();
    const { traces, idx } = lineTraces(this.view, this.opts, t, this.legend.hidden);
    this.legend.render(legendEntries(this.view, idx, this.opts, t));
    const empty = !this.view.some((s) => s.x.length);
    const layout = baseLayout(lineLayout(this.view, {
      opts: this.opts, xRange: this.xRange, markers: this.markers, top: this.legendTop(), margin: MARGIN,
    }, t), t);

    this.layoutIndex = idx;
    const first = !this.drawn;
    this.drawn = true;
    return plotly().react(this.el, traces, layout, baseConfig(this.opts.name)).then(() => {
      if (first) this.listen();
      this.mark();
      this.markDrawn(!empty);
    });
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
      set(idx.smooth[i], seriesKey(s.name));
    });
    set(idx.nonfinite, NONFINITE_KEY);
    set(idx.zero, ZERO_KEY);
    plotly().restyle(this.el, { visible }, traces);
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
    const { nonfinite } = markerCounts(this.view, this.opts.log);
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
