// The run page's cards, in page order: which view draws what, with which words, and when
// a card applies to a run. pages/run.js loads them and feeds them live steps.

import { h } from "../dom.js";
import { lrLabel } from "../groups.js";
import { findingsView } from "./findings.js";
import { heatmapView } from "./heatmaps.js";
import { paramMetricView } from "./params.js";
import { createRanksViews } from "./ranks.js";
import { runContextView } from "./run-context.js";
import { scalarView } from "./scalars.js";
import { spreadView } from "./spread.js";

const KNOWN_SCALAR = /^(loss|grad_norm_total|lr\/.*|mem\/.*)$/;
const MEM_ORDER = ["mem/params_bytes", "mem/grads_bytes", "mem/optimizer_bytes", "mem/zero_grad_bytes"];
const MEM_LABEL = {
  "mem/params_bytes": "parameters", "mem/grads_bytes": "gradients", "mem/optimizer_bytes": "optimizer state",
  "mem/zero_grad_bytes": "zero-filled grads", "mem/rss_bytes": "process RSS",
};
const memRank = (k) => (MEM_ORDER.includes(k) ? MEM_ORDER.indexOf(k) : k.startsWith("mem/cuda") ? 10 : 20);
const lrGroup = (k) => Number(k.slice(3));

/**
 * @param {object} state  the run page's state (read only here)
 * @param {{onXRange: Function, onSelect: (names: string[]) => void, onParam: (name: string) => void,
 *          onModule: (path: string) => void, onTop: (k: number, order: string) => void,
 *          onOtherScalar: (key: string) => void, onFindings: (list: object[]) => void,
 *          onRanks: () => void, onPartial: (ranges: object[]) => void}} on
 *   onRanks: the ranks drawn were chosen (state.ranksChosen); onPartial: a distributed run's partial ranges
 * @returns {{views: Object<string, object>, present: Object<string, () => boolean>,
 *            otherSelect: HTMLSelectElement, otherScalars: () => string[],
 *            addStateViews: (params: string[]) => object[]}}
 *   The optimizer-state cards are made by addStateViews once the run's metric names are known.
 */
