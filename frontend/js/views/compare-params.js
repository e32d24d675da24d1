// The compare page's parameter picker: a per-parameter metric, a name box (with every name
// of the runs as suggestions), and a chip per chosen parameter saying in how many runs it is.

import { h, setChildren } from "../dom.js";

/**
 * @param {{maxParams: number, onMetric: (metric: string) => void, onAdd: (name: string) => void,
 *          onRemove: (name: string) => void}} on
 */
export function compareParamPicker({ maxParams, onMetric, onAdd, onRemove }) {
  const metricSelect = h("select", {
    class: "input input-small", "aria-label": "Per-parameter metric",
    onchange: (e) => onMetric(e.target.value),
  });
  const input = h("input", {
    class: "input", type: "search", list: "compare-param-names", placeholder: "Parameter name…",
    "aria-label": "Parameter to show for every run that has it", autocomplete: "off", spellcheck: "false",
  });
  const names = h("datalist", { id: "compare-param-names" });
  const chips = h("div", { class: "chips", "aria-label": "Parameters shown" });
  const message = h("span", { class: "picker-error", role: "status" });
  const card = h("section", { class: "card card-wide", dataset: { card: "compare-params" }, "aria-labelledby": "title-compare-params" },
    h("header", { class: "card-head" },
      h("div", { class: "card-titles" }, h("h2", { id: "title-compare-params" }, "Parameters, matched by name"),
        h("p", { class: "card-help" }, `Pick a parameter name: it is drawn for every run that has it (up to ${maxParams})`)),
      h("div", { class: "card-tools" }, metricSelect)),
    h("div", { class: "picker" },
      h("form", { class: "picker-form", onsubmit: (e) => { e.preventDefault(); onAdd(input.value.trim()); } },
        input, names, h("button", { type: "submit", class: "btn" }, "Show")),
      chips, message));

  return {
    card,
    input,
    /** Say why a name was not added ("" clears it). */
    say: (text) => { message.textContent = text; },
    /**
     * @param {{metrics: string[], metric: string|null, names: string[], chosen: string[],
     *          having: (name: string) => number, runs: number}} v
     */
    render(v) {
      setChildren(metricSelect, v.metrics.map((m) => h("option", { value: m, selected: m === v.metric }, m)));
      setChildren(names, v.names.map((n) => h("option", { value: n })));
      setChildren(chips, v.chosen.map((n) => h("span", { class: "chip", dataset: { param: n } },
        h("span", { class: "chip-name" }, n),
        h("span", { class: "muted" }, `${v.having(n)}/${v.runs}`),
        h("button", { type: "button", class: "chip-x", "aria-label": `Remove ${n}`, onclick: () => onRemove(n) }, "×"))));
      card.hidden = !v.names.length || !v.metrics.length;
    },
  };
}
