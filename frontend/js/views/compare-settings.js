// The compare page's table of each run's settings and findings: status, optimizer, the
// learning rate each param group started with (by the group's name when it has one), size,
// steps, and the findings' counts.

import { runPageUrl } from "../api.js";
import { h, statusBadge } from "../dom.js";
import { fmtCount, fmtNum, toNumber } from "../format.js";
import { labelledGroups } from "../groups.js";
import { swatch } from "./compare-card.js";

/** {error, warning, info} counts of a /diagnostics answer, or null when there is none. */
export function countFindings(found) {
  if (!Array.isArray(found)) return null;
  const counts = { error: 0, warning: 0, info: 0 };
  for (const f of found) if (f.severity in counts) counts[f.severity] += 1;
  return counts;
}

/** "no_decay 3e-4" per param group (groups.js names them): the learning rate each group started with. */
function learningRates(groups) {
  if (!groups) return "—";
  if (!groups.length) return "none reported";
  return labelledGroups(groups).map(({ group: g, label: name }) => {
    const lr = g.hparams && "lr" in g.hparams ? g.hparams.lr : undefined;
    const value = typeof lr === "number" || typeof lr === "string" ? fmtNum(toNumber(lr), 3) : "—";
    return h("div", { class: "lr", title: JSON.stringify(g.hparams || {}) }, h("span", { class: "muted" }, `${name} `), value);
  });
}

function findingsCell(counts) {
  if (!counts) return h("td", { dataset: { field: "findings" } }, "—");
  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
  return h("td", { dataset: { field: "findings", errors: counts.error, warnings: counts.warning, info: counts.info } },
    counts.error ? h("span", { class: "fcount fcount-error" }, plural(counts.error, "error")) : null,
    counts.warning ? h("span", { class: "fcount fcount-warning" }, plural(counts.warning, "warning")) : null,
    counts.info ? h("span", { class: "fcount" }, `${counts.info} info`) : null,
    !counts.error && !counts.warning && !counts.info ? h("span", { class: "muted" }, "none") : null);
}

/**
 * The table, one row per compared id, in the comparison's order.
 * @param {{ids: string[], runs: object[], groups: (object[]|null)[], findings: (object|null)[]}} state
 */
export function settingsTable(state) {
  return h("table", { class: "runs-table settings-table" },
    h("thead", {}, h("tr", {}, ["Run", "Status", "Optimizer", "Learning rate per group", "Parameters", "Steps", "Findings"]
      .map((t, i) => h("th", { scope: "col", class: i === 4 || i === 5 ? "num" : "" }, t)))),
    h("tbody", {}, state.ids.map((id, i) => {
      const r = state.runs[i];
      if (!r) return h("tr", { dataset: { runId: id } }, h("td", {}, swatch(i), " ", h("code", {}, id)), h("td", { colspan: 6, class: "muted" }, "not found"));
      return h("tr", { dataset: { runId: r.id } },
        h("td", { class: "col-name" }, swatch(i), " ", h("a", { href: runPageUrl(r.id), class: "run-link" }, r.name || r.id)),
        h("td", { dataset: { field: "status" } }, statusBadge(r.status)),
        h("td", { dataset: { field: "optimizer" } }, r.optimizer || "—"),
        h("td", { class: "lrs", dataset: { field: "lr" } }, learningRates(state.groups[i])),
        h("td", { class: "num", dataset: { field: "params" } }, `${fmtCount(r.param_count)} tensors`,
          r.param_numel ? h("span", { class: "run-id" }, `${fmtCount(r.param_numel, true)} values`) : null),
        h("td", { class: "num", dataset: { field: "steps" } }, fmtCount(r.steps)),
        findingsCell(state.findings[i]));
    })));
}
