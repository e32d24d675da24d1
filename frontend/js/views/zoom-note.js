// What a zoom shows and how to leave it, said in the top bar, where it covers nothing (Plotly's
// own "Double-click to zoom back out" toast sits over the page's top right corner: it is off,
// charts/theme.js's baseConfig).

import { h } from "../dom.js";
import { fmtNum } from "../format.js";

/**
 * The note, placed in the page's top bar; render(range) shows it for a zoom ([lo, hi] in the
 * x axis's `unit`) or hides it (null); its button calls onReset.
 */
export function zoomNote(onReset) {
  const text = h("span", { class: "zoom-note-text" });
  const button = h("button", { type: "button", class: "btn btn-small", onclick: () => onReset() }, "Show all");
  const el = h("div", { class: "zoom-note", role: "status", hidden: true }, text, button);
  const fill = document.querySelector(".topbar .topbar-fill");
  if (fill) fill.before(el);
  return {
    el,
    render(range, unit = "steps") {
      el.hidden = !range;
      if (!range) return;
      const [lo, hi] = [Math.min(range[0], range[1]), Math.max(range[0], range[1])];
      const num = (v) => (unit === "steps" ? String(Math.round(v)) : fmtNum(v, 4));
      text.textContent = `Zoomed to ${unit} ${num(lo)}–${num(hi)} · double-click a chart to zoom out`;
      button.setAttribute("aria-label", `Show all ${unit}`);
    },
  };
}
