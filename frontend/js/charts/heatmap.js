// Parameter x step heatmaps. Two kinds:
//   "status": gradient buffer status, four discrete colours (none / zero / nonzero / nonfinite);
//   "log":    a magnitude on a log colour scale (Viridis); NaN/Inf cells and exact zeros in
//             their own colours (red / grey) rather than vanishing from the scale.
// Cells are float32 columns (grid.js: a Float32Array per step bucket, one cell per row), as
// the server sends them. Live columns are kept here, each live step merged into the last column
// until that column spans as many steps as the others (by the server's rule: the bucket's worst
// status, or its largest magnitude with non-finite winning), and columns are merged pairwise
// when there are too many, so the grid stays bounded and evenly spaced; the chart is redrawn
// from them (at most once a second, only while in view: see pacer.js), never by asking the
// server again.
// The cells are painted here into an image, a pixel per cell (raster.js), that Plotly shows
// stretched over their steps and rows, one image per run of columns (the overview either side
// of a zoomed window, the window); the hover is found here too (cell-hover.js). Plotly draws
// only the axes (a category axis of the rows, the columns' steps) and the colour bar, from
// invisible scatter traces (frameTraces).
// Rows come ordered by module (modules.js, moduleOrder); lines separate the modules and, when
// the rows are too thin for a label each, the y axis names the modules instead of parameters.
// Hover always names the parameter, the step and the value. A zoomed heatmap draws its window
// from `detail` (columns fetched at full resolution) and the overview's columns around it.

import { fmtSignificant, GRAD_STATUS, nonFiniteLabel, plotlyText } from "../format.js";
import { bitsOf, EMPTY_BITS, mergeColumns } from "../grid.js";
import { coarseGroups } from "../modules.js";
import { markerLayout, markMarkers, sameMarkers } from "./markers.js";
import { Chart, noteLive } from "./base.js";
import { cellHover } from "./cell-hover.js";
import { attachCrosshair } from "./crosshair.js";
import { Pacer } from "./pacer.js";
import { cellsImage, pixel, rgbaOf, scalePixels, VIRIDIS } from "./raster.js";
import { baseConfig, baseLayout, MARGIN, plotly, registerChart, textWidth, theme, Y_LABEL_PAD } from "./theme.js";

