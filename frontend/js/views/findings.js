// The findings panel (GET .../diagnostics, then live `finding` messages): what gradwatch
// noticed about the run, in plain words, most severe first, each with the step where it began,
// the number that sizes it and the parameters concerned (a click adds one to the charts).
// Every change is handed to `onFindings`, which draws the markers on the charts.

import { api } from "../api.js";
import { h, setChildren } from "../dom.js";

const ORDER = { error: 0, warning: 1, info: 2 };
const SHOWN_PARAMS = 6;
const SEVERITIES = ["error", "warning", "info"];

/**
 * @param {{onParam: (name: string) => void, onFindings?: (list: object[]) => void, emptyText?: () => string}} o
 *   emptyText: what the panel says when there is no finding ("No problems found")
 */
export function findingsView(o) {
  const count = h("span", { class: "count", "aria-live": "polite" });
  const body = h("div", { class: "findings-body" }, h("p", { class: "muted" }, "Loading findings…"));
  const card = h("section", { class: "card card-wide findings", dataset: { card: "findings" }, "aria-labelledby": "title-findings" },
    h("header", { class: "card-head" },
      h("div", { class: "card-titles" }, h("h2", { id: "title-findings" }, "Findings", count),
        h("p", { class: "card-help" }, "Common mistakes gradwatch recognises in what the optimizer saw; dotted lines on the charts mark where each began"))),
    body);
  let list = [];

  function render() {
    card.dataset.count = String(list.length);
    count.textContent = list.length ? String(list.length) : "";
    const worst = SEVERITIES.find((s) => list.some((f) => f.severity === s));
    if (worst) count.dataset.severity = worst;
    else delete count.dataset.severity;
    if (o.onFindings) o.onFindings(list);
    if (!list.length) {
      setChildren(body, h("p", { class: "findings-ok" }, h("span", { class: "ok-mark", "aria-hidden": "true" }, "✓"), o.emptyText ? o.emptyText() : "No problems found"));
      return;
    }
    const sorted = list.slice().sort((a, b) => (ORDER[a.severity] ?? 3) - (ORDER[b.severity] ?? 3)
      || (a.first_step ?? -1) - (b.first_step ?? -1));
    setChildren(body, h("ul", { class: "findings-list" }, sorted.map(finding)));
  }

  function finding(f) {
    const sev = SEVERITIES.includes(f.severity) ? f.severity : "info";
    const params = Array.isArray(f.params) ? f.params.map(String) : [];
    const paramList = h("span", { class: "finding-params" });
    const showParams = (all) => setChildren(paramList,
      (all ? params : params.slice(0, SHOWN_PARAMS)).map((p) => h("button", {
        type: "button", class: "chip chip-button", title: `Show ${p} in the charts`, onclick: () => o.onParam(p),
      }, p)),
      !all && params.length > SHOWN_PARAMS
        ? h("button", { type: "button", class: "btn-link", onclick: () => showParams(true) }, `+${params.length - SHOWN_PARAMS} more`)
        : null);
    showParams(false);
    const fig = f.figure && typeof f.figure === "object" ? f.figure : null;
    const hasStep = f.first_step !== null && f.first_step !== undefined;
    return h("li", { class: `finding sev-${sev}`, dataset: { code: String(f.code || ""), severity: sev } },
      h("span", { class: "sev" }, sev),
      h("div", { class: "finding-main" },
        h("p", { class: "finding-msg" }, String(f.message || f.code || "")),
        h("p", { class: "finding-meta" },
          h("code", {}, String(f.code || "")),
          h("span", { class: "finding-step", dataset: { step: hasStep ? String(f.first_step) : "" } },
            hasStep ? ` · from step ${f.first_step}` : " · from the start"),
          params.length ? " · " : "", paramList)),
      fig ? h("div", { class: "finding-figure", title: String(fig.label || "") },
        h("span", { class: "finding-figure-value" }, String(fig.text ?? fig.value ?? "")),
        h("span", { class: "finding-figure-label" }, String(fig.label || "")),
        // The run goes on after a finding: the figure says when it held, not how things are now.
        Number.isInteger(fig.step) ? h("span", { class: "finding-figure-step", dataset: { step: String(fig.step) } }, `at step ${fig.step}`) : null) : null);
  }

  return {
    card,
    /** The findings shown now. */
    get findings() { return list; },
    async load(ctx) {
      try {
        list = await api.diagnostics(ctx.state.runId);
        render();
      } catch (err) {
        setChildren(body, h("p", { class: "muted" }, `Findings unavailable: ${err.message}`));
      }
    },
    /** A live `finding` message: new, or a change to one already shown (same code). */
    upsert(f) {
      if (!f || typeof f !== "object" || !f.code) return;
      const i = list.findIndex((x) => x.code === f.code);
      list = i < 0 ? [...list, f] : list.map((x, j) => (j === i ? f : x));
      render();
    },
    append() {},
  };
}
