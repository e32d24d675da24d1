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