const REDRAW_MS = 1000;
const LABEL_PX = 13;      // the least height per y label
const SEPARATOR_PX = 7;   // the least height between two module separators
const GAP_CELLS = 20000;  // up to this many cells, rows tall enough get a 1 px gap between them
const MAX_IMAGE_PX = 4096; // the widest image of unevenly spaced columns
const MAX_ROWS_PX = 4000; // rows get 1 px at least up to this many (taller than the usual 760 px)
const LABEL_FONT_PX = 11;
// Room that Plotly's automargin asks for (measured, padding included; theme.js, MARGIN): half
// a y label above the first row; half the last x label, or the colour bar, on the right.
const MARGIN_TOP = 18;
const MARGIN_RIGHT = { status: 24, log: 96 };
let viridis = null; // its pixels (raster.js), made once

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
    this.cols = [];   // column j: a Float32Array, a cell per row (codes for "status", values for "log")
    this.markers = []; // findings drawn as vertical lines (charts/markers.js), without labels
    this.separators = []; // lines between modules (shapes), as last drawn
    this.halved = false;  // live columns were merged: the overview is no longer at full resolution
    this.width = 1;       // steps per column (the overview's spacing), which live columns keep to
    this.liveTop = null;  // the last live step not drawn yet
    // Live columns: paced here, so they need no turn (turns.js), unless one is pending anyway.
    this.pacer = new Pacer(el, () => this.drawing || this.render(), { minMs: REDRAW_MS, factor: 10 });
    this.unregister = registerChart(this);
  }

  /** Replace the grid, given as columns: cols[j][i] = row i at column j (grid.js). */
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
    if (sameMarkers(markers, this.markers)) return Promise.resolve();
    this.markers = markers.slice();
    if (!this.drawn) return Promise.resolve();
    const cells = this.rows.length * this.cols.length;
    const layout = markerLayout(cells ? this.markers : [], theme(), { labels: false });
    return plotly().relayout(this.el, { ...layout, shapes: [...layout.shapes, ...this.separators] })
      .then(() => this.mark());
  }

  /**
   * The columns drawn, in runs (segment(), below; none without columns). A heatmap's detail
   * (setDetail) is {start, end, steps, cols}: columns like this.cols (one value per row) that
   * stand for the overview's within steps [start, end]; then the overview's columns before it,
   * the detail's and the overview's after it are three segments.
   */
  segments() {
    const d = this.detail;
    if (!d) return this.steps.length ? [segment(this.steps, this.cols, this.width)] : [];
    let a = 0;
    while (a < this.steps.length && this.steps[a] < d.start) a++;
    let b = a;
    while (b < this.steps.length && this.steps[b] <= d.end) b++;
    return [
      [this.steps.slice(0, a), this.cols.slice(0, a), this.width],
      [d.steps, d.cols, Math.max(1, d.end - d.start + 1)],
      [this.steps.slice(b), this.cols.slice(b), this.width],
    ].filter(([steps]) => steps.length).map(([steps, cols, width]) => segment(steps, cols, width));
  }

  /**
   * Add live columns: each {step, values} with a cell per row (grid.liveColumn). A step within
   * the last column's span (this.width steps) is merged into it, so the columns stay evenly spaced.
   */
  appendColumns(columns) {
    for (const c of columns) {
      const last = this.steps.length - 1;
      if (last >= 0 && this.width > 1 && c.step < this.steps[last] + this.width) {
        this.cols[last] = mergeColumns(this.cols[last], c.values, this.opts.kind === "status");
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
      cols.push(b ? mergeColumns(this.cols[j], b, this.opts.kind === "status") : this.cols[j]);
    }
    this.steps = steps;
    this.cols = cols;
  }

  render() {
    this.pacer.clear();
    this.stale = false;
    const t = theme();
    this.shown = this.segments();
    const names = this.rows.map(plotlyText);
    const nRows = this.rows.length;
    const nCols = this.shown.reduce((n, seg) => n + seg.cols.length, 0);
    const hasCells = nRows > 0 && nCols > 0;
    // 18 px a row up to 760 px; past that at least 1 px a row (up to MAX_ROWS_PX rows), so
    // that no row, and no NaN in it, is lost between two pixels.
    const height = Math.max(180, Math.min(Math.max(760, Math.min(nRows, MAX_ROWS_PX) + 50), nRows * 18 + 70));
    this.el.style.height = `${height}px`;
    const rowPx = (height - 50) / Math.max(1, nRows);  // the plot area, less the x axis
    const gap = rowPx >= 6 && nRows * nCols <= GAP_CELLS;
    const { colour, range } = this.palette(t);
    const images = this.shown.map((seg) => ({
      source: cellsImage(seg, nRows, colour, { columnAt: seg.columnAt, rowPx: gap ? Math.round(rowPx) : 1, gap }),
      xref: "x", yref: "y", x: seg.edges[0], y: -0.5, sizex: seg.edges[seg.edges.length - 1] - seg.edges[0], sizey: nRows,
      xanchor: "left", yanchor: "top", sizing: "stretch", layer: "below",
    }));
    const rowAxis = this.rowAxis(t, names, height - 50);
    const markers = markerLayout(nRows && nCols ? this.markers : [], t, { labels: false });
    const font = `${LABEL_FONT_PX}px ${t.mono}`;
    const labelPx = Math.max(0, ...rowAxis.labels.map((s) => textWidth(s, font)));
    const layout = baseLayout({
      height,
      margin: { l: Math.min(420, Math.ceil(labelPx) + Y_LABEL_PAD), r: MARGIN_RIGHT[this.opts.kind], t: MARGIN_TOP, b: MARGIN.b },
      xaxis: this.xRange ? { range: this.xRange.slice(), autorange: false, showgrid: false, zeroline: false, visible: nRows > 0 }
        : { autorange: true, showgrid: false, zeroline: false, visible: hasCells },
      // Rows top to bottom, each a unit of the category axis: the range a heatmap trace would take.
      yaxis: { range: [Math.max(1, nRows) - 0.5, -0.5], autorange: false, type: "category", showgrid: false,
        tickfont: { family: t.mono, size: LABEL_FONT_PX }, visible: hasCells, ...rowAxis.axis },
      xaxis2: { overlaying: "x", anchor: "y2", visible: false, fixedrange: true },
      yaxis2: { overlaying: "y", anchor: "x2", visible: false, fixedrange: true },
      showlegend: false,
      uirevision: this.opts.name,
      images,
      ...markers,
      shapes: [...markers.shapes, ...this.separators],
    }, t);
    const first = !this.drawn;
    this.drawn = true;
    const live = this.liveTop;
    this.liveTop = null;
    return plotly().react(this.el, this.frameTraces(t, names, range), layout, baseConfig(this.opts.name)).then(() => {
      if (first) this.listen();
      this.mark();
      this.markDrawn(hasCells);
      if (live !== null) noteLive(this.opts.name, live);
    });
  }

  /**
   * The pixel of each cell (raster.js) and, for "log", the colour range [lo, hi] in log10:
   * statuses in their four colours; magnitudes along Viridis from the smallest positive value
   * to the largest, exact zeros and NaN/±Inf in their own colours; no value: transparent.
   */
  palette(t) {
    if (this.opts.kind === "status") {
      const status = t.status.map((c) => pixel(rgbaOf(c)));
      return { colour: (v, bits) => (bits === EMPTY_BITS ? 0 : status[v] || 0), range: null };
    }
    let lo = Infinity;
    let hi = -Infinity;
    for (const seg of this.shown) {
      for (const col of seg.cols) {
        for (let i = 0; i < col.length; i++) {
          const v = col[i];
          if (v > 0 && v !== Infinity) {
            if (v < lo) lo = v;
            if (v > hi) hi = v;
          }
        }
      }
    }
    [lo, hi] = Number.isFinite(lo) ? [Math.log10(lo), Math.log10(hi)] : [0, 1];
    if (hi - lo < 1) hi = lo + 1;
    viridis ||= scalePixels(VIRIDIS);
    const scale = viridis;
    const top = scale.length - 1;
    const zero = pixel(rgbaOf(t.zero));
    const nonfinite = pixel(rgbaOf(t.nonfinite));
    const colour = (v, bits) => {
      if (v > 0 && v !== Infinity) return scale[Math.max(0, Math.min(top, Math.round((Math.log10(v) - lo) / (hi - lo) * top)))];
      if (v === 0) return zero;
      return Number.isNaN(v) ? (bits === EMPTY_BITS ? 0 : nonfinite) : v === -Infinity || v === Infinity ? nonfinite : 0;
    };
    return { colour, range: [lo, hi] };
  }

  /**
   * The traces, none of Plotly's heatmap type (the page loads Plotly's basic bundle, which has
   * none and starts in a third of the cartesian one's time): an invisible line through every
   * row (the category axis of the rows, in order) from the columns' first edge to their last,
   * so that the x axis fits the images (Plotly pads the x range of markers, not of lines); for
   * "log", a point on hidden axes whose markers carry the colour bar of `range`.
   */
  frameTraces(t, names, range) {
    const segs = this.shown;
    const edges = segs.length ? [segs[0].edges[0], segs[segs.length - 1].edges.at(-1)] : [0, 1];
    const ys = names.length === 1 ? [names[0], names[0]] : names;
    const rows = {
      type: "scatter", mode: "lines", name: "rows", x: ys.map((_, i) => edges[i === ys.length - 1 ? 1 : 0]), y: ys,
      line: { width: 0 }, opacity: 0, hoverinfo: "skip", showlegend: false,
    };
    if (!range || !names.length) return [rows];
    const [lo, hi] = range;
    const ticks = [];
    const step = Math.max(1, Math.ceil((Math.ceil(hi) - Math.floor(lo)) / 8));
    for (let k = Math.ceil(lo); k <= Math.floor(hi); k += step) ticks.push(k);
    const scale = {
      type: "scatter", mode: "markers", name: "scale", x: [0], y: [0], xaxis: "x2", yaxis: "y2", hoverinfo: "skip",
      showlegend: false,
      marker: {
        size: 1, opacity: 0, color: [lo], cmin: lo, cmax: hi, colorscale: VIRIDIS, showscale: true,
        colorbar: {
          thickness: 12, outlinewidth: 0, tickvals: ticks, ticktext: ticks.map(pow10),
          tickfont: { color: t.fg, size: 11 },
          title: { text: plotlyText(this.opts.label), side: "right", font: { color: t.muted, size: 11 } },
        },
      },
    };
    return [rows, scale];
  }

  /** The hover of the cell at step position `x` in row `row` (cell-hover.js), or null. */
  cellAt(x, row) {
    if (!(row >= 0 && row < this.rows.length)) return null;
    const seg = (this.shown || []).find((s) => x >= s.edges[0] && x < s.edges.at(-1));
    if (!seg) return null;
    let j = 0;
    let k = seg.cols.length;
    while (k - j > 1) {
      const mid = (j + k) >> 1;
      if (seg.edges[mid] <= x) j = mid;
      else k = mid;
    }
    const v = seg.cols[j][row];
    const empty = seg.bits[j][row] === EMPTY_BITS;
    let value;
    if (this.opts.kind === "status") value = empty ? null : GRAD_STATUS[v];
    else if (v > 0 && v !== Infinity) value = fmtSignificant(v);
    else if (v === 0) value = "0";
    else if (!Number.isFinite(v) && !empty) value = nonFiniteLabel(v);
    if (!value) return null;
    return {
      x0: seg.edges[j], x1: seg.edges[j + 1], name: this.opts.kind === "status" ? undefined : plotlyText(this.opts.label),
      text: `${plotlyText(this.rows[row])}<br>step ${seg.steps[j]}: <b>${value}</b>`,
    };
  }

  /**
   * The y axis of rows grouped by module: a line between modules (at the deepest level that
   * leaves room between lines), and as labels every parameter's name when each row has room
   * for one, else the modules' names (each once, at its middle, as room allows).
   * {axis, labels}: labels are the tick labels as shown (not escaped for Plotly).
   */
  rowAxis(t, names, plotPx) {
    const n = names.length;
    if (!n) {
      this.separators = [];
      return { axis: {}, labels: [] };
    }
    const { groups } = coarseGroups(this.rows, Math.max(1, Math.min(n / 2, plotPx / SEPARATOR_PX)));
    this.separators = groups.slice(1).map((g) => ({
      type: "line", name: "module-separator", xref: "paper", x0: 0, x1: 1, yref: "y", y0: g.start - 0.5, y1: g.start - 0.5,
      layer: "above", line: { color: t.fg, width: 1.5 },
    }));
    this.el.dataset.modules = String(groups.length);
    const rowPx = plotPx / n;
    if (rowPx >= LABEL_PX) return { axis: { tickmode: "array", tickvals: names, ticktext: names }, labels: this.rows };
    const vals = [];
    const labels = [];
    let lastPx = -Infinity;
    for (const g of groups) {
      const mid = Math.floor((g.start + g.end - 1) / 2);
      if (mid * rowPx - lastPx < LABEL_PX) continue;
      lastPx = mid * rowPx;
      vals.push(names[mid]);
      const count = g.end - g.start;
      labels.push(count === 1 ? this.rows[g.start] : `${g.module || "(top level)"} (${count})`);
    }
    return { axis: { tickmode: "array", tickvals: vals, ticktext: labels.map(plotlyText) }, labels };
  }

  listen() {
    attachCrosshair(this.el, "step");
    cellHover(this.el, (x, row) => this.cellAt(x, row), () => {
      const t = theme();
      return { color: t.card, borderColor: t.border, fontColor: t.fg, fontFamily: t.font };
    });
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
    const segs = this.shown || this.segments();
    const cols = segs.flatMap((seg) => seg.cols);
    for (const seg of segs) {
      seg.cols.forEach((c, j) => {
        const bits = seg.bits[j];
        for (let i = 0; i < c.length; i++) {
          const v = c[i];
          if (this.opts.kind === "status" ? v === 3 : !Number.isFinite(v) && bits[i] !== EMPTY_BITS) nonfinite++;
        }
      });
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

/**
 * A run of columns to draw: with the bits of each (grid.js), their edges on the step axis
 * (each column spans from the midpoints to its neighbours, a lone one `width` steps), and which
 * column each pixel column of its image shows (columnAt): one pixel a column when they are
 * evenly spaced within half a column, else as many pixels as the narrowest needs (at most
 * MAX_IMAGE_PX), so that each column covers its own span.
 */
function segment(steps, cols, width) {
  const n = steps.length;
  const edges = new Float64Array(n + 1);
  const dx = n > 1 ? (steps[n - 1] - steps[0]) / (n - 1) : width;
  const even = steps.every((s, j) => Math.abs(steps[0] + j * dx - s) <= dx / 2);
  let columnAt;
  if (even) {
    for (let j = 0; j <= n; j++) edges[j] = steps[0] + (j - 0.5) * dx;
    columnAt = Int32Array.from(steps, (_, j) => j);
  } else {
    edges[0] = steps[0] - (steps[1] - steps[0]) / 2;
    for (let j = 1; j < n; j++) edges[j] = (steps[j - 1] + steps[j]) / 2;
    edges[n] = steps[n - 1] + (steps[n - 1] - steps[n - 2]) / 2;
    let narrowest = Infinity;
    for (let j = 0; j < n; j++) narrowest = Math.min(narrowest, edges[j + 1] - edges[j]);
    const span = edges[n] - edges[0];
    const px = Math.min(MAX_IMAGE_PX, Math.ceil(span / narrowest));
    columnAt = new Int32Array(px);
    for (let p = 0, j = 0; p < px; p++) {
      const at = edges[0] + ((p + 0.5) * span) / px;
      while (j < n - 1 && edges[j + 1] <= at) j++;
      columnAt[p] = j;
    }
  }
  return { steps, cols, bits: cols.map(bitsOf), edges, columnAt };
}

const SUP = { "-": "⁻", 0: "⁰", 1: "¹", 2: "²", 3: "³", 4: "⁴", 5: "⁵", 6: "⁶", 7: "⁷", 8: "⁸", 9: "⁹" };
function pow10(k) {
  if (k === 0) return "1";
  if (k === 1) return "10";
  return `10${String(k).split("").map((c) => SUP[c]).join("")}`;
}
