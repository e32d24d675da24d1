// Parameter x step heatmaps. Two kinds:
//   "status": gradient buffer status, four discrete colours (none / zero / nonzero / nonfinite);
//   "log":    a magnitude on a log colour scale; NaN/Inf cells and exact zeros are drawn by an
//             overlay in their own colours (red / grey) rather than vanishing from the scale.
// Live columns are kept here, each live step merged into the last column until that column
// spans as many steps as the others (by the server's rule: the bucket's worst status, or its
// largest magnitude with non-finite winning), and columns are merged pairwise when there are
// too many, so the grid stays bounded and evenly spaced; the chart is redrawn from them (at
// most once a second, only while in view: see pacer.js), never by asking the server again.
// Evenly spaced columns and no gaps between cells let Plotly paint one pixel per cell and
// scale the image (its "fast" heatmap path) instead of one rectangle per cell: so each run of
// evenly spaced columns (the overview either side of a zoomed window, the window) is its own
// trace, and the hover takes the step from `text` (the trace's x is the even spacing).
// Rows come ordered by module (modules.js, moduleOrder); lines separate the modules and, when
// the rows are too thin for a label each, the y axis names the modules instead of parameters.
// Hover always names the parameter, the step and the value. A zoomed heatmap draws its window
// from `detail` (columns fetched at full resolution) and the overview's columns around it.

import { GRAD_STATUS, isNonFinite, nonFiniteLabel, plotlyText } from "../format.js";
import { coarseGroups } from "../modules.js";
import { markerLayout, markMarkers } from "./markers.js";
import { Chart, noteLive } from "./base.js";
import { Pacer } from "./pacer.js";
import { baseConfig, baseLayout, plotly, registerChart, theme, whenPlotly } from "./theme.js";

const REDRAW_MS = 1000;
const LABEL_PX = 13;      // the least height per y label
const SEPARATOR_PX = 7;   // the least height between two module separators
const GAP_CELLS = 20000;  // up to this many cells, rows tall enough get a 1 px gap between them
const MAX_ROWS_PX = 4000; // rows get 1 px at least up to this many (taller than the usual 760 px)

export class HeatmapChart extends Chart {
  /**
   * @param {HTMLElement} el
   * @param {{name: string, kind: "status"|"log", label?: string, maxSteps?: number,
   *          emptyText?: string, onXRange?: (range: number[]|null) => void}} opts
   */
  constructor(el, opts) {
    super(el);
    this.opts = { maxSteps: 400, label: "value", emptyText: "No data yet", ...opts };
    this.rows = [];   // parameter names, top to bottom
    this.steps = [];  // x of each column (its first step)
    this.cols = [];   // column j: values per row (codes for "status", numbers for "log")
    this.markers = []; // findings drawn as vertical lines (charts/markers.js), without labels
    this.separators = []; // lines between modules (shapes), as last drawn
    this.halved = false;  // live columns were merged: the overview is no longer at full resolution
    this.width = 1;       // steps per column (the overview's spacing), which live columns keep to
    this.liveTop = null;  // the last live step not drawn yet
    this.pacer = new Pacer(el, () => this.draw(), { minMs: REDRAW_MS, factor: 10 });
    this.unregister = registerChart(this);
  }

  /** Replace the grid (REST): rows = names, z[i][j] = row i at column j (already decoded). */
  setData(rows, steps, z) {
    return this.setColumns(rows, steps, steps.map((_, j) => rows.map((_, i) => (z[i] ? z[i][j] : null))));
  }

  /** Replace the grid, given as columns: cols[j][i] = row i at column j. */
  setColumns(rows, steps, cols) {
    this.detail = null;
    this.halved = false;
    this.rows = rows.slice();
    this.steps = steps.slice();
    this.cols = cols;
    const n = steps.length;
    this.width = n > 1 ? Math.max(1, (steps[n - 1] - steps[0]) / (n - 1)) : 1;
    return this.draw();
  }

  /** Show where findings began (markers.js); redraws only the shapes. */
  setMarkers(markers) {
    this.markers = markers.slice();
    if (!this.drawn) return Promise.resolve();
    const cells = this.rows.length * this.cols.length;
    const layout = markerLayout(cells ? this.markers : [], theme(), { labels: false });
    return plotly().relayout(this.el, { ...layout, shapes: [...layout.shapes, ...this.separators] })
      .then(() => this.mark());
  }

