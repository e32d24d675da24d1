// The run header: name, project, status badge, facts, export links, the live indicator,
// and a strip with the latest values (step, loss, gradient norm, learning rate, memory).

import { exportUrl, runPageUrl } from "../api.js";
import { notificationToggle } from "../attention.js";
import { h, setChildren, statusBadge } from "../dom.js";
import { fmtBytes, fmtCount, fmtDuration, fmtNum, fmtTime, runDuration, toNumber } from "../format.js";

/** @param {HTMLElement} root @param {Node[]} tools  more controls beside the live indicator (smoothing) */
export function headerView(root, tools = []) {
  const liveEl = h("span", { class: "live", dataset: { live: "connecting" }, role: "status", "aria-live": "polite" }, "Connecting…");
  const title = h("h1", { class: "run-name" });
  const facts = h("dl", { class: "facts" });
  const stats = h("dl", { class: "stats", "aria-label": "Latest values" });
  const exports = h("div", { class: "exports", role: "group", "aria-label": "Export" });
  setChildren(root,
    h("div", { class: "run-head" },
      h("div", { class: "run-title" },
        h("nav", { class: "crumbs", "aria-label": "Breadcrumb" }, h("a", { href: "/" }, "Runs"), h("span", { class: "sep", "aria-hidden": "true" }, "/"), h("span", { class: "crumb-project" })),
        title, facts),
      h("div", { class: "run-actions" }, liveEl, tools, notificationToggle(), exports)),
    stats);

  function fact(label, value, attrs = {}) {
    return h("div", { class: "fact" }, h("dt", {}, label), h("dd", attrs, value));
  }

  /** A rank's own run says whose rank it is, with a link to the job; a job says its world size. */
  function distFact(run) {
    if (run.parent_id != null) {
      return fact("Rank", [`${run.rank} of ${run.world_size ?? "?"} in job `,
        h("a", { href: runPageUrl(run.parent_id), class: "job-link" }, run.parent_id)], { dataset: { field: "rank" } });
    }
    return run.world_size > 1 ? fact("Ranks", String(run.world_size), { dataset: { field: "ranks" } }) : null;
  }

  return {
    liveEl,

    render(state) {
      const run = state.run;
      document.title = `${run.name || run.id} · gradwatch`;
      root.querySelector(".crumb-project").textContent = run.project || "default";
      setChildren(title, h("span", { class: "run-name-text" }, run.name || run.id), " ",
        run.parent_id != null ? [h("span", { class: "ranks-badge" }, `rank ${run.rank}`), " "] : null, statusBadge(run.status));
      const numel = run.param_numel ? ` (${fmtCount(run.param_numel, true)} values)` : "";
      setChildren(facts,
        distFact(run),
        fact("Project", run.project || "—"),
        fact("Optimizer", run.optimizer || "—"),
        fact("Steps", fmtCount(run.steps), { dataset: { field: "steps" } }),
        fact("Parameters", `${fmtCount(run.param_count ?? state.params.length)} tensors${numel}`),
        fact("Started", fmtTime(run.created_at)),
        fact("Duration", fmtDuration(runDuration(run)), { dataset: { field: "duration" } }));
      const names = { csv: "CSV", json: "JSON", parquet: "Parquet" };
      setChildren(exports,
        h("span", { class: "muted", title: "One row per step and parameter: gradient and state norms" }, "Export per parameter"),
        ["csv", "json", "parquet"].map((f) => h("a", {
          class: "btn", href: exportUrl(run.id, f), download: "", dataset: { export: f },
          title: `Download this run's per-parameter table as ${names[f]} (JSON: the whole run, re-importable)`,
        }, names[f])),
        h("span", { class: "muted", title: "One row per step: loss, learning rates, total gradient norm, memory, your scalars" }, "per step"),
        ["csv", "parquet"].map((f) => h("a", {
          class: "btn", href: exportUrl(run.id, f, "steps"), download: "", dataset: { export: `steps-${f}` },
          title: `Download one row per step with every scalar as ${names[f]}`,
        }, names[f])));
      this.renderStats(state);
    },

    renderStats(state) {
      const L = state.latest;
      const items = [["Step", state.run.last_step != null ? fmtCount(state.run.last_step) : "—"]];
      if ("loss" in L) items.push(["Loss", fmtNum(L.loss)]);
      if ("grad_norm_total" in L) items.push(["Gradient norm", fmtNum(L.grad_norm_total)]);
      if ("lr/0" in L) items.push(["Learning rate", fmtNum(L["lr/0"], 3)]);
      const own = ["mem/params_bytes", "mem/grads_bytes", "mem/optimizer_bytes"].filter((k) => k in L);
      if (own.length) {
        const total = own.reduce((s, k) => s + (L[k] ?? 0), 0);
        items.push(["Params + grads + state", fmtBytes(total)]);
      }
      const cuda = Object.keys(L).filter((k) => /^mem\/cuda:\d+\/allocated$/.test(k)).sort();
      for (const k of cuda) items.push([`${k.split("/")[1]} allocated`, fmtBytes(L[k])]);
      setChildren(stats, items.map(([k, v]) => h("div", { class: "stat" },
        h("dt", {}, k), h("dd", { class: typeof v === "string" && /^(NaN|[+-]Inf)$/.test(v) ? "nonfinite" : "" }, v))));
    },

    /** Refresh the duration of a running run (called every few seconds). */
    tick(state) {
      const el = facts.querySelector('[data-field="duration"]');
      if (el) el.textContent = fmtDuration(runDuration(state.run));
    },

    /** Live: a step arrived. */
    onSteps(state, msgs) {
      for (const m of msgs) {
        for (const [k, v] of Object.entries(m.scalars || {})) state.latest[k] = toNumber(v);
      }
      this.renderStats(state);
      const el = facts.querySelector('[data-field="steps"]');
      if (el) el.textContent = fmtCount(state.run.steps);
    },
  };
}
