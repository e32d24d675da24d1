// Pure logic of the pages and views: importing a page runs nothing (its HTML calls init()).
import assert from "node:assert/strict";
import { test } from "node:test";

import { runLabel } from "../../frontend/js/pages/compare.js";
import { SORTS, visibleRuns } from "../../frontend/js/pages/runs.js";
import { sharedXRange, sharedYRange, xValues } from "../../frontend/js/views/compare-card.js";
import { countFindings } from "../../frontend/js/views/compare-settings.js";
import { parseTags } from "../../frontend/js/views/run-dialogs.js";
import { stateCard, stateNormMetrics } from "../../frontend/js/views/run-views.js";

const RUNS = [
  { id: "a", name: "Alpha", project: "p1", status: "finished", steps: 10, created_at: 1, tags: ["base"] },
  { id: "b", name: "beta", project: "p2", status: "running", steps: 30, created_at: 3, tags: [], optimizer: "SGD" },
  { id: "c", name: "Gamma", project: "p1", status: "crashed", steps: 20, created_at: 2, tags: ["base", "lr"] },
];
const ALL = { text: "", project: "", status: "", tag: "", sort: "created", dir: "desc" };

test("visibleRuns: newest first by default; each filter narrows; text matches case-insensitively", () => {
  assert.deepEqual(visibleRuns(RUNS, ALL).map((r) => r.id), ["b", "c", "a"]);
  assert.deepEqual(visibleRuns(RUNS, { ...ALL, project: "p1" }).map((r) => r.id), ["c", "a"]);
  assert.deepEqual(visibleRuns(RUNS, { ...ALL, tag: "lr" }).map((r) => r.id), ["c"]);
  assert.deepEqual(visibleRuns(RUNS, { ...ALL, status: "running" }).map((r) => r.id), ["b"]);
  assert.deepEqual(visibleRuns(RUNS, { ...ALL, text: " sgd " }).map((r) => r.id), ["b"]);
  assert.deepEqual(visibleRuns(RUNS, { ...ALL, text: "BASE" }).map((r) => r.id), ["c", "a"]);
});

test("visibleRuns: every column sorts both ways", () => {
  assert.deepEqual(visibleRuns(RUNS, { ...ALL, sort: "name", dir: "asc" }).map((r) => r.id), ["a", "b", "c"]);
  assert.deepEqual(visibleRuns(RUNS, { ...ALL, sort: "steps", dir: "asc" }).map((r) => r.id), ["a", "c", "b"]);
  assert.deepEqual(visibleRuns(RUNS, { ...ALL, sort: "steps", dir: "desc" }).map((r) => r.id), ["b", "c", "a"]);
  assert.deepEqual(Object.keys(SORTS), ["name", "project", "status", "steps", "created", "duration"]);
});

test("parseTags: trimmed, no empties, no repeats", () => {
  assert.deepEqual(parseTags(" a, b,,a , c "), ["a", "b", "c"]);
  assert.deepEqual(parseTags(""), []);
});

test("stateNormMetrics: every optimizer-state norm the run has, known ones first, never grad/param/update norms", () => {
  const params = ["grad_norm", "param_norm", "update_norm", "update_ratio", "grad_status", "zeta_norm",
    "square_avg_norm", "momentum_buffer_norm", "exp_avg_sq_norm", "exp_avg_norm", "_norm"];
  assert.deepEqual(stateNormMetrics(params),
    ["exp_avg_norm", "exp_avg_sq_norm", "momentum_buffer_norm", "square_avg_norm", "zeta_norm"]);
  assert.deepEqual(stateNormMetrics(["sum_norm", "acc_delta_norm", "max_exp_avg_sq_norm"]),
    ["max_exp_avg_sq_norm", "sum_norm", "acc_delta_norm"]);
});

test("stateCard: titles for known keys, a readable default for others, ids from the metric", () => {
  assert.deepEqual(stateCard("momentum_buffer_norm").id, "momentum-buffer-norm");
  assert.equal(stateCard("momentum_buffer_norm").title, "Momentum buffer norm");
  assert.equal(stateCard("exp_avg_norm").id, "exp-avg-norm");
  assert.equal(stateCard("sum_norm").title, "Adagrad sum of squares");
  const other = stateCard("prev_grad_norm");
  assert.equal(other.title, "Optimizer state prev grad");
  assert.match(other.help, /prev_grad/);
});

test("stateCard: what a state is for the optimizers whose state means something else", () => {
  assert.match(stateCard("z_norm", "AdamWScheduleFree").help, /y, where gradients are taken/);
  assert.match(stateCard("state1_norm", "PagedAdamW8bit").help, /dequantizes/);
  assert.match(stateCard("exp_avg_norm", "AdamW4bit").help, /dequantized/);
  assert.match(stateCard("exp_avg_sq_norm", "Muon+SOAP").help, /eigenbasis/);
  assert.match(stateCard("momentum_buffer_norm", "Muon+AdamW").help, /updates=True/);
  assert.equal(stateCard("exp_avg_norm", "AdamW").help, stateCard("exp_avg_norm").help); // a plain Adam: no note
  assert.doesNotMatch(stateCard("exp_avg_norm", "MyAdamW8bitLike").help, /dequantized/); // whole class names only
});