  /**
   * The columns drawn, as runs of evenly spaced ones: [{steps, cols}]. A heatmap's detail
   * (setDetail) is {start, end, steps, cols}: columns like this.cols (one value per row) that
   * stand for the overview's within steps [start, end]; then the overview's columns before it,
   * the detail's and the overview's after it are three segments.
   */
  segments() {
    const d = this.detail;
    if (!d) return [{ steps: this.steps, cols: this.cols }];
    let a = 0;
    while (a < this.steps.length && this.steps[a] < d.start) a++;
    let b = a;
    while (b < this.steps.length && this.steps[b] <= d.end) b++;
    return [
      { steps: this.steps.slice(0, a), cols: this.cols.slice(0, a) },
      { steps: d.steps, cols: d.cols },
      { steps: this.steps.slice(b), cols: this.cols.slice(b) },
    ].filter((seg) => seg.steps.length);
  }

  /**
   * Add live columns: each {step, values} with one value per row. A step within the last
   * column's span (this.width steps) is merged into it, so the columns stay evenly spaced.
   */
  appendColumns(columns) {
    for (const c of columns) {
      const last = this.steps.length - 1;
      if (last >= 0 && this.width > 1 && c.step < this.steps[last] + this.width) {
        const prev = this.cols[last];
        this.cols[last] = c.values.map((v, i) => this.merge(prev[i], v));
        this.halved = true;
      } else {
        this.steps.push(c.step);
        this.cols.push(c.values);
      }
      this.liveTop = c.step;
    }
    while (this.cols.length > this.opts.maxSteps * 1.5) this.halve();
    this.pacer.request();
  }

  /** Merge columns pairwise: the server's bucket rule, applied to our own columns. */
  halve() {
    this.halved = true;
    this.width *= 2;
    const steps = [];
    const cols = [];
    for (let j = 0; j < this.cols.length; j += 2) {
      steps.push(this.steps[j]);
      const b = this.cols[j + 1];
      cols.push(b ? this.cols[j].map((v, i) => this.merge(v, b[i])) : this.cols[j]);
    }
    this.steps = steps;
    this.cols = cols;
  }

  merge(a, b) {
    if (a === null || a === undefined) return b ?? null;
    if (b === null || b === undefined) return a;
    if (this.opts.kind === "status") return Math.max(a, b);
    if (isNonFinite(a)) return a;
    if (isNonFinite(b)) return b;
    return Math.abs(b) > Math.abs(a) ? b : a;
  }

  draw() {
    if (!window.Plotly) return whenPlotly().then(() => this.draw());
    this.pacer.clear();
    this.stale = false;
    const t = theme();
    this.shown = this.segments();
    const names = this.rows.map(plotlyText);
    const nRows = this.rows.length;
    const nCols = this.shown.reduce((n, seg) => n + seg.cols.length, 0);
    // 18 px a row up to 760 px; past that at least 1 px a row (up to MAX_ROWS_PX rows), so
    // that no row, and no NaN in it, is lost between two pixels.
    const height = Math.max(180, Math.min(Math.max(760, Math.min(nRows, MAX_ROWS_PX) + 50), nRows * 18 + 70));
    this.el.style.height = `${height}px`;
    const rowPx = (height - 50) / Math.max(1, nRows);  // the plot area, less the x axis
    const ygap = rowPx >= 6 && nRows * nCols <= GAP_CELLS ? 1 : 0;
    const traces = [];
    for (const seg of this.shown) {
      traces.push(...(this.opts.kind === "status" ? this.statusTraces(t, names, ygap, seg) : this.logTraces(t, names, ygap, seg)));
    }
    if (this.opts.kind !== "status") this.colourScale(traces, t);
    const rowAxis = this.rowAxis(t, names, height - 50);
    const markers = markerLayout(nRows && nCols ? this.markers : [], t, { labels: false });
    // Margins that already fit the labels and the colour bar (11 px monospace: ~6.7 px a
    // character): Plotly's automargin then has nothing to grow, which would cost a second draw.
    const longest = Math.max(0, ...(rowAxis.axis.ticktext || []).map((s) => s.length));
    const layout = baseLayout({
      height,
      margin: { l: Math.min(420, Math.round(longest * 6.7) + 16), r: this.opts.kind === "status" ? 12 : 96, t: 8, b: 40 },
      xaxis: this.xRange ? { range: this.xRange.slice(), autorange: false, showgrid: false, visible: nRows > 0 }
        : { autorange: true, showgrid: false, visible: nRows > 0 && nCols > 0 },
      yaxis: { autorange: "reversed", type: "category", showgrid: false, tickfont: { family: t.mono, size: 11 },
        visible: nRows > 0 && nCols > 0, ...rowAxis.axis },
      showlegend: false,
      uirevision: this.opts.name,
      ...markers,
      shapes: [...markers.shapes, ...this.separators],
    }, t);
    const first = !this.drawn;
    this.drawn = true;
    const live = this.liveTop;
    this.liveTop = null;
    return plotly().react(this.el, traces, layout, baseConfig(this.opts.name)).then(() => {
      if (first) this.listen();
      this.mark();
      this.markDrawn(nRows > 0 && nCols > 0);
      if (live !== null) noteLive(this.opts.name, live);
    });
  }

