// When a live chart redraws. Plotly redraws a whole chart for every extendTraces, so a
// chart's cost grows with its points, and a page has a dozen charts. A Pacer runs a chart's
// draw in an animation frame, no more often than `factor` times what the last draw cost
// (a chart that takes 20 ms draws at most every 160 ms), and not at all while the chart is
// scrolled out of view: it catches up, in one draw, when it comes back into view.

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
    this.last = 0;
    this.wanted = false;
    this.visible = true;
    this.timer = 0;
    this.frame = 0;
    if ("IntersectionObserver" in window) {
      this.observer = new IntersectionObserver((entries) => {
        this.visible = entries[entries.length - 1].isIntersecting;
        if (this.visible && this.wanted) this.request();
      }, { rootMargin: "200px 0px" });
      this.observer.observe(el);
    }
  }

  /** Something new to draw: draw it soon. */
  request() {
    this.wanted = true;
    if (!this.visible || this.timer || this.frame) return;
    const wait = Math.max(0, this.last + this.interval - performance.now());
    this.timer = setTimeout(() => {
      this.timer = 0;
      this.frame = requestAnimationFrame(() => {
        this.frame = 0;
        this.fire();
      });
    }, wait);
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
    const cost = performance.now() - t0;
    this.interval = Math.min(this.maxMs, Math.max(this.minMs, cost * this.factor));
    this.last = performance.now();
  }

  destroy() {
    clearTimeout(this.timer);
    cancelAnimationFrame(this.frame);
    if (this.observer) this.observer.disconnect();
  }
}