test("compare: labels told apart by id, finding counts", () => {
  const runs = [{ id: "1", name: "n" }, { id: "2", name: "n" }, null, { id: "4", name: "m" }];
  const ids = ["1", "2", "gone", "4"];
  assert.deepEqual([0, 1, 2, 3].map((i) => runLabel(runs, ids, i)), ["n (1)", "n (2)", "gone", "m"]);
  assert.deepEqual(countFindings([{ severity: "error" }, { severity: "info" }, { severity: "error" }]), { error: 2, warning: 0, info: 1 });
  assert.equal(countFindings(null), null);
});

test("compare: x by step or by seconds since the first step; shared ranges pad and skip what cannot be drawn", () => {
  const d = { step: [1, 2], time: [100.5, 101.25], time0: 100 };
  assert.deepEqual(xValues(d, "step"), [1, 2]);
  assert.deepEqual(xValues(d, "time"), [0.5, 1.25]);
  assert.deepEqual(xValues({ ...d, time0: null }, "time"), []);
  assert.deepEqual(sharedXRange([{ x: [3, null, 1] }, { x: [7] }]), [1, 7]);
  assert.deepEqual(sharedXRange([{ x: [5] }]), [4, 6]);
  assert.deepEqual(sharedYRange([{ y: [0, 10, NaN] }], false), [-0.5, 10.5]);
  const [lo, hi] = sharedYRange([{ y: [0, 1, 100] }], true);
  assert.ok(lo < 1 && lo > 0.5 && hi > 100 && hi < 200, `${lo} ${hi}`);
  assert.equal(sharedYRange([{ y: [null] }], false), null);
});

test("matchParams: substring, case-insensitive; the exact name, then prefixes, then the rest in the run's order", async () => {
  const { matchParams } = await import("../../frontend/js/views/params.js");
  const names = ["blocks.0.head.weight", "head.bias", "head", "lm_head.weight", "tok.weight"];
  assert.deepEqual(matchParams(names, "HEAD"), ["head", "head.bias", "blocks.0.head.weight", "lm_head.weight"]);
  assert.deepEqual(matchParams(names, " tok "), ["tok.weight"]);
  assert.deepEqual(matchParams(names, "nope"), []);
  assert.deepEqual(matchParams(names, "  "), []);
});

test("urlRange: ?from=&to= in either order; nothing when one is missing or not a number", async () => {
  const { urlRange } = await import("../../frontend/js/views/zoom.js");
  assert.deepEqual(urlRange("100", "50"), [50, 100]);
  assert.deepEqual(urlRange("5", "7.5"), [5, 7.5]);
  assert.equal(urlRange("5", null), null);
  assert.equal(urlRange("x", "7"), null);
  assert.equal(urlRange("", "7"), null);
});

test("groups: lr/G named by its group, across optimizers; runs' groups matched by name", async () => {
  const { lrLabel, sharedGroups } = await import("../../frontend/js/groups.js");
  const one = [{ optimizer: 0, index: 1, name: "no_decay" }, { optimizer: 0, index: 0, name: null }];
  assert.equal(lrLabel(one, "lr/0"), "group 0");
  assert.equal(lrLabel(one, "lr/1"), "no_decay");
  assert.equal(lrLabel(one, "lr/2"), "group 2");
  const two = [{ optimizer: 0, index: 0, name: "g" }, { optimizer: 1, index: 0, name: null }];
  assert.equal(lrLabel(two, "lr/1"), "optimizer 1 · group 0");
  assert.deepEqual(sharedGroups([one, [{ optimizer: 0, index: 0, name: "no_decay" }], null]), [
    { label: "group 0", at: [0, -1, 0] },
    { label: "no_decay", at: [1, 0, -1] },
  ]);
});

test("names: the user's scalars apart from the hook's; the first to show; what most runs share", async () => {
  const { firstScalar, isUserScalar, mostShared } = await import("../../frontend/js/names.js");
  assert.deepEqual(["loss", "acc", "backward_passes", "lr/0", "mem/rss_bytes", "amp/scale", "opt/1/steps", "hook/train_s",
    "grad_norm_total"].map(isUserScalar), [true, true, false, false, false, false, false, false, false]);
  assert.equal(firstScalar(["amp/scale", "backward_passes", "val/acc"]), "val/acc");
  assert.equal(firstScalar(["amp/scale", "backward_passes"]), "amp/scale");
  assert.equal(firstScalar([]), null);
  assert.equal(mostShared([["a", "w"], ["w"], ["w", "a", "a"]]), "w", "in every run");
  assert.equal(mostShared([["x"], ["y", "z"], null, ["z"]]), "z", "in most runs");
  assert.equal(mostShared([["backward_passes", "acc"], ["backward_passes", "acc"]], isUserScalar), "acc", "a user's first");
  assert.equal(mostShared([null, []]), null);
});

test("spread: the largest positive finite value over the smallest", async () => {
  const { spread } = await import("../../frontend/js/views/scalars.js");
  assert.equal(spread([{ y: [2, 4] }, { y: [400, NaN, null, 0, -5] }]), 200);
  assert.equal(spread([{ y: [] }]), 1);
});
