// When a live chart redraws. Plotly redraws a whole chart for every extendTraces, so a
// chart's cost grows with its points, and a page has a dozen charts. A Pacer runs a chart's
// draw no more often than `factor` times what its draws cost (the median of the last few, so
// that one full redraw among quick appends does not hold the next ones back: a line chart
// that takes 25 ms draws at most every 100 ms, so that two in view take half the main thread
// and show a step about 100 ms after it came at worst), and not at all while no part of it is
// in view: it catches up, in one draw, when it comes into view.
// whenVisible(fn) runs other work (a zoomed window's fetch) once the chart is in view.
// Draws run in tasks of their own (not in animation frames, whose callbacks all make one
// task): the charts due together share a task up to TASK_BUDGET_MS and the rest go on in the
// next one, so that several charts drawing at once never make one long main-thread task.

const TASK_BUDGET_MS = 30;
const due = [];  // pacers waiting to draw, in the order they asked
let planned = false; // a task to run them is asked for
let channel = null; // a task at once (setTimeout(0) may wait 4 ms); made on first use, so importing does nothing

function runDue() {
  planned = false;
  const t0 = performance.now();
  while (due.length) {
    due.shift().fire();
    if (performance.now() - t0 > TASK_BUDGET_MS) break;
  }
  if (due.length) plan();
}

function plan() {
  if (!channel) {
    channel = new MessageChannel();
    channel.port1.onmessage = runDue;
  }
  if (!planned) channel.port2.postMessage(null);
  planned = true;
}

export class Pacer {
  /**
   * @param {HTMLElement} el  the chart element, watched for visibility
   * @param {() => unknown} draw  does the work (synchronous part is what is measured)
   * @param {{minMs?: number, maxMs?: number, factor?: number}} opts
   */
  constructor(el, draw, { minMs = 100, maxMs = 3000, factor = 4 } = {}) {
    this.draw = draw;
    this.minMs = minMs;
    this.maxMs = maxMs;
    this.factor = factor;
    this.interval = minMs;
    this.costs = [];     // the last few draws' cost, ms
    this.last = 0;
    this.wanted = false;
    this.visible = true;
    this.timer = 0;
    this.onVisible = null;
    if ("IntersectionObserver" in window) {
      this.observer = new IntersectionObserver((entries) => {
        this.visible = entries[entries.length - 1].isIntersecting;
        if (this.visible && this.onVisible) {
          const fn = this.onVisible;
          this.onVisible = null;
          fn();
        }
        if (this.visible && this.wanted) this.request();
      });
      this.observer.observe(el);
    }
  }

  /** Something new to draw: draw it soon. */
  request() {
    this.wanted = true;
    if (!this.visible || this.timer || due.includes(this)) return;
    const wait = this.last + this.interval - performance.now();
    if (wait <= 0) {
      due.push(this);
      plan();
      return;
    }
    this.timer = setTimeout(() => {
      this.timer = 0;
      due.push(this);
      plan();
    }, wait);
  }

  /** Run `fn` now if the chart is in view, else once it comes into view (the last one given). */
  whenVisible(fn) {
    if (this.visible) fn();
    else this.onVisible = fn;
  }

  /** Nothing is pending any more (a full draw happened). */
  clear() {
    this.wanted = false;
  }

  fire() {
    if (!this.wanted) return;
    this.wanted = false;
    const t0 = performance.now();
    this.draw();
    this.costs.push(performance.now() - t0);
    if (this.costs.length > 5) this.costs.shift();
    const cost = this.costs.slice().sort((a, b) => a - b)[Math.floor(this.costs.length / 2)];
    this.interval = Math.min(this.maxMs, Math.max(this.minMs, cost * this.factor));
    this.last = t0; // the next draw may start `interval` after this one started
  }

  destroy() {
    clearTimeout(this.timer);
    if (due.includes(this)) due.splice(due.indexOf(this), 1);
    if (this.observer) this.observer.disconnect();
  }
}
