// The compare page's table of each run's settings and findings: status, optimizer, the
// learning rate each param group started with (by the group's name when it has one), size,
// steps, the findings' counts, and from the context the hook recorded (views/run-context.js):
// the git commit, the command line, host and versions, and the user's config values that differ
// between the compared runs.

import { runPageUrl } from "../api.js";
import { h, statusBadge } from "../dom.js";
import { fmtCount, fmtNum, toNumber } from "../format.js";
import { labelledGroups } from "../groups.js";
import { swatch } from "./compare-card.js";
import { flatten, gitText, hparamText, shellLine } from "./run-context.js";

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
 * The user's config entries ([dotted key, value]) that differ between `runs` (all of them when
 * only one run has a config), one list per run; null for a run without one.
 */
export function configDifferences(runs) {
  const flat = runs.map((r) => (r && r.config && r.config.user ? new Map(flatten(r.config.user)) : null));
  const keys = [...new Set(flat.flatMap((m) => (m ? [...m.keys()] : [])))].sort();
  const text = (m, k) => (m && m.has(k) ? JSON.stringify(m.get(k)) : undefined);
  const present = flat.filter(Boolean);
  const differs = keys.filter((k) => present.length < 2 || new Set(present.map((m) => text(m, k))).size > 1);
  return flat.map((m) => (m ? differs.filter((k) => m.has(k)).map((k) => [k, m.get(k)]) : null));
}

function contextCells(run, differences) {
  const c = (run.config && run.config.context) || {};
  const versions = c.versions ? ["torch", "python", "gradwatch"].filter((k) => c.versions[k]).map((k) => `${k} ${c.versions[k]}`).join(" · ") : "—";
  return [
    h("td", { dataset: { field: "git" } }, c.git ? h("code", { title: String(c.git.commit || "") }, gitText(c.git)) : "—"),
    h("td", { class: "col-argv", dataset: { field: "argv" } }, c.argv ? h("code", { title: shellLine(c.argv) }, shellLine(c.argv)) : "—"),
    h("td", { dataset: { field: "host" } }, c.host ? String(c.host) : "—",
      c.devices && c.devices.length ? h("span", { class: "run-id" }, c.devices.join(", ")) : null),
    h("td", { dataset: { field: "versions" } }, versions),
    h("td", { class: "ctx-hparams", dataset: { field: "config" }, title: run.config && run.config.user ? JSON.stringify(run.config.user) : "" },
      differences === null ? "—" : differences.length
        ? differences.map(([k, v]) => h("span", { class: "chip", dataset: { key: k } }, `${k} ${hparamText(v)}`))
        : h("span", { class: "muted" }, "same")),
  ];
}

/**
 * The table, one row per compared id, in the comparison's order.
 * @param {{ids: string[], runs: object[], groups: (object[]|null)[], findings: (object|null)[]}} state
 */
export function settingsTable(state) {
  const differences = configDifferences(state.runs);
  const heads = ["Run", "Status", "Optimizer", "Learning rate per group", "Parameters", "Steps", "Findings",
    "Commit", "Command", "Host", "Versions", "Config (what differs)"];
  return h("table", { class: "runs-table settings-table" },
    h("thead", {}, h("tr", {}, heads.map((t, i) => h("th", { scope: "col", class: i === 4 || i === 5 ? "num" : "" }, t)))),
    h("tbody", {}, state.ids.map((id, i) => {
      const r = state.runs[i];
      if (!r) return h("tr", { dataset: { runId: id } }, h("td", {}, swatch(i), " ", h("code", {}, id)), h("td", { colspan: heads.length - 1, class: "muted" }, "not found"));
      return h("tr", { dataset: { runId: r.id } },
        h("td", { class: "col-name" }, swatch(i), " ", h("a", { href: runPageUrl(r.id), class: "run-link" }, r.name || r.id)),
        h("td", { dataset: { field: "status" } }, statusBadge(r.status)),
        h("td", { dataset: { field: "optimizer" } }, r.optimizer || "—"),
        h("td", { class: "lrs", dataset: { field: "lr" } }, learningRates(state.groups[i])),
        h("td", { class: "num", dataset: { field: "params" } }, `${fmtCount(r.param_count)} tensors`,
          r.param_numel ? h("span", { class: "run-id" }, `${fmtCount(r.param_numel, true)} values`) : null),
        h("td", { class: "num", dataset: { field: "steps" } }, fmtCount(r.steps)),
        findingsCell(state.findings[i]),
        contextCells(r, differences[i]));
    })));
}