  /**
   * The y axis of rows grouped by module: a line between modules (at the deepest level that
   * leaves room between lines), and as labels every parameter's name when each row has room
   * for one, else the modules' names (each once, at its middle, as room allows).
   */
  rowAxis(t, names, plotPx) {
    const n = names.length;
    if (!n) {
      this.separators = [];
      return { axis: {} };
    }
    const { groups } = coarseGroups(this.rows, Math.max(1, Math.min(n / 2, plotPx / SEPARATOR_PX)));
    this.separators = groups.slice(1).map((g) => ({
      type: "line", name: "module-separator", xref: "paper", x0: 0, x1: 1, yref: "y", y0: g.start - 0.5, y1: g.start - 0.5,
      layer: "above", line: { color: t.fg, width: 1.5 },
    }));
    this.el.dataset.modules = String(groups.length);
    const rowPx = plotPx / n;
    if (rowPx >= LABEL_PX) return { axis: { tickmode: "array", tickvals: names, ticktext: names } };
    const vals = [];
    const text = [];
    let lastPx = -Infinity;
    for (const g of groups) {
      const mid = Math.floor((g.start + g.end - 1) / 2);
      if (mid * rowPx - lastPx < LABEL_PX) continue;
      lastPx = mid * rowPx;
      vals.push(names[mid]);
      const count = g.end - g.start;
      text.push(count === 1 ? names[g.start] : plotlyText(`${g.module || "(top level)"} (${count})`));
    }
    return { axis: { tickmode: "array", tickvals: vals, ticktext: text } };
  }

  /** Row `i` across the columns of `seg`, each value through `cell`. */
  row(seg, i, cell) {
    const cols = seg.cols;
    const out = new Array(cols.length);
    for (let j = 0; j < cols.length; j++) out[j] = cell(cols[j][i]);
    return out;
  }

  /**
   * x for a segment's heatmap, and the step of each column as hover text: evenly spaced
   * positions when the columns are evenly spaced within half a column (then Plotly can paint
   * the fast way), else the steps themselves. `text` has one row shared by every row.
   */
  columnsX(seg) {
    const s = seg.steps;
    const n = s.length;
    const labels = s.map(String);
    const text = this.rows.map(() => labels);
    if (n < 3) return { x: s.slice(), text };
    const dx = (s[n - 1] - s[0]) / (n - 1);
    const x = s.map((_, j) => s[0] + j * dx);
    const even = x.every((v, j) => Math.abs(v - s[j]) <= dx / 2);
    return { x: even ? x : s.slice(), text };
  }

  statusTraces(t, names, ygap, seg) {
    const scale = [];
    t.status.forEach((c, k) => { scale.push([k / 4, c], [(k + 1) / 4, c]); });
    const word = (v) => (v === null || v === undefined ? "" : GRAD_STATUS[v]);
    const z = this.rows.map((_, i) => this.row(seg, i, (v) => v ?? null));
    const customdata = z.map((r) => r.map(word));
    return [{
      type: "heatmap", ...this.columnsX(seg), y: names, z, customdata,
      zmin: -0.5, zmax: 3.5, colorscale: scale, showscale: false, hoverongaps: false, xgap: 0, ygap,
      hovertemplate: "%{y}<br>step %{text}: <b>%{customdata}</b><extra></extra>",
    }];
  }

  /** Give every log trace one colour range and one colour bar (the first). */
  colourScale(traces, t) {
    let lo = Infinity;
    let hi = -Infinity;
    for (const tr of traces) {
      if (tr.zmin === undefined || tr.name !== "log") continue;
      lo = Math.min(lo, tr.zmin);
      hi = Math.max(hi, tr.zmax);
    }
    if (!Number.isFinite(lo)) { lo = 0; hi = 1; }
    if (hi - lo < 1) { hi = lo + 1; }
    const ticks = [];
    const step = Math.max(1, Math.ceil((Math.ceil(hi) - Math.floor(lo)) / 8));
    for (let k = Math.ceil(lo); k <= Math.floor(hi); k += step) ticks.push(k);
    const label = plotlyText(this.opts.label);
    let first = true;
    for (const tr of traces) {
      if (tr.name !== "log") continue;
      tr.zmin = lo;
      tr.zmax = hi;
      tr.showscale = first;
      if (first) {
        tr.colorbar = {
          thickness: 12, outlinewidth: 0, tickvals: ticks, ticktext: ticks.map(pow10),
          tickfont: { color: t.fg, size: 11 },
          title: { text: label, side: "right", font: { color: t.muted, size: 11 } },
        };
      }
      first = false;
    }
  }

