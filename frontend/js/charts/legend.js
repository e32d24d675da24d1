// A line chart's legend in HTML, laid over the top of the chart, instead of Plotly's. Plotly
// fits its own legend by growing the chart's top margin after a first pass, and that costs a
// second full draw of the chart; this legend is laid out by the browser before Plotly draws,
// and the chart reserves its height as the top margin, so each chart draws once. Names are
// text nodes (names from runs are never markup). A click hides or shows an entry's traces; a
// double click shows that entry alone (or everything again), as Plotly's legend does.

import { h, setChildren } from "../dom.js";

/**
 * @typedef {{key: string, name: string, color: string, kind?: "line"|"nonfinite"|"zero"}} Entry
 */

export class Legend {
  /**
   * @param {HTMLElement} el  the chart element (position: relative); the legend goes inside it
   * @param {(hidden: Set<string>) => void} onToggle  called with the keys now hidden
   */
  constructor(el, onToggle) {
    this.hidden = new Set();
    this.entries = [];
    this.onToggle = onToggle;
    this.el = h("ul", { class: "chart-legend", "aria-label": "Series" });
    el.appendChild(this.el);
  }

  /** Show `entries` (none: no legend). Keys hidden before stay hidden if still there. */
  render(entries) {
    this.entries = entries;
    setChildren(this.el, entries.map((e) => h("li", {},
      h("button", {
        type: "button", class: "legend-item", dataset: { key: e.key }, "aria-pressed": String(!this.hidden.has(e.key)),
        title: "Click: hide or show; double-click: show only this",
        onclick: () => this.toggle(e.key),
        ondblclick: () => this.isolate(e.key),
      }, h("span", { class: `legend-mark legend-${e.kind || "line"}`, style: `--mark:${e.color}`, "aria-hidden": "true" }),
      h("span", { class: "legend-name" }, e.name)))));
  }

  /** Pixels the legend takes at the top of the chart (0 when empty). */
  height() {
    return this.entries.length ? this.el.offsetHeight : 0;
  }

  toggle(key) {
    if (this.hidden.has(key)) this.hidden.delete(key);
    else this.hidden.add(key);
    this.changed();
  }

  isolate(key) {
    const others = this.entries.map((e) => e.key).filter((k) => k !== key);
    const alone = !this.hidden.has(key) && others.every((k) => this.hidden.has(k));
    this.hidden = new Set(alone ? [] : others);
    this.changed();
  }

  changed() {
    for (const b of this.el.querySelectorAll(".legend-item")) b.setAttribute("aria-pressed", String(!this.hidden.has(b.dataset.key)));
    this.onToggle(this.hidden);
  }
}
