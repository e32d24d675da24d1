// How a view shows a zoomed window of steps at the resolution the server gives for the window
// alone. Every chart view that fetches its window shares this, so that superseded answers,
// charts out of view and failed fetches are handled the same way in each.

/**
 * A view's zoom, for `chart`:
 *   zoom(ctx, win): show steps [win[0], win[1]] (null: the overview). Resolves once drawn, or
 *     at once when a newer zoom or load took over, or when the chart is out of view (then the
 *     window is fetched when it comes into view).
 *   setXRange(range): the shared zoom, drawn now, or held for zoom() to draw when it will
 *     fetch the window (or drop one): one fetch, one draw.
 *   cancel(): drop the zoom under way; a view's load() calls it first.
 * @param {import("../charts/base.js").Chart} chart
 * @param {{overviewEnough: () => boolean,
 *          fetchDetail: (ctx: object, win: number[], signal: AbortSignal) => Promise<object|null>}} o
 *   overviewEnough: the overview already has every step a window could show (or nothing to show).
 *   fetchDetail: the window's detail for chart.setDetail, or null to leave the chart as it is.
 */
export function windowZoom(chart, { overviewEnough, fetchDetail }) {
  let seq = 0;      // answers to an older zoom (or one before a reload) are dropped
  let abort = null;
  let held = false; // the chart took the zoom without drawing it: zoom() draws it

  const cancel = () => {
    seq += 1;
    if (abort) abort.abort();
    abort = null;
  };

  const zoom = async (ctx, win) => {
    cancel();
    const mine = seq;
    if (!win || overviewEnough()) {
      if (chart.detail) await chart.setDetail(null);
      else if (held) chart.setXRange(chart.xRange);
      held = false;
      return;
    }
    if (!chart.pacer.visible) {
      // Out of view: fetch the window once the chart is scrolled to, unless a newer zoom came.
      chart.pacer.whenVisible(() => {
        if (mine === seq) zoom(ctx, win).catch((err) => console.warn("gradwatch: zoom:", err));
      });
      return;
    }
    abort = new AbortController();
    let detail;
    try {
      detail = await fetchDetail(ctx, win, abort.signal);
    } catch (err) {
      if (err && err.name === "AbortError") return;
      chart.setXRange(chart.xRange); // the window could not come: the zoom, on the overview
      throw err;
    }
    if (mine === seq && detail) await chart.setDetail(detail);
  };

  const setXRange = (range) => {
    held = range ? !overviewEnough() : Boolean(chart.detail);
    if (held) chart.holdXRange(range);
    else chart.setXRange(range);
  };

  return { zoom, setXRange, cancel };
}

/**
 * The zoom a URL's ?from=&to= asks for, as [lo, hi] whichever way round they were written;
 * null when either is missing or not a number.
 */
export function urlRange(from, to) {
  const num = (v) => (v === null || v === undefined || String(v).trim() === "" || Number.isNaN(Number(v)) ? null : Number(v));
  const [a, b] = [num(from), num(to)];
  return a === null || b === null ? null : [Math.min(a, b), Math.max(a, b)];
}
