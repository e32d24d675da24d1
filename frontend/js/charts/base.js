// What every chart shares: the shared zoom, the zoomed window's detail, failure text, theme
// switches, teardown, and what the page publishes about its drawing (performance marks
// `gradwatch:drawn:<name>` on a chart's first draw with data; window.__gradwatchLive, the
// time each live step was drawn, for tests and benchmarks/dashboard.py).
// Subclasses set `this.pacer`, implement `render()` (one full Plotly draw) and set `this.drawn`
// once Plotly has a plot; everyone else calls `draw()`, which renders when the chart's turn
// comes (turns.js).
// A zoom or a zoomed window's detail reaches a chart scrolled out of view as `stale`: it is
// drawn by the chart's pacer when the chart comes into view, so a zoom costs only the charts
// that can be seen.

import { plotly } from "./theme.js";
import { drawTurn } from "./turns.js";

const LIVE_LOG = 5000; // entries kept in window.__gradwatchLive

/** Record that `chart` drew live steps up to `step` now: window.__gradwatchLive [{chart, step, t}]. */
export function noteLive(chart, step) {
  const log = (window.__gradwatchLive ||= []);
  log.push({ chart, step, t: Date.now() });
  if (log.length > LIVE_LOG) log.splice(0, log.length - LIVE_LOG);
}

export class Chart {
  /** @param {HTMLElement} el */
  constructor(el) {
    this.el = el;
    this.xRange = null;
    this.drawn = false;
    this.syncing = false;
    this.detail = null;     // the zoomed window at full resolution (subclasses define its shape)
    this.markedDrawn = false;
    this.stale = false;     // drawn with another zoom than this.xRange / this.detail: redraw in view
    this.drawing = null;    // the draw waiting for its turn
    this.destroyed = false;
  }

  /** Draw the chart as it stands when its turn comes (turns.js); draws asked for meanwhile are that one. */
  draw() {
    this.drawing ||= drawTurn(this.el).then(() => {
      this.drawing = null;
      return this.destroyed ? undefined : this.render();
    });
    return this.drawing;
  }

  /**
   * Show `detail` (the data of the zoomed step window, fetched at full resolution) in place
   * of the overview's points within its [start, end]; null goes back to the overview alone.
   * Out of view, it is drawn when the chart comes into view.
   */
  setDetail(detail) {
    this.detail = detail;
    if (this.drawn && !this.pacer.visible) {
      this.stale = true;
      this.pacer.request();
      return Promise.resolve();
    }
    return this.draw();
  }

  /** After a draw: the first one with data sets the performance mark gradwatch:drawn:<name>. */
  markDrawn(hasData) {
    if (!hasData || this.markedDrawn) return;
    this.markedDrawn = true;
    performance.mark(`gradwatch:drawn:${this.opts.name}`);
  }

  /**
   * Take the shared zoom without drawing: the caller draws next (a zoom that fetches its
   * window draws it with setDetail; one fetch, one draw).
   */
  holdXRange(range) {
    this.xRange = range;
  }

  /** Restrict the x axis to [a, b] (shared zoom), or back to everything with null. */
  setXRange(range) {
    this.xRange = range;
    if (!this.drawn) return;
    if (!this.pacer.visible) {
      this.stale = true;
      this.pacer.request();
      return;
    }
    this.syncing = true;
    const upd = range ? { "xaxis.range": range.slice(), "xaxis.autorange": false } : { "xaxis.autorange": true };
    plotly().relayout(this.el, upd).finally(() => { this.syncing = false; });
  }

  /** Say in the chart why it has nothing to show (a failed fetch). */
  fail(err) {
    this.el.dataset.empty = `Could not load: ${err && err.message ? err.message : err}`;
  }

  retheme() {
    if (this.drawn) this.draw();
  }

  destroy() {
    this.destroyed = true; // a draw waiting for its turn is dropped
    this.pacer.destroy();
    this.unregister();
    if (this.drawn) plotly().purge(this.el);
  }
}
