// When a live chart redraws. Plotly redraws a whole chart for every extendTraces, so a
// chart's cost grows with its points, and a page has a dozen charts. A Pacer runs a chart's
// draw in an animation frame, no more often than `factor` times what its draws cost (the
// median of the last few, so that one full redraw among quick appends does not hold the next
// ones back: a chart that takes 20 ms draws at most every 160 ms), and not at all while it is
// scrolled out of view: it catches up, in one draw, when it comes back into view.
// whenVisible(fn) runs other work (a zoomed window's fetch) once the chart is in view.
// The charts due in one animation frame share it up to FRAME_BUDGET_MS; the others wait for
// the next frame, so that several charts drawing at once never make one long main-thread task.

const FRAME_BUDGET_MS = 30;
const due = [];  // pacers waiting for a frame, in the order they asked
let frame = 0;

function runDue() {
  frame = 0;
  const t0 = performance.now();
  while (due.length) {
    due.shift().fire();
    if (performance.now() - t0 > FRAME_BUDGET_MS) break;
  }
  if (due.length) frame = requestAnimationFrame(runDue);
}

export class Pacer {
  /**
   * @param {HTMLElement} el  the chart element, watched for visibility
   * @param {() => unknown} draw  does the work (synchronous part is what is measured)
   * @param {{minMs?: number, maxMs?: number, factor?: number}} opts
   */
  constructor(el, draw, { minMs = 100, maxMs = 3000, factor = 8 } = {}) {
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
      }, { rootMargin: "200px 0px" });
      this.observer.observe(el);
    }
  }

  /** Something new to draw: draw it soon. */
  request() {
    this.wanted = true;
    if (!this.visible || this.timer || due.includes(this)) return;
    const wait = Math.max(0, this.last + this.interval - performance.now());
    this.timer = setTimeout(() => {
      this.timer = 0;
      due.push(this);
      if (!frame) frame = requestAnimationFrame(runDue);
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
    this.last = performance.now();
  }

  destroy() {
    clearTimeout(this.timer);
    if (due.includes(this)) due.splice(due.indexOf(this), 1);
    if (this.observer) this.observer.disconnect();
  }
}