  logTraces(t, names, ygap, seg) {
    let lo = Infinity;
    let hi = -Infinity;
    const label = plotlyText(this.opts.label);
    // z is log10 of the value; the value itself rides in customdata for the hover (formatted
    // by Plotly when hovered, not as a string per cell up front).
    const value = (v) => (v === null || v === undefined || isNonFinite(v) || v <= 0 ? null : v);
    const values = this.rows.map((_, i) => this.row(seg, i, value));
    const z = values.map((r) => r.map((v) => {
      if (v === null) return null;
      const l = Math.log10(v);
      if (l < lo) lo = l;
      if (l > hi) hi = l;
      return l;
    }));
    // NaN/Inf and exact zeros: an overlay in their own colours. Plotly wants every row of a
    // category axis in each heatmap, so the rows without any share one empty row.
    const blank = new Array(seg.cols.length).fill(null);
    const special = { z: [], labels: [], any: false };
    this.rows.forEach((_, i) => {
      const r = this.row(seg, i, (v) => (isNonFinite(v) ? v : v === 0 ? 0 : null));
      const any = r.some((v) => v !== null);
      special.any ||= any;
      special.z.push(any ? r.map((v) => (v === null ? null : v === 0 ? 0 : 1)) : blank);
      special.labels.push(any ? r.map((v) => (v === null ? "" : v === 0 ? "0" : nonFiniteLabel(v))) : blank);
    });
    const cx = this.columnsX(seg);
    const traces = [{
      type: "heatmap", name: "log", ...cx, y: names, z, customdata: values,
      zmin: lo, zmax: hi, colorscale: "Viridis", hoverongaps: false, ygap,
      hovertemplate: `%{y}<br>step %{text}: <b>%{customdata:.4~g}</b><extra>${label}</extra>`,
    }];
    if (special.any) {
      traces.push({
        type: "heatmap", name: "special", ...cx, y: names, z: special.z, customdata: special.labels,
        zmin: 0, zmax: 1, showscale: false, hoverongaps: false, ygap,
        colorscale: [[0, t.zero], [0.5, t.zero], [0.5, t.nonfinite], [1, t.nonfinite]],
        hovertemplate: `%{y}<br>step %{text}: <b>%{customdata}</b><extra>${label}</extra>`,
      });
    }
    return traces;
  }

  listen() {
    this.el.on("plotly_relayout", (ev) => {
      if (this.syncing || !this.opts.onXRange) return;
      if (ev["xaxis.autorange"]) this.opts.onXRange((this.xRange = null));
      else if (ev["xaxis.range[0]"] !== undefined) {
        this.xRange = [ev["xaxis.range[0]"], ev["xaxis.range[1]"]];
        this.opts.onXRange(this.xRange);
      }
    });
  }

  mark() {
    let nonfinite = 0;
    const cols = (this.shown || this.segments()).flatMap((seg) => seg.cols);
    for (const c of cols) {
      for (const v of c) {
        if (this.opts.kind === "status" ? v === 3 : isNonFinite(v)) nonfinite++;
      }
    }
    const cells = this.rows.length * cols.length;
    this.el.dataset.points = String(cells);
    this.el.dataset.nonfinite = String(nonfinite);
    this.el.dataset.rows = String(this.rows.length);
    this.el.dataset.columns = String(cols.length);
    if (this.detail) this.el.dataset.window = `${this.detail.start}-${this.detail.end}`;
    else delete this.el.dataset.window;
    markMarkers(this.el, cells ? this.markers : []);
    if (cells === 0) this.el.dataset.empty = this.opts.emptyText;
    else delete this.el.dataset.empty;
  }
}

const SUP = { "-": "⁻", 0: "⁰", 1: "¹", 2: "²", 3: "³", 4: "⁴", 5: "⁵", 6: "⁶", 7: "⁷", 8: "⁸", 9: "⁹" };
function pow10(k) {
  if (k === 0) return "1";
  if (k === 1) return "10";
  return `10${String(k).split("").map((c) => SUP[c]).join("")}`;
}
