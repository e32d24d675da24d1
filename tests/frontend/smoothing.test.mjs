// smoothing.js, charts/spread.js's statistics and line-figure.js's smoothed traces: pure functions
// against oracles written out here (TensorBoard's EMA step by step; quantiles by hand).
import assert from "node:assert/strict";
import { test } from "node:test";

import { lineTraces, mergeDetail, RAW_OPACITY } from "../../frontend/js/charts/line-figure.js";
import { quantile, spreadOf } from "../../frontend/js/charts/spread.js";
import { Ema, ema, resample, smoothWeight, withSmoothing } from "../../frontend/js/smoothing.js";

/** TensorBoard's smoothing (its scalar dashboard's code, written out): the oracle. */
function reference(values, weight) {
  let last = 0;
  let n = 0;
  return values.map((y) => {
    if (y === null || !Number.isFinite(y)) return y;
    last = last * weight + (1 - weight) * y;
    n += 1;
    return last / (1 - weight ** n);
  });
}

const close = (a, b, rel = 1e-12) => {
  assert.equal(a.length, b.length);
  a.forEach((v, i) => {
    if (v === null || !Number.isFinite(v)) assert.ok(Object.is(v, b[i]), `${i}: ${v} vs ${b[i]}`);
    else assert.ok(Math.abs(v - b[i]) <= rel * Math.abs(b[i]), `${i}: ${v} vs ${b[i]}`);
  });
};

test("ema: TensorBoard's debiased EMA; NaN, Inf and gaps shown as they are and left out", () => {
  const values = [3, 1, NaN, 4, null, 1, 5, Infinity, 9, 2, 6, -Infinity, 5];
  for (const w of [0.1, 0.6, 0.99]) close(ema(values, w), reference(values, w));
  assert.deepEqual(ema(values, 0), values);
  assert.equal(ema([7], 0.9)[0], 7); // debiased: the first point is the value itself
});

test("Ema.from continues a smoothed series: the same as smoothing the whole series", () => {
  const values = Array.from({ length: 40 }, (_, i) => Math.sin(i) + i / 10);
  const whole = reference(values, 0.8);
  const live = Ema.from(0.8, whole[24], 25);
  close(values.slice(25).map((y) => live.push(y)), whole.slice(25), 1e-9);
});

test("smoothWeight: from the URL, 0 (off) unless a number in (0, 0.99]", () => {
  assert.deepEqual(["0.6", "0", "-1", "abc", null, "5"].map(smoothWeight), [0.6, 0, 0, 0, 0, 0.99]);
});

test("resample: the server's smoothed buckets read at the raw series' steps", () => {
  assert.deepEqual(resample([10, 20, 30], [1, 3, NaN], [5, 10, 15, 20, 25, 40]), [1, 1, 2, 3, 3, 3]);
  assert.deepEqual(resample([1, 2], [NaN, null], [1, 2]), [null, null]);
});

test("withSmoothing: here when every step is there, the server's answer otherwise, nothing at weight 0", async () => {
  const series = [{ name: "a", x: [1, 2, 3], y: [1, 2, 4] }];
  assert.equal(await withSmoothing(series, 0, true, () => assert.fail("no fetch")), series);
  close((await withSmoothing(series, 0.5, true, () => assert.fail("no fetch")))[0].smooth, reference([1, 2, 4], 0.5));
  const served = await withSmoothing(series, 0.5, false, async () => [{ step: [1, 3], value: [1, "NaN"] }]);
  assert.deepEqual(served[0].smooth, [1, 1, 1]);
});

test("withSmoothing: a refused smoothing (a run too long) draws the raw line alone; an abort still aborts", async () => {
  const series = [{ name: "a", x: [1, 2, 3], y: [1, 2, 4] }];
  const refused = Object.assign(new Error("422 smooth: too many stored steps"), { status: 422 });
  const drawn = await withSmoothing(series, 0.5, false, async () => { throw refused; });
  assert.deepEqual(drawn, series);
  const abort = Object.assign(new Error("aborted"), { name: "AbortError" });
  await assert.rejects(withSmoothing(series, 0.5, false, async () => { throw abort; }), { name: "AbortError" });
});

test("lineTraces: a smoothed series draws its raw line faint and the smoothed line over it", () => {
  const t = { fg: "#111", muted: "#777", card: "#fff", nonfinite: "#f00", zero: "#999", palette: ["#0000ff"], severity: {} };
  const opts = { name: "t", log: false, scale: 1, unit: "", xTitle: "step", xHover: "step %{x}", xText: (x) => `step ${x}` };
  const { traces, idx } = lineTraces([{ name: "loss", x: [1, 2], y: [4, 2], min: null, max: null, smooth: [4, 2.5] }], opts, t);
  assert.equal(traces[idx.line[0]].opacity, RAW_OPACITY);
  assert.deepEqual(traces[idx.smooth[0]].y, [4, 2.5]);
  assert.equal(traces[idx.smooth[0]].name, "loss (smoothed)");
  assert.ok(idx.smooth[0] > idx.line[0], "drawn over the raw line");
  const plain = lineTraces([{ name: "loss", x: [1], y: [4], min: null, max: null }], opts, t);
  assert.deepEqual(plain.idx.smooth, [-1]);
  assert.equal(plain.traces[plain.idx.line[0]].opacity, 1);
  const merged = mergeDetail([{ name: "a", x: [1, 2, 3], y: [1, 2, 3], smooth: [1, 1.5, 2] }],
    { start: 2, end: 2, series: [{ x: [2], y: [9], smooth: [7] }] });
  assert.deepEqual(merged[0].smooth, [1, 7, 2]);
});

test("spreadOf: numpy's quantiles of the finite values; NaN/Inf counted apart, ABSENT left out", () => {
  assert.equal(quantile([1, 2, 3, 4], 0.25), 1.75); // numpy.quantile([1, 2, 3, 4], 0.25)
  const p = spreadOf([4, null, 1, NaN, 3, Infinity, 2]);
  assert.deepEqual(p, { params: 4, nonfinite: 2, min: 1, q25: 1.75, median: 2.5, q75: 3.25, max: 4 });
  assert.deepEqual(spreadOf([null, NaN]), { params: 0, nonfinite: 1, min: null, q25: null, median: null, q75: null, max: null });
});
