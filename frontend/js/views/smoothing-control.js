// The smoothing slider of the run page: TensorBoard's EMA weight, 0 (off) to 0.99, applied to
// every line chart (smoothing.js); the page keeps it in the URL (?smooth=).

import { h } from "../dom.js";
import { MAX_SMOOTH, smoothWeight } from "../smoothing.js";

/** @param {number} initial @param {(weight: number) => void} onChange  called when the slider is let go */
export function smoothingControl(initial, onChange) {
  const out = h("output", { class: "smoothing-value" }, initial ? initial.toFixed(2) : "off");
  const input = h("input", {
    type: "range", min: "0", max: String(MAX_SMOOTH), step: "0.01", value: String(initial),
    "aria-label": "Smoothing (exponential moving average weight)", dataset: { smoothing: "" },
    oninput: (e) => { const w = smoothWeight(e.target.value); out.textContent = w ? w.toFixed(2) : "off"; },
    onchange: (e) => onChange(smoothWeight(e.target.value)),
  });
  return h("label", { class: "smoothing", dataset: { control: "smooth" }, title: "Smooth every line chart with TensorBoard's debiased exponential moving average; the raw values stay faint behind" },
    "Smoothing", input, out);
}
