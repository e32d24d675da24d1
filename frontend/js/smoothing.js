// TensorBoard's smoothing, as the server's smoothing.py computes it: a debiased exponential
// moving average. For weight w in [0, 1), each finite value y updates last = w*last + (1-w)*y
// and shows last / (1 - w^n), n the finite values so far; a non-finite value or a gap (null) is
// shown as it is and stays out of the average. A series the server downsampled is asked for
// smoothed (`smooth=`): smoothing bucket means would average buckets, not steps. A series with
// every step (not downsampled) is smoothed here, with the same result; live steps continue the
// average from where it stands (Ema).

export const MAX_SMOOTH = 0.99;

/** A weight from the URL or the slider: a number in [0, MAX_SMOOTH], else 0 (off). */
export function smoothWeight(v) {
  const w = Number(v);
  return Number.isFinite(w) && w > 0 ? Math.min(w, MAX_SMOOTH) : 0;
}

/** The running average of one series: `push(y)` returns the smoothed value to draw. */
export class Ema {
  constructor(weight, last = 0, count = 0) {
    this.weight = weight;
    this.last = last;
    this.count = count;
  }

  /** An average that continues from a smoothed value `shown` after `count` finite values. */
  static from(weight, shown, count) {
    return new Ema(weight, shown * (1 - weight ** count), count);
  }

  push(y) {
    if (y === null || !Number.isFinite(y)) return y;
    this.last = this.last * this.weight + (1 - this.weight) * y;
    this.count += 1;
    return this.last / (1 - this.weight ** this.count);
  }
}

/** The smoothed copy of `values` (numbers, NaN, ±Infinity or null). */
export function ema(values, weight) {
  if (!weight) return values.slice();
  const avg = new Ema(weight);
  return values.map((y) => avg.push(y));
}

/**
 * `values` at steps `xs` read at the steps `at` (linear between the nearest finite neighbours,
 * the end values beyond them; null where `values` has no finite value at all): a series the
 * server smoothed and downsampled has its own bucket steps, drawn over the raw series' steps.
 */
export function resample(xs, values, at) {
  const pts = xs.map((x, j) => [x, values[j]]).filter(([, v]) => v !== null && Number.isFinite(v));
  if (!pts.length) return at.map(() => null);
  let k = 0;
  return at.map((x) => {
    while (k < pts.length - 1 && pts[k + 1][0] <= x) k++;
    const [x0, y0] = pts[k];
    if (x <= x0 || k === pts.length - 1) return y0;
    const [x1, y1] = pts[k + 1];
    return y0 + ((y1 - y0) * (x - x0)) / (x1 - x0);
  });
}

/**
 * Chart series with their `smooth` line for `weight` (unchanged when it is 0): smoothed here
 * when `exact` (every step is there: the same as the server's), else from `smoothed()`, the
 * server's answers ({step, value}) smoothed before downsampling, one per series.
 */
export async function withSmoothing(series, weight, exact, smoothed) {
  if (!weight) return series;
  if (exact) return series.map((s) => ({ ...s, smooth: ema(s.y, weight) }));
  // A refused smoothing (a run too long to smooth on the server, docs/api.md) leaves the raw line.
  const answers = await smoothed().catch((err) => {
    if (err && err.name === "AbortError") throw err;
    return [];
  });
  return series.map((s, i) => {
    const a = answers[i];
    if (!a) return s;
    const values = (a.value || []).map((v) => (v === null ? null : Number(v))); // "NaN", "Infinity" as numbers
    return { ...s, smooth: resample(a.step || [], values, s.x) };
  });
}
