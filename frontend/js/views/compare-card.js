// A compare card: one series of several runs, overlaid (one chart, a line per run) or side
// by side (a panel per run, every panel on the same x and y ranges), aligned by step or by wall
// time (seconds since each run's first step). pages/compare.js owns the state it reads.

import { h, setChildren } from "../dom.js";
import { fmtNum, toNumbers } from "../format.js";
import { LineChart } from "../charts/line.js";
import { valueRange } from "../charts/line-figure.js";
import { ema, resample } from "../smoothing.js";
import { seriesColor } from "../charts/theme.js";
import { chartCard, toggle } from "./card.js";

/** The x axis's words: steps, or seconds since the run's first step. */
export function xAxisOpts(x) {
  return x === "time"
    ? { xTitle: "seconds since the run's first step", xHover: "%{x:.3~f} s", xText: (v) => `${fmtNum(v)} s` }
    : { xTitle: "step", xHover: "step %{x}", xText: (v) => `step ${v}` };
}

/** A run's x values: its steps, or its wall times as seconds since its first step (ms precision). */
export function xValues(d, x) {
  if (x === "step") return d.step;
  if (!d.time || d.time0 === null) return [];
  return d.time.map((t) => (t === null || !Number.isFinite(t) ? null : Math.round((t - d.time0) * 1000) / 1000));
}

/** [lo, hi] of every drawable value of `series` (lines and downsampling bands), padded, or null. */
export function sharedYRange(series, log) {
  const found = valueRange(series.map((s) => ({ x: s.x || [], y: s.y, min: s.min, max: s.max })), log);
  if (!found) return null;
  const [lo, hi] = found;
  if (log) {
    const f = lo === hi ? 1.5 : (hi / lo) ** 0.05;
    return [lo / f, hi * f];
  }
  const pad = lo === hi ? Math.abs(lo) * 0.05 || 1 : (hi - lo) * 0.05;
  return [lo - pad, hi + pad];
}

/** [lo, hi] of the finite x values of `series` (widened by one around a single x), or null. */
export function sharedXRange(series) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const s of series) {
    for (const x of s.x) {
      if (x === null || !Number.isFinite(x)) continue;
      if (x < lo) lo = x;
      if (x > hi) hi = x;
    }
  }
  if (!Number.isFinite(lo)) return null;
  return lo === hi ? [lo - 1, hi + 1] : [lo, hi];
}

/** The run's colour swatch (i: its place in the comparison). */
export function swatch(i) {
  return h("span", { class: "swatch", style: `background:${seriesColor(i)}`, "aria-hidden": "true" });
}

/**
 * A card comparing one series across the runs: `fetchOne(run)` resolves to a /series-shaped
 * answer ({step, value, min, max, time, time0}) or null when the run has none.
 * @param {{state: {runs: object[], ids: string[], x: string, layout: string, xRange: number[]|null},
 *          label: (i: number) => string, onXRange: Function, cards: object[]}} page
 *   the compare page: its state, each run's label, the shared zoom, and the list of cards
 *   (the card adds itself, and takes itself out on destroy()).
 */
export function compareCard(page, id, title, help, fetchOne, { log = false, tools = [], wide = false, parent, before = null } = {}) {
  const { state, label, onXRange, cards } = page;
  const logToggle = toggle("log", log, (on) => { entry.log = on; entry.draw(); }, "Logarithmic y axis");
  const { card, plot } = chartCard({ id, title, help, tools: [...tools, logToggle], wide });
  const panelsEl = h("div", { class: "panels", hidden: true });
  plot.after(panelsEl);
  const overlay = new LineChart(plot, { name: id, log, emptyText: "None of these runs has this", onXRange });
  let panels = [];

  function destroyPanels() {
    for (const p of panels) p.chart.destroy();
    panels = [];
    panelsEl.replaceChildren();
  }

  function ensurePanels() {
    if (panels.length === state.runs.length) return;
    destroyPanels();
    panels = state.runs.map((r, i) => {
      const el = h("div", { class: "chart", dataset: { chart: `${id}-${i}`, points: "0", empty: "Loading…" }, role: "img" });
      const titleEl = h("p", { class: "panel-title" });
      panelsEl.appendChild(h("div", { class: "panel", dataset: { run: state.ids[i] } }, titleEl, el));
      const chart = new LineChart(el, {
        name: `${id}-${i}`, log: entry.log, legend: false, onXRange,
        emptyText: r ? "This run has none" : "Run not found",
      });
      return { el, titleEl, chart };
    });
  }

  const entry = {
    card,
    log,
    data: [],   // per run: {step, time, time0, y, min, max} or null

    async load() {
      const results = await Promise.all(state.runs.map((r) => (r ? fetchOne(r).catch(() => null) : null)));
      // Smoothed (state.smooth): here for a run whose series has every step, else the server's
      // (smoothed before downsampling), read at this series' steps.
      const w = state.smooth || 0;
      const smoothed = await Promise.all(state.runs.map((r, i) => (w && results[i] && results[i].downsampled
        ? fetchOne(r, { smooth: w }).catch(() => null) : null)));
      this.data = results.map((res, i) => {
        if (!res) return null;
        const y = toNumbers(res.value);
        const s = smoothed[i];
        return {
          step: res.step || [],
          time: res.time ? toNumbers(res.time) : null,
          time0: res.time0 ?? null,
          y,
          min: res.downsampled && res.min ? toNumbers(res.min) : null,
          max: res.downsampled && res.max ? toNumbers(res.max) : null,
          smooth: !w ? null : s ? resample(s.step || [], toNumbers(s.value), res.step || []) : res.downsampled ? null : ema(y, w),
        };
      });
      await this.draw();
    },

    /** One series per run, in run order, so each run keeps its colour (empty when it has none). */
    series() {
      return state.runs.map((r, i) => {
        const d = this.data[i];
        return d ? { name: label(i), x: xValues(d, state.x), y: d.y, min: d.min, max: d.max, smooth: d.smooth }
          : { name: label(i), x: [], y: [] };
      });
    },

    async draw() {
      const series = this.series();
      const axis = xAxisOpts(state.x);
      if (state.layout === "overlay") {
        destroyPanels();
        panelsEl.hidden = true;
        card.classList.remove("card-auto-wide");
        plot.hidden = false;
        Object.assign(overlay.opts, axis, { log: this.log, yRange: null });
        overlay.xRange = state.xRange;
        await overlay.setSeries(series);
        return;
      }
      plot.hidden = true;
      panelsEl.hidden = false;
      card.classList.add("card-auto-wide"); // the panels of a card side by side in one row
      ensurePanels();
      const yRange = sharedYRange(series, this.log);
      const xRange = state.xRange || sharedXRange(series);
      await Promise.all(panels.map((p, i) => {
        setChildren(p.titleEl, swatch(i), label(i));
        p.el.setAttribute("aria-label", `${title}: ${label(i)}`);
        Object.assign(p.chart.opts, axis, { log: this.log, yRange });
        p.chart.xRange = xRange;
        // The run's own series in its slot, the others empty: the line keeps the run's colour.
        return p.chart.setSeries(series.map((s, j) => (j === i ? s : { name: s.name, x: [], y: [] })));
      }));
    },

    setXRange(range) {
      if (state.layout === "overlay") overlay.setXRange(range);
      else {
        const shared = range || sharedXRange(this.series());
        for (const p of panels) p.chart.setXRange(shared);
      }
    },

    destroy() {
      overlay.destroy();
      destroyPanels();
      card.remove();
      cards.splice(cards.indexOf(entry), 1);
    },
  };
  cards.push(entry);
  parent.insertBefore(card, before);
  return entry;
}
