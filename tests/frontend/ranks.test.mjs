// ranks.js: the per-rank view's pure parts (ranks drawn, memory key, straggler, words).
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  drawsSpread, findStraggler, listRanks, MAX_SHOWN_RANKS, median, outliersText, parseRanks, partialText, rankMemoryKey,
  ranksBadgeText, shownRanks, SMALL_JOB_RANKS, spreadSeries,
} from "../../frontend/js/ranks.js";

test("ranksBadgeText: a badge from 2 ranks on, none for a single process or an old server", () => {
  assert.equal(ranksBadgeText(2), "2 ranks");
  assert.equal(ranksBadgeText(64), "64 ranks");
  assert.equal(ranksBadgeText(1), null);
  assert.equal(ranksBadgeText(null), null);
  assert.equal(ranksBadgeText(undefined), null);
});

test("rankMemoryKey: the rank's CUDA allocated bytes (lowest device), else its RSS, else none", () => {
  assert.equal(rankMemoryKey(["mem/rss_bytes", "mem/cuda:1/allocated", "mem/cuda:1/reserved"]), "mem/cuda:1/allocated");
  assert.equal(rankMemoryKey(["mem/cuda:10/allocated", "mem/cuda:2/allocated"]), "mem/cuda:2/allocated");
  assert.equal(rankMemoryKey(["loss", "mem/rss_bytes", "mem/params_bytes"]), "mem/rss_bytes");
  assert.equal(rankMemoryKey(["loss", "mem/cuda:0/peak"]), null);
});

test("partialText and listRanks: the ranges in words", () => {
  assert.equal(partialText({ first: 38, last: 60, missing: [1] }), "steps 38-60 are missing rank 1");
  assert.equal(partialText({ first: 7, last: 7, missing: [0, 2] }), "step 7 is missing ranks 0 and 2");
  assert.equal(partialText({ first: 1, last: 2, missing: [1, 3, 4] }), "steps 1-2 are missing ranks 1, 3 and 4");
  assert.equal(listRanks([]), "");
});

test("shownRanks: every rank up to the cap; beyond, rank 0, the lost ones, then the lowest; or those chosen", () => {
  const ranks = (n, lost = []) => Array.from({ length: n }, (_, r) => ({ rank: r, lost: lost.includes(r) }));
  assert.deepEqual(shownRanks(ranks(2)), [0, 1]);
  assert.deepEqual(shownRanks(ranks(MAX_SHOWN_RANKS)), [0, 1, 2, 3, 4, 5, 6, 7]);
  assert.deepEqual(shownRanks(ranks(64, [40, 63])), [0, 1, 2, 3, 4, 5, 40, 63]);
  assert.deepEqual(shownRanks(ranks(64), [3, 17, 99]), [3, 17]); // 99 is no rank of the job
  assert.deepEqual(shownRanks(ranks(64), Array.from({ length: 20 }, (_, i) => i)).length, MAX_SHOWN_RANKS);
  assert.deepEqual(shownRanks([]), []);
});

test("parseRanks: lists and ranges, sorted without repeats; anything else is null", () => {
  assert.deepEqual(parseRanks("0-3, 17,2"), [0, 1, 2, 3, 17]);
  assert.deepEqual(parseRanks("5"), [5]);
  assert.equal(parseRanks(""), null);
  assert.equal(parseRanks(null), null);
  assert.equal(parseRanks("3-1"), null);
  assert.equal(parseRanks("a,1"), null);
  assert.equal(parseRanks("-1"), null);
});

test("median: of the finite values only", () => {
  assert.equal(median([3, 1, 2]), 2);
  assert.equal(median([4, 1, NaN, null, 2, 3, Infinity]), 2.5);
  assert.equal(median([null, NaN]), null);
});

