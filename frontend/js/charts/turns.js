// Whose turn it is to draw. Every full draw of a chart (new data, a zoomed window, the log
// toggle, a theme) waits here: one chart per task, so that the browser paints and answers
// input between charts rather than after a dozen of them; the chart nearest to the view first
// (in view: distance 0), so the charts that can be seen come first and a chart scrolled to
// jumps the queue. Each turn is a task at once, not an idle callback: while a page loads the
// browser is seldom idle, and waiting for it put off the last charts by about 300 ms
// (benchmarks/dashboard.py). Turns start once Plotly has loaded; while a page loads, the charts
// in view draw before any other, whichever answer comes first (inViewFirst). A chart waiting
// for its turn draws once, however many draws it was asked for.

import { whenPlotly } from "./theme.js";

const VIEW_MARGIN_PX = 200;   // this close to the view counts as in view

const waiting = new Map(); // chart element -> {promise, resolve}
let planned = false;
let gate = null;            // while set: {cards}, the only cards whose charts get a turn (inViewFirst)

/**
 * Only the charts in `cards` (those in view) get a turn until `drawn` (their drawing) settles:
 * every chart's data is asked for at once, and one below the fold whose answer comes first
 * must not draw before those the reader sees.
 */
export function inViewFirst(drawn, cards) {
  const mine = { cards };
  gate = mine;
  Promise.resolve(drawn).catch(() => {}).then(() => {
    if (gate === mine) gate = null;
    plan();
  });
}

/** Resolves when it is the turn of the chart in `el` to draw (at once if Plotly is there and nothing waits). */
export function drawTurn(el) {
  let entry = waiting.get(el);
  if (!entry) {
    entry = {};
    entry.promise = new Promise((resolve) => { entry.resolve = resolve; });
    waiting.set(el, entry);
    plan();
  }
  return entry.promise;
}

/** Whether `el` is in view, or near it. */
export function nearView(el) {
  return distance(el) === 0;
}

/** Pixels between `el` and the view (0: in view, or near it). */
function distance(el) {
  const r = el.getBoundingClientRect();
  if (!r.width && !r.height) return Infinity; // hidden: last
  const above = -VIEW_MARGIN_PX - r.bottom;
  const below = r.top - (innerHeight + VIEW_MARGIN_PX);
  return Math.max(0, above, below);
}

function plan() {
  if (planned || !waiting.size) return;
  planned = true;
  whenPlotly().then(() => nextTask(give), () => { planned = false; }); // no Plotly: the page says so (pages/run.js)
}

/** The chart nearest to the view draws now (in this task's microtasks); the next turn comes after. */
function give() {
  planned = false;
  let best = null;
  let bestDistance = Infinity;
  for (const el of waiting.keys()) {
    if (gate && !gate.cards.some((card) => card.contains(el))) continue;
    const d = distance(el);
    if (!best || d < bestDistance) [best, bestDistance] = [el, d];
  }
  if (!best) return; // a gate plans again when it opens
  const entry = waiting.get(best);
  waiting.delete(best);
  entry.resolve();
  nextTask(plan);
}

/** Run `fn` in a task of its own, without setTimeout's minimum delay. */
function nextTask(fn) {
  const channel = new MessageChannel();
  channel.port1.onmessage = () => fn();
  channel.port2.postMessage(null);
}
