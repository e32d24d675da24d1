// charts/line-figure.js: the traces and layout a line chart hands to Plotly, as pure functions.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  fixedYRange, legendEntries, lineLayout, lineTraces, markerCounts, mergeDetail, plotValue, valueRange, withAlpha, yAxisRange, yAxisTicks,
} from "../../frontend/js/charts/line-figure.js";

const THEME = {
  fg: "#111111", muted: "#777777", card: "#ffffff", nonfinite: "#ff0000", zero: "#999999",
  palette: ["#0000ff", "#00ff00"], severity: { error: "#ff0000", warning: "#ffaa00", info: "#0088ff" },
};
const OPTS = {
  name: "t", log: false, scale: 1, unit: "", xTitle: "step", xHover: "step %{x}", xText: (x) => `step ${x}`, yRange: null,
};

test("plotValue: non-finite values, gaps and log-axis zeros are not on the line; values are scaled", () => {
  assert.equal(plotValue(NaN, OPTS), null);
  assert.equal(plotValue(Infinity, OPTS), null);
  assert.equal(plotValue(null, OPTS), null);
  assert.equal(plotValue(0, { log: true, scale: 1 }), null);
  assert.equal(plotValue(0, OPTS), 0);
  assert.equal(plotValue(3 * 2 ** 20, { log: false, scale: 2 ** 20 }), 3);
});

test("lineTraces: one line per series, NaN and -Inf as markers on the second axis, with text naming them", () => {
  const view = [
    { name: "a", x: [1, 2, 3], y: [1, NaN, 3], min: null, max: null },
    { name: "<b>b</b>", x: [1, 2, 3], y: [2, -Infinity, 4], min: null, max: null },
  ];
  const { traces, idx } = lineTraces(view, OPTS, THEME);
  assert.deepEqual(idx.line, [0, 1]);
  assert.deepEqual(idx.band, [-1, -1]);
  assert.equal(idx.nonfinite, 2);
  assert.equal(idx.zero, -1);
  assert.deepEqual(traces[0].y, [1, null, 3]);
  assert.equal(traces[1].name, "&lt;b&gt;b&lt;/b&gt;"); // names are text, never markup
  const nf = traces[2];
  assert.equal(nf.yaxis, "y2");
  assert.deepEqual(nf.x, [2, 2]);
  assert.ok(nf.y[0] > 0.9 && nf.y[1] < 0.1, "NaN along the top, -Inf along the bottom");
  assert.match(nf.text[0], /NaN/);
  assert.match(nf.text[1], /-Inf/);
  assert.equal(traces[0].line.color, "#0000ff");
  assert.equal(traces[1].line.color, "#00ff00");
});

test("lineTraces: a downsampled series gets a band of two traces before its line; hidden series stay hidden", () => {
  const view = [{ name: "a", x: [0, 10], y: [1, 2], min: [0.5, 1], max: [3, 2] }];
  const { traces, idx } = lineTraces(view, OPTS, THEME, new Set(["s:a"]));
  assert.deepEqual(idx.band, [0]);
  assert.deepEqual(idx.line, [2]);
  assert.equal(traces[1].fill, "tonexty");
  assert.equal(traces[1].fillcolor, "rgba(0, 0, 255, 0.16)");
  assert.ok(traces.every((t) => t.visible === false));
});

test("lineTraces: on a log axis zeros become grey markers, and markerCounts counts them apart from NaN", () => {
  const view = [{ name: "a", x: [1, 2, 3], y: [0, 1, NaN], min: null, max: null }];
  const { traces, idx } = lineTraces(view, { ...OPTS, log: true }, THEME);
  assert.equal(traces[idx.zero].x.length, 1);
  assert.deepEqual(markerCounts(view, true), { nonfinite: 1, zero: 1 });
  assert.deepEqual(markerCounts(view, false), { nonfinite: 1, zero: 0 });
});

test("mergeDetail: the detail replaces the overview inside its window only", () => {
  const series = [{ name: "a", x: [0, 10, 20, 30], y: [0, 10, 20, 30], min: null, max: null }];
  const merged = mergeDetail(series, { start: 10, end: 20, series: [{ x: [10, 11, 12, 20], y: [1, 2, 3, 4] }] });
  assert.deepEqual(merged[0].x, [0, 10, 11, 12, 20, 30]);
  assert.deepEqual(merged[0].y, [0, 1, 2, 3, 4, 30]);
  assert.notEqual(mergeDetail(series, null)[0].x, series[0].x, "a copy, not the same arrays");
});

test("legendEntries: none for a single series, one per series and marker kind otherwise", () => {
  const one = [{ name: "a", x: [1], y: [1] }];
  assert.deepEqual(legendEntries(one, { nonfinite: -1, zero: -1 }, OPTS, THEME), []);
  const entries = legendEntries([...one, { name: "b", x: [1], y: [1] }], { nonfinite: 2, zero: -1 }, OPTS, THEME);
  assert.deepEqual(entries.map((e) => e.key), ["s:a", "s:b", "nonfinite"]);
});