test("findStraggler: the rank whose time before backward stands apart, by its median", () => {
  const flat = (v, n = 20) => Array.from({ length: n }, (_, i) => v * (1 + 0.05 * Math.sin(i)));
  const found = findStraggler([
    { rank: 0, values: flat(0.010) }, { rank: 1, values: flat(0.050) }, { rank: 2, values: flat(0.011) },
  ]);
  assert.equal(found.rank, 1);
  assert.ok(Math.abs(found.seconds - median(flat(0.050))) < 1e-12);
  assert.ok(Math.abs(found.others - (median(flat(0.010)) + median(flat(0.011))) / 2) < 1e-12);
  // A spike or two does not make a straggler; neither do ranks alike, nor a gap too small to matter.
  assert.equal(findStraggler([{ rank: 0, values: [0.01, 0.01, 0.5, 0.01] }, { rank: 1, values: [0.011, 0.012, 0.01, 0.011] }]), null);
  assert.equal(findStraggler([{ rank: 0, values: flat(0.02) }, { rank: 1, values: flat(0.021) }]), null);
  assert.equal(findStraggler([{ rank: 0, values: flat(0.0001) }, { rank: 1, values: flat(0.0009) }]), null);
  // One rank with values is no comparison.
  assert.equal(findStraggler([{ rank: 0, values: flat(0.01) }, { rank: 1, values: [] }]), null);
});

test("partialMarkers and markerLayout: a partial range is a faint band over its steps, named on hover", async () => {
  const { markerLayout, partialMarkers, sameMarkers } = await import("../../frontend/js/charts/markers.js");
  const markers = partialMarkers([{ first: 38, last: 60, missing: [1] }]);
  assert.deepEqual(markers, [{ step: 38, last: 60, code: "partial", severity: "warning", message: "steps 38-60 are missing rank 1" }]);
  const t = { severity: { warning: "#a86400", info: "#00f", error: "#f00" }, card: "#fff" };
  const { shapes, annotations } = markerLayout([...markers, { step: 5, code: "nonfinite_grad", severity: "error", message: "m" }], t);
  assert.equal(shapes[0].type, "rect");
  assert.deepEqual([shapes[0].x0, shapes[0].x1, shapes[0].fillcolor], [37.5, 60.5, "#a86400"]);
  assert.equal(shapes[1].type, "line");
  assert.equal(annotations[0].hovertext, "steps 38-60 are missing rank 1");
  assert.equal(annotations[1].hovertext, "step 5: m");
  // A range that grew is not the same marker.
  assert.equal(sameMarkers(markers, partialMarkers([{ first: 38, last: 61, missing: [1] }])), false);
  assert.equal(sameMarkers(markers, partialMarkers([{ first: 38, last: 60, missing: [1] }])), true);
});

test("absentRanks: the job's ranks without a run on the server", async () => {
  const { absentRanks } = await import("../../frontend/js/ranks.js");
  assert.deepEqual(absentRanks(4, [{ rank: 0 }, { rank: 2 }]), [1, 3]);
  assert.deepEqual(absentRanks(2, [{ rank: 0 }, { rank: 1 }]), []);
});

test("drawsSpread: bands past SMALL_JOB_RANKS ranks, a line per rank up to it", () => {
  assert.equal(SMALL_JOB_RANKS, 16);
  assert.equal(drawsSpread(16), false);
  assert.equal(drawsSpread(17), true);
  assert.equal(drawsSpread(1024), true);
  assert.equal(drawsSpread(null), false);
});

test("spreadSeries: two bands around the median, null (no finite value) as NaN", () => {
  const [outer, inner] = spreadSeries({ steps: [1, 2], min: [1, null], p5: [2, null], p50: [3, null], p95: [4, null], max: [5, null] });
  assert.deepEqual(outer.x, [1, 2]);
  assert.deepEqual([outer.y[0], outer.min[0], outer.max[0]], [3, 1, 5]);
  assert.deepEqual([inner.y[0], inner.min[0], inner.max[0]], [3, 2, 4]);
  assert.ok(Number.isNaN(outer.y[1]) && Number.isNaN(inner.max[1]));
});

test("outliersText: the outlier ranks in words, or that none stands apart", () => {
  assert.equal(outliersText([]), "No rank stands apart.");
  assert.equal(outliersText([{ rank: 5, median: 0.5, others: 0.1, high: true }]),
    "Outlier rank: rank 5 above (0.5; the ranks' median 0.1).");
  assert.equal(outliersText([{ rank: 5, median: 2, others: 1, high: true }, { rank: 9, median: 0, others: 1, high: false }], (v) => `${v} s`),
    "Outlier ranks: rank 5 above (2 s; the ranks' median 1 s), rank 9 below (0 s; the ranks' median 1 s).");
});
