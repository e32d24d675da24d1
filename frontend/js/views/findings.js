// The findings panel (GET .../diagnostics, then live `finding` messages): what gradwatch
// noticed about the run, in plain words, most severe first, each with the step where it began,
// the number that sizes it and the parameters concerned (a click adds one to the charts).
// Every change is handed to `onFindings`, which draws the markers on the charts.
// An instability finding (its figure has `evidence`: grad_norm_spike, large_update,
// adam_epsilon_regime, loss_spike) opens an incident view: the parameters ranked by how early and
// how far they moved, the loss beside them, and a button that zooms every chart to the steps
// around the incident (full resolution) with the first movers added to the charts.

import { api } from "../api.js";
import { h, setChildren } from "../dom.js";

const ORDER = { error: 0, warning: 1, info: 2 };
const SHOWN_PARAMS = 6;
const SEVERITIES = ["error", "warning", "info"];

const INCIDENT_BEFORE = 24; // steps shown before an incident, and after it
const INCIDENT_AFTER = 8;
const INCIDENT_CHARTED = 3; // first movers added to the charts

/**
 * @param {{onParam: (name: string) => void, onFindings?: (list: object[]) => void, emptyText?: () => string,
 *          onIncident?: (range: number[], params: string[]) => void}} o
 *   emptyText: what the panel says when there is no finding ("No problems found")
 *   onIncident: zoom the charts to `range` and show `params` (an incident view's button)
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
        Number.isInteger(fig.step) ? h("span", { class: "finding-figure-step", dataset: { step: String(fig.step) } }, `at step ${fig.step}`) : null) : null,
      fig && fig.evidence && typeof fig.evidence === "object" ? incident(fig.evidence) : null);
  }

  /** The incident view of an instability finding's evidence (diagnostics/spikes.py). */
  function incident(ev) {
    const at = Number.isInteger(ev.step) ? ev.step : null;
    if (at === null) return null;
    const num = (x, digits = 3) => (typeof x === "number" && Number.isFinite(x) ? x.toPrecision(digits) : "–");
    // loss_spike: moved_first (param, series, step, lead, ratio); the others: params (param, ratio, z or share)
    const moved = Array.isArray(ev.moved_first) ? ev.moved_first : Array.isArray(ev.params) ? ev.params : [];
    const rows = moved.filter((m) => m && typeof m.param === "string").map((m, i) => h("tr", { dataset: { param: m.param } },
      h("td", {}, String(i + 1)),
      h("td", {}, h("button", { type: "button", class: "chip chip-button", title: `Show ${m.param} in the charts`, onclick: () => o.onParam(m.param) }, m.param)),
      h("td", { class: "incident-when" }, Number.isInteger(m.step) ? `step ${m.step}` : `step ${at}`),
      h("td", { class: "incident-lead" }, Number.isInteger(m.lead) ? (m.lead === 0 ? "same step" : `${m.lead} before`) : "same step"),
      h("td", {}, m.share !== undefined ? `${Math.round(m.share * 100)}% in ε regime` : `${num(m.ratio)}× ${m.series || "its median"}`),
      h("td", {}, m.z !== undefined ? `${num(m.z, 2)}σ` : "")));
    const loss = typeof ev.loss === "number" ? h("p", { class: "incident-loss" },
      `Loss ${num(ev.loss, 4)} at step ${at}, ${num(ev.ratio)}× its recent median`) : null;
    const total = ev.total && typeof ev.total === "object" ? h("p", { class: "incident-total" },
      `Total gradient norm ${num(ev.total.ratio)}× its recent median (${num(ev.total.z, 2)}σ)`) : null;
    const range = [Math.max(1, at - INCIDENT_BEFORE), at + INCIDENT_AFTER];
    const first = moved.filter((m) => m && typeof m.param === "string").slice(0, INCIDENT_CHARTED).map((m) => m.param);
    return h("details", { class: "incident", dataset: { step: String(at) } },
      h("summary", {}, `Incident at step ${at}`),
      loss, total,
      rows.length
        ? h("table", { class: "incident-params" },
          h("thead", {}, h("tr", {}, ["#", "parameter", "moved at", "lead", "how far", "score"].map((t) => h("th", {}, t)))),
          h("tbody", {}, rows))
        : h("p", { class: "muted" }, "No parameter moved before it."),
      o.onIncident ? h("button", { type: "button", class: "btn incident-zoom", onclick: () => o.onIncident(range, first) },
        `Show steps ${range[0]}–${range[1]} at full resolution`) : null);
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