export function createRunViews(state, { onXRange, onSelect, onParam, onModule, onTop, onOtherScalar, onFindings, onRanks, onPartial }) {
  const otherSelect = h("select", {
    class: "input input-small", "aria-label": "Scalar to show",
    onchange: (e) => onOtherScalar(e.target.value),
  });

  const views = {
    findings: findingsView({
      onParam, onFindings,
      onIncident: (range, params) => { params.forEach(onParam); onXRange(range); },
      // A rank's own run of a distributed job is not diagnosed: its job's run is, on the global values.
      emptyText: () => (state.run && state.run.parent_id != null
        ? "No findings: a rank's own run is not diagnosed; its job's run has the findings" : "No problems found"),
    }),
    context: runContextView(),
    gradTotal: scalarView({
      id: "grad-norm-total", title: "Total gradient norm", help: "‖grad‖₂ over all parameters, as the step used it",
      keys: (s) => (s.includes("grad_norm_total") ? ["grad_norm_total"] : []), label: () => "total gradient norm",
      log: true, emptyText: "No total gradient norm in this run", onXRange,
    }),
    loss: scalarView({
      id: "loss", title: "Loss", help: "As the training script reported it",
      keys: (s) => (s.includes("loss") ? ["loss"] : []), label: () => "loss",
      emptyText: "This run reports no loss", onXRange,
    }),
    paramNorms: paramMetricView({
      id: "param-grad-norm", title: "Gradient norm per parameter", help: "‖grad‖₂ of each parameter tensor",
      metric: "grad_norm", picker: true, wide: true, onXRange, onSelect, onModule, onTop,
    }),
    spread: spreadView({
      id: "grad-norm-spread", metric: "grad_norm", title: "Gradient norm spread across parameters",
      help: "At each step: median line, quartiles (dark band) and min–max (light band) of every parameter's ‖grad‖₂", onXRange,
    }),
    status: heatmapView({
      id: "grad-status", metric: "grad_status", title: "Gradient buffer status",
      help: "What each parameter's .grad held when the optimizer stepped; rows grouped by module", onXRange,
    }),
    normMap: heatmapView({
      id: "grad-norm-heatmap", metric: "grad_norm", label: "‖grad‖", title: "Gradient norm heatmap",
      help: "‖grad‖₂ per parameter and step, log colour scale, rows grouped by module; red: NaN/Inf, grey: exactly zero", onXRange,
    }),
    updateRatio: paramMetricView({
      id: "update-ratio", metric: "update_ratio", title: "Update size ÷ parameter size",
      help: "‖Δθ‖ / ‖θ‖ of each step; around 1e-3 is typical", onXRange, rankBy: "grad_norm",
    }),
    lr: scalarView({
      id: "lr", title: "Learning rate", help: "Per parameter group",
      keys: (s) => s.filter((k) => /^lr\/\d+$/.test(k)).sort((a, b) => lrGroup(a) - lrGroup(b)),
      label: (k) => lrLabel(state.groups, k), emptyText: "No learning rate reported", onXRange,
    }),
    memory: scalarView({
      id: "memory", title: "Memory", help: "Parameters, gradients and optimizer state; CUDA when used",
      keys: (s) => s.filter((k) => k.startsWith("mem/")).sort((a, b) => memRank(a) - memRank(b) || a.localeCompare(b)),
      label: (k) => MEM_LABEL[k] || k.slice(4).replace("/", " "), bytes: true, emptyText: "No memory figures in this run", onXRange,
      logWhenSpread: 100, // process RSS beside a small model's parameters: both readable
    }),
    // A distributed run's ranks: a card and a chart per per-rank figure (views/ranks.js).
    ...createRanksViews(state, { onXRange, onRanks, onPartial }),
    other: scalarView({
      id: "other-scalars", title: "Other scalars", help: "Any other value the run reports",
      keys: (s) => (state.otherScalar && s.includes(state.otherScalar) ? [state.otherScalar] : []),
      label: (k) => k, wide: true, extraTools: [otherSelect], onXRange,
    }),
  };

  views.updateRatio.follows = true; // it shows the parameters the gradient-norm chart shows

  /** Which cards this run has data for. */
  const present = {
    spread: () => state.metrics.params.includes("grad_norm") && state.params.length > 1,
    updateRatio: () => state.metrics.params.includes("update_ratio"),
    lr: () => views.lr.keysFor(state.metrics.scalars).length > 0,
    memory: () => views.memory.keysFor(state.metrics.scalars).length > 0,
    other: () => otherScalars().length > 0,
  };
  // The job's run of a distributed run (never a rank's own run) has the Ranks section.
  const distributed = () => Boolean(state.run && state.run.world_size > 1 && state.run.parent_id == null);
  for (const name of Object.keys(views)) if (name === "ranks" || name.startsWith("rank-")) present[name] = distributed;
  const otherScalars = () => state.metrics.scalars.filter((k) => !KNOWN_SCALAR.test(k)).sort();

  /**
   * A card for each optimizer-state norm of `params` that has none yet (in stateNormMetrics'
   * order), added to `views` and `present`; returns the new views, for the page to place.
   */
  const addStateViews = (params) => stateNormMetrics(params).filter((m) => !views[stateKey(m)]).map((metric) => {
    const { id, title, help } = stateCard(metric, state.run && state.run.optimizer);
    const view = paramMetricView({ id, metric, title, help, onXRange, rankBy: "grad_norm" });
    view.follows = true;
    views[stateKey(metric)] = view;
    present[stateKey(metric)] = () => state.metrics.params.includes(metric);
    return view;
  });

  return { views, present, otherSelect, otherScalars, addStateViews };
}

