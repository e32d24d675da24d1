// The findings panel (GET .../diagnostics): what gradwatch noticed about the run, in plain
// words, most severe first. A parameter named in a finding can be added to the charts.

import { api } from "../api.js";
import { h, setChildren } from "../dom.js";

const ORDER = { critical: 0, error: 0, warning: 1, warn: 1, info: 2 };
const SHOWN_PARAMS = 6;

/** @param {{onParam: (name: string) => void}} o */
export function findingsView(o) {
  const count = h("span", { class: "count", "aria-live": "polite" });
  const body = h("div", { class: "findings-body" }, h("p", { class: "muted" }, "Loading findings…"));
  const card = h("section", { class: "card card-wide findings", dataset: { card: "findings" }, "aria-labelledby": "title-findings" },
    h("header", { class: "card-head" },
      h("div", { class: "card-titles" }, h("h2", { id: "title-findings" }, "Findings", count),
        h("p", { class: "card-help" }, "Common mistakes gradwatch recognises in what the optimizer saw"))),
    body);

  function render(list) {
    card.dataset.count = String(list.length);
    count.textContent = list.length ? String(list.length) : "";
    if (!list.length) {
      setChildren(body, h("p", { class: "findings-ok" }, h("span", { class: "ok-mark", "aria-hidden": "true" }, "✓"), "No problems found"));
      return;
    }
    const sorted = list.slice().sort((a, b) => (ORDER[a.severity] ?? 3) - (ORDER[b.severity] ?? 3));
    setChildren(body, h("ul", { class: "findings-list" }, sorted.map(finding)));
  }

  function finding(f) {
    const sev = String(f.severity || "info");
    const params = Array.isArray(f.params) ? f.params : [];
    const paramList = h("span", { class: "finding-params" });
    const showParams = (all) => setChildren(paramList,
      (all ? params : params.slice(0, SHOWN_PARAMS)).map((p) => h("button", {
        type: "button", class: "chip chip-button", title: `Show ${p} in the charts`, onclick: () => o.onParam(p),
      }, p)),
      !all && params.length > SHOWN_PARAMS
        ? h("button", { type: "button", class: "btn-link", onclick: () => showParams(true) }, `+${params.length - SHOWN_PARAMS} more`)
        : null);
    showParams(false);
    return h("li", { class: `finding sev-${/^[a-z]+$/.test(sev) ? sev : "info"}`, dataset: { code: String(f.code || "") } },
      h("span", { class: "sev" }, sev),
      h("div", { class: "finding-main" },
        h("p", { class: "finding-msg" }, String(f.message || f.code || "")),
        h("p", { class: "finding-meta" },
          h("code", {}, String(f.code || "")),
          f.first_step !== null && f.first_step !== undefined ? ` · from step ${f.first_step}` : "",
          params.length ? " · " : "", paramList)));
  }

  return {
    card,
    async load(ctx) {
      try {
        render(await api.diagnostics(ctx.state.runId));
      } catch (err) {
        setChildren(body, h("p", { class: "muted" }, `Findings unavailable: ${err.message}`));
      }
    },
    append() {},
  };
}
