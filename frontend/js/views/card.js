// The frame every chart sits in: a titled card with optional tools and the plot element
// (data-chart="<id>"; the chart sets data-points / data-nonfinite / data-empty on it).

import { h } from "../dom.js";

/**
 * @param {{id: string, title: string, help?: string, tools?: Node[], wide?: boolean, legend?: Node}} o
 * @returns {{card: HTMLElement, plot: HTMLElement, help: HTMLElement}}
 */
export function chartCard({ id, title, help = "", tools = [], wide = false, legend = null }) {
  const titleId = `title-${id}`;
  const helpEl = h("p", { class: "card-help" }, help);
  const plot = h("div", { class: "chart", dataset: { chart: id, points: "0", empty: "Loading…" }, role: "img", "aria-labelledby": titleId });
  const card = h("section", { class: `card${wide ? " card-wide" : ""}`, dataset: { card: id }, "aria-labelledby": titleId },
    h("header", { class: "card-head" },
      h("div", { class: "card-titles" }, h("h2", { id: titleId }, title), helpEl),
      h("div", { class: "card-tools" }, tools)),
    legend,
    plot);
  return { card, plot, help: helpEl };
}

/** A small checkbox toggle for a card's tools ("log"). */
export function toggle(label, checked, onChange, title = "") {
  const input = h("input", { type: "checkbox", checked, onchange: (e) => onChange(e.target.checked) });
  return h("label", { class: "toggle", title }, input, h("span", {}, label));
}