const stateKey = (metric) => `state:${metric}`;

/** Per-parameter metrics named `*_norm` that are not optimizer state. */
const NOT_STATE = new Set(["grad_norm", "param_norm", "update_norm"]);

/**
 * Display words for the state keys of torch's optimizers; any other key gets stateCard's
 * default, so a new optimizer's state is drawn too.
 */
export const STATE_TITLES = {
  exp_avg: ["Adam first moment ‖m‖", "Norm of exp_avg, the running mean of gradients"],
  exp_avg_sq: ["Adam second moment ‖v‖", "Norm of exp_avg_sq, the running mean of squared gradients"],
  max_exp_avg_sq: ["AMSGrad max second moment", "Norm of max_exp_avg_sq, the largest exp_avg_sq so far"],
  exp_inf: ["Adamax infinity norm ‖u‖", "Norm of exp_inf, Adamax's running max of |gradient|"],
  momentum_buffer: ["Momentum buffer norm", "Norm of SGD's momentum_buffer"],
  square_avg: ["RMSprop square average", "Norm of square_avg, the running mean of squared gradients"],
  grad_avg: ["RMSprop gradient average", "Norm of grad_avg, centered RMSprop's running mean of gradients"],
  sum: ["Adagrad sum of squares", "Norm of sum, the accumulated squared gradients"],
  acc_delta: ["Adadelta accumulated update", "Norm of acc_delta, the running mean of squared updates"],
  z: ["Schedule-free base sequence ‖z‖", "Norm of z, schedule-free's base iterate; the parameter norm is y, where gradients are taken (train mode), not x (eval mode)"],
  state1: ["8-bit first state ‖state1‖", "Norm of bitsandbytes' state1 as it dequantizes it: Adam's exp_avg, or the momentum"],
  state2: ["8-bit second state ‖state2‖", "Norm of bitsandbytes' state2 as it dequantizes it: Adam's exp_avg_sq"],
};

/** What an optimizer's state is beside its key (`optimizer`: the run's, "+"-joined class names). */
const STATE_NOTES = [
  [/(^|\+)(AdamW8bit|AdamW4bit|AdamWFp8|PagedAdamW8bit)($|\+)/, /^(exp_avg|exp_avg_sq)$/, "; stored quantized: the norm is of its dequantized values"],
  [/(^|\+)SOAP($|\+)/, /^(exp_avg|exp_avg_sq)$/, "; SOAP keeps it in its preconditioner's eigenbasis"],
  [/(^|\+)Muon($|\+)/, /^momentum_buffer$/, "; Muon's update is not derived from it: watch with updates=True for the parameter's change"],
];
const STATE_ORDER = Object.keys(STATE_TITLES);

/** The optimizer-state norms among a run's per-parameter metrics: known keys first, in STATE_TITLES' order, then the rest by name. */
export function stateNormMetrics(params) {
  const rank = (m) => {
    const i = STATE_ORDER.indexOf(m.slice(0, -"_norm".length));
    return i < 0 ? STATE_ORDER.length : i;
  };
  return params.filter((m) => m.endsWith("_norm") && m.length > "_norm".length && !NOT_STATE.has(m))
    .sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
}

/** A state norm's card: {id, title, help}; the id is the metric with dashes (exp_avg_norm: exp-avg-norm). */
export function stateCard(metric, optimizer = "") {
  const key = metric.slice(0, -"_norm".length);
  const [title, help] = STATE_TITLES[key] || [`Optimizer state ${key.replace(/_/g, " ")}`, `Norm of the optimizer's ${key} state`];
  const notes = STATE_NOTES.filter(([opt, keys]) => opt.test(optimizer || "") && keys.test(key)).map(([, , note]) => note);
  return { id: metric.replace(/[^A-Za-z0-9]+/g, "-"), title, help: help + notes.join("") };
}
