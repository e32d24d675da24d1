// Parameter x step heatmaps. Two kinds:
//   "status": gradient buffer status, four discrete colours (none / zero / nonzero / nonfinite);
//   "log":    a magnitude on a log colour scale; NaN/Inf cells and exact zeros are drawn by an
//             overlay in their own colours (red / grey) rather than vanishing from the scale.
// Live columns are kept here and merged pairwise (by the server's rule: the bucket's worst
// status, or its largest magnitude with non-finite winning) so the grid stays bounded; the
// chart is redrawn from them (at most once a second, only while in view: see pacer.js),
// never by asking the server again.

import { GRAD_STATUS, isNonFinite, nonFiniteLabel, fmtNum, plotlyText } from "../format.js";
import { markerLayout, markMarkers } from "./markers.js";
import { Chart } from "./base.js";
import { Pacer } from "./pacer.js";
import { baseConfig, baseLayout, plotly, registerChart, theme } from "./theme.js";

const REDRAW_MS = 1000;

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
    this.pacer = new Pacer(el, () => this.draw(), { minMs: REDRAW_MS, factor: 10 });
    this.unregister = registerChart(this);
  }

  /** Replace the grid (REST): rows = names, z[i][j] = row i at column j (already decoded). */
  setData(rows, steps, z) {
    this.rows = rows.slice();
    this.steps = steps.slice();
    this.cols = steps.map((_, j) => rows.map((_, i) => (z[i] ? z[i][j] : null)));
    return this.draw();
  }

  /** Show where findings began (markers.js); redraws only the shapes. */
  setMarkers(markers) {
    this.markers = markers.slice();
    if (!this.drawn) return Promise.resolve();
    const cells = this.rows.length * this.cols.length;
    return plotly().relayout(this.el, markerLayout(cells ? this.markers : [], theme(), { labels: false }))
      .then(() => this.mark());
  }

  /** Add live columns: each {step, values} with one value per row. */
  appendColumns(columns) {
    for (const c of columns) {
      this.steps.push(c.step);
      this.cols.push(c.values);
    }
    while (this.cols.length > this.opts.maxSteps * 1.5) this.halve();
    this.pacer.request();
  }

  /** Merge columns pairwise: the server's bucket rule, applied to our own columns. */
  halve() {
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
    this.pacer.clear();
    const t = theme();
    const names = this.rows.map(plotlyText);
    const nRows = this.rows.length;
    const height = Math.max(180, Math.min(760, nRows * 18 + 70));
    this.el.style.height = `${height}px`;
    const traces = this.opts.kind === "status" ? this.statusTraces(t, names) : this.logTraces(t, names);
    const layout = baseLayout({
      height,
      margin: { l: 8, r: 12, t: 8, b: 8 },
      xaxis: this.xRange ? { range: this.xRange.slice(), autorange: false, showgrid: false, visible: nRows > 0 }
        : { autorange: true, showgrid: false, visible: nRows > 0 && this.cols.length > 0 },
      yaxis: { autorange: "reversed", type: "category", showgrid: false, tickfont: { family: t.mono, size: 11 },
        visible: nRows > 0 && this.cols.length > 0 },
      showlegend: false,
      uirevision: this.opts.name,
      ...markerLayout(nRows && this.cols.length ? this.markers : [], t, { labels: false }),
    }, t);
    const first = !this.drawn;
    this.drawn = true;
    return plotly().react(this.el, traces, layout, baseConfig(this.opts.name)).then(() => {
      if (first) this.listen();
      this.mark();
    });
  }

  /** z and hover text as rows x columns (Plotly's layout) from our column-major store. */
  grid(cell) {
    const z = [];
    const text = [];
    for (let i = 0; i < this.rows.length; i++) {
      const zr = new Array(this.cols.length);
      const tr = new Array(this.cols.length);
      for (let j = 0; j < this.cols.length; j++) {
        const [zv, tv] = cell(this.cols[j][i], i, j);
        zr[j] = zv;
        tr[j] = tv;
      }
      z.push(zr);
      text.push(tr);
    }
    return { z, text };
  }

  statusTraces(t, names) {
    const scale = [];
    t.status.forEach((c, k) => { scale.push([k / 4, c], [(k + 1) / 4, c]); });
    const { z, text } = this.grid((v) => [v, v === null || v === undefined ? "" : GRAD_STATUS[v]]);
    return [{
      type: "heatmap", x: this.steps.slice(), y: names, z, text,
      zmin: -0.5, zmax: 3.5, colorscale: scale, showscale: false, hoverongaps: false, xgap: 0, ygap: 1,
      hovertemplate: "%{y}<br>step %{x}: <b>%{text}</b><extra></extra>",
    }];
  }

  logTraces(t, names) {
    let lo = Infinity;
    let hi = -Infinity;
    const label = plotlyText(this.opts.label);
    const main = this.grid((v) => {
      if (v === null || v === undefined || isNonFinite(v) || v <= 0) return [null, ""];
      const l = Math.log10(v);
      if (l < lo) lo = l;
      if (l > hi) hi = l;
      return [l, fmtNum(v)];
    });
    const special = this.grid((v) => {
      if (isNonFinite(v)) return [1, nonFiniteLabel(v)];
      if (v === 0) return [0, "0"];
      return [null, ""];
    });
    if (!Number.isFinite(lo)) { lo = 0; hi = 1; }
    if (hi - lo < 1) { hi = lo + 1; }
    const ticks = [];
    const step = Math.max(1, Math.ceil((Math.ceil(hi) - Math.floor(lo)) / 8));
    for (let k = Math.ceil(lo); k <= Math.floor(hi); k += step) ticks.push(k);
    const traces = [{
      type: "heatmap", x: this.steps.slice(), y: names, z: main.z, text: main.text,
      zmin: lo, zmax: hi, colorscale: "Viridis", hoverongaps: false, ygap: 1,
      colorbar: {
        thickness: 12, outlinewidth: 0, tickvals: ticks, ticktext: ticks.map(pow10),
        tickfont: { color: t.fg, size: 11 },
        title: { text: label, side: "right", font: { color: t.muted, size: 11 } },
      },
      hovertemplate: `%{y}<br>step %{x}: <b>%{text}</b><extra>${label}</extra>`,
    }];
    if (special.z.some((r) => r.some((v) => v !== null))) {
      traces.push({
        type: "heatmap", x: this.steps.slice(), y: names, z: special.z, text: special.text,
        zmin: 0, zmax: 1, showscale: false, hoverongaps: false, ygap: 1,
        colorscale: [[0, t.zero], [0.5, t.zero], [0.5, t.nonfinite], [1, t.nonfinite]],
        hovertemplate: `%{y}<br>step %{x}: <b>%{text}</b><extra>${label}</extra>`,
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
    for (const c of this.cols) {
      for (const v of c) {
        if (this.opts.kind === "status" ? v === 3 : isNonFinite(v)) nonfinite++;
      }
    }
    const cells = this.rows.length * this.cols.length;
    this.el.dataset.points = String(cells);
    this.el.dataset.nonfinite = String(nonfinite);
    this.el.dataset.rows = String(this.rows.length);
    this.el.dataset.columns = String(this.cols.length);
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
