// What every chart shares: the shared zoom, failure text, theme switches and teardown.
// Subclasses set `this.pacer`, draw with `draw()` and set `this.drawn` once Plotly has a plot.

import { plotly } from "./theme.js";

export class Chart {
  /** @param {HTMLElement} el */
  constructor(el) {
    this.el = el;
    this.xRange = null;
    this.drawn = false;
    this.syncing = false;
  }

  /** Restrict the x axis to [a, b] (shared zoom), or back to everything with null. */
  setXRange(range) {
    this.xRange = range;
    if (!this.drawn) return;
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
    this.pacer.destroy();
    this.unregister();
    if (this.drawn) plotly().purge(this.el);
  }
}
