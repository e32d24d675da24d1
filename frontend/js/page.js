// What the pages (pages/*.js) share: the notice for a server that does not answer, the zoom every
// chart of a page shows, and the hook through which tests read what the DOM does not show.

import { h, notice } from "./dom.js";

/** The notice for an unreachable server: its title, then `after` (what the page does about it). */
export function unreachableNotice(...after) {
  return notice("error", "The gradwatch server is unreachable", h("p", {}, ...after));
}

/** "Start it with `gradwatch serve`": the first words of most unreachable notices. */
export const startIt = () => ["Start it with ", h("code", {}, "gradwatch serve")];

/**
 * The zoom shared by every chart of a page: `range` ([lo, hi] in the x axis's `unit`, null: all)
 * goes in `state.xRange`, is said in the top bar's `note` (views/zoom-note.js), and is drawn by
 * each of `charts` that can (setXRange).
 */
export function shareXRange(state, note, charts, range, unit = "steps") {
  state.xRange = range;
  note.render(range, unit);
  for (const c of charts) if (c.setXRange) c.setXRange(range);
}

/**
 * The test hook: `window.gradwatch` holds `what` (the run page: its state and views). The browser
 * tests (tests/browser) and benchmarks/dashboard.py read a chart's drawn series and the page's
 * state through it, where the DOM does not show them; nothing else should: it is no API.
 */
export function exposeForTests(what) {
  window.gradwatch = what;
}