test("valueRange: the drawable values, within an x window when given (bands included)", () => {
  const view = [{ name: "a", x: [1, 2, 3, 4], y: [100, 5, 6, NaN], min: [100, 4, 6, 1], max: [100, 7, 6, 1] }];
  assert.deepEqual(valueRange(view, false), [1, 100]);
  assert.deepEqual(valueRange(view, false, [2, 3]), [4, 7]);
  assert.deepEqual(valueRange(view, false, [3, 2]), [4, 7], "a reversed window is the same window");
  assert.equal(valueRange(view, false, [10, 20]), null);
  assert.deepEqual(valueRange([{ name: "z", x: [1, 2], y: [0, 2] }], true), [2, 2]);
});

test("yAxisTicks and fixedYRange: plain numbers on a log axis of a few decades; a fixed range in Plotly's units", () => {
  const view = [{ name: "a", x: [1, 2], y: [1, 100] }];
  assert.deepEqual(yAxisTicks(view, { ...OPTS, log: true }), { tickformat: "~g", dtick: "D2" });
  assert.deepEqual(yAxisTicks([{ name: "a", x: [1, 2], y: [5, 5] }], OPTS), {});
  assert.deepEqual(fixedYRange({ ...OPTS, log: true, yRange: [1, 1000] }), { range: [0, 3], autorange: false });
  assert.deepEqual(fixedYRange({ ...OPTS, log: true, yRange: [0, 1000] }), {});
});

test("lineLayout: the shared zoom on x, log or linear y, finding markers, the legend's room on top", () => {
  const view = [{ name: "a", x: [1, 2], y: [1, 2] }];
  const markers = [{ step: 2, code: "nonfinite_grad", severity: "error", message: "m" }];
  const layout = lineLayout(view, { opts: { ...OPTS, log: true }, xRange: [1, 2], markers, top: 40, margin: { l: 1, r: 2, t: 3, b: 4 } }, THEME);
  assert.deepEqual(layout.xaxis.range, [1, 2]);
  assert.equal(layout.xaxis.autorange, false);
  assert.equal(layout.yaxis.type, "log");
  assert.deepEqual(layout.margin, { l: 1, r: 2, t: 40, b: 4 });
  assert.equal(layout.shapes.length, 1);
  assert.equal(layout.shapes[0].line.color, "#ff0000");
  const empty = lineLayout([{ name: "a", x: [], y: [] }], { opts: OPTS, xRange: null, markers, top: 19, margin: {} }, THEME);
  assert.equal(empty.xaxis.visible, false);
  assert.equal(empty.shapes.length, 0, "no markers on an empty chart");
});

test("withAlpha: hex and rgb colours", () => {
  assert.equal(withAlpha("#102030", 0.5), "rgba(16, 32, 48, 0.5)");
  assert.equal(withAlpha("rgb(1, 2, 3)", 0.1), "rgba(1, 2, 3, 0.1)");
});

test("yAxisRange: zoomed, y spans the window's values (log or linear); else autorange, a flat line excepted", () => {
  const view = [{ name: "loss", x: [1, 2, 3, 4, 5], y: [100, 50, 2, 1.5, 1], min: null, max: null }];
  assert.deepEqual(yAxisRange(view, OPTS), { autorange: true });
  const lin = yAxisRange(view, OPTS, [3, 5]);
  assert.equal(lin.autorange, false);
  assert.ok(Math.abs(lin.range[0] - 0.95) < 1e-9 && Math.abs(lin.range[1] - 2.05) < 1e-9, String(lin.range));
  const log = yAxisRange(view, { ...OPTS, log: true }, [5, 3]);
  const [a, b] = [Math.log10(1), Math.log10(2)];
  assert.ok(Math.abs(log.range[0] - (a - 0.05 * (b - a))) < 1e-9 && Math.abs(log.range[1] - (b + 0.05 * (b - a))) < 1e-9, String(log.range));
  assert.deepEqual(yAxisRange(view, OPTS, [10, 20]), { autorange: true }, "nothing in the window");
  assert.deepEqual(yAxisRange([{ name: "a", x: [1, 2], y: [5, 5] }], OPTS), { range: [4.75, 5.25], autorange: false });
  assert.deepEqual(yAxisRange(view, { ...OPTS, yRange: [0, 10] }, [3, 5]), { range: [0, 10], autorange: false }, "a fixed range wins");
  const scaled = yAxisRange(view, { ...OPTS, scale: 2 }, [4, 5]);
  assert.ok(Math.abs(scaled.range[0] - 0.4875) < 1e-9 && Math.abs(scaled.range[1] - 0.7625) < 1e-9, String(scaled.range));
});
