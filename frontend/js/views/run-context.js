// The "Run" panel: what the hook recorded at watch() to reproduce the run (RunPublic.config:
// `context` and the user's `config=` under `user`; docs/api.md, "The run's context"): the
// command line, the git commit and whether the tree was dirty, host, devices, versions, model,
// parameter counts, each optimizer with every param group's settings, and the user's config.
// Everything is rendered as text (dom.js); a field the hook did not record shows nothing.

import { h, setChildren } from "../dom.js";
import { fmtCount } from "../format.js";

/** A command line as a shell would take it back: words with spaces or quotes get quoted. */
export function shellLine(argv) {
  return (argv || []).map((a) => {
    const s = String(a);
    return /^[A-Za-z0-9_@%+=:,./-]+$/.test(s) ? s : `'${s.replace(/'/g, "'\\''")}'`;
  }).join(" ");
}

/** A hyperparameter value exactly as recorded (to reproduce the run): numbers as JSON has them. */
export function hparamText(v) {
  if (typeof v === "number") return String(v);
  if (Array.isArray(v)) return `[${v.map(hparamText).join(", ")}]`;
  if (v === null || v === undefined) return "—";
  return typeof v === "object" ? JSON.stringify(v) : String(v);
}

/** A nested mapping as [dotted key, value] rows ({data: {name: "x"}} -> ["data.name", "x"]). */
export function flatten(obj, prefix = "") {
  const rows = [];
  for (const [k, v] of Object.entries(obj || {})) {
    const key = prefix ? `${prefix}.${k}` : k;
    if (v && typeof v === "object" && !Array.isArray(v) && Object.keys(v).length) rows.push(...flatten(v, key));
    else rows.push([key, v]);
  }
  return rows;
}

/** The optimizer classes in short: "AdamW" (or "AdamW + SGD"). */
export function optimizerNames(context) {
  const opts = (context && context.optimizers) || [];
  return opts.map((o) => String(o.class || "").split(".").pop()).filter(Boolean).join(" + ");
}

/** "4f2c1ab (dirty)" or "—". */
export function gitText(git) {
  if (!git || !git.commit) return "—";
  return `${String(git.commit).slice(0, 10)}${git.dirty ? " (dirty)" : git.dirty === false ? " (clean)" : ""}`;
}

function row(label, value, field) {
  return h("tr", { dataset: { field } }, h("th", { scope: "row" }, label), h("td", {}, value));
}

function groupsTable(optimizers) {
  return optimizers.map((o, k) => h("div", { class: "ctx-optimizer", dataset: { optimizer: String(k) } },
    h("p", {}, h("code", {}, String(o.class || "?"))),
    h("table", { class: "ctx-groups" },
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "group"), h("th", { scope: "col", class: "num" }, "tensors"),
        h("th", { scope: "col", class: "num" }, "values"), h("th", { scope: "col" }, "settings"))),
      h("tbody", {}, (o.groups || []).map((g, i) => h("tr", { dataset: { group: String(i) } },
        h("td", {}, g.name || `group ${i}`),
        h("td", { class: "num" }, fmtCount(g.params)),
        h("td", { class: "num" }, fmtCount(g.numel, true)),
        h("td", { class: "ctx-hparams" }, Object.entries(g.hparams || {}).map(([k, v]) =>
          h("span", { class: "chip", dataset: { hparam: k } }, `${k} ${hparamText(v)}`)))))))));
}

/** The rows of the panel for a run's config (pure: tests and compare use it). */
export function contextRows(config) {
  const c = (config && config.context) || {};
  const rows = [];
  if (c.argv) rows.push(row("Command", h("code", { class: "ctx-argv" }, shellLine(c.argv)), "argv"));
  if (c.cwd) rows.push(row("Directory", h("code", {}, String(c.cwd)), "cwd"));
  if ("git" in c) rows.push(row("Git", c.git ? [h("code", {}, String(c.git.commit || "")),
    c.git.dirty ? h("span", { class: "badge badge-crashed", title: "tracked files differed from the commit" }, "dirty")
      : h("span", { class: "muted" }, " clean")] : h("span", { class: "muted" }, "not a git checkout"), "git"));
  if (c.host) rows.push(row("Host", String(c.host), "host"));
  if (c.devices) rows.push(row("Devices", c.devices.join(", ") || "—", "devices"));
  if (c.versions) {
    rows.push(row("Versions", Object.entries(c.versions).filter(([, v]) => v)
      .map(([k, v]) => `${k} ${v}`).join(" · "), "versions"));
  }
  if (c.platform) rows.push(row("Platform", String(c.platform), "platform"));
  if ("model" in c) rows.push(row("Model", c.model ? h("code", {}, String(c.model)) : "—", "model"));
  if (c.parameters) {
    const p = c.parameters;
    const model = p.model_numel !== undefined
      ? ` · model ${fmtCount(p.model_numel, true)} values, ${fmtCount(p.model_trainable_numel, true)} trainable` : "";
    rows.push(row("Parameters", `${fmtCount(p.tensors)} tensors, ${fmtCount(p.numel, true)} values optimized${model}`, "parameters"));
  }
  if (c.optimizers && c.optimizers.length) rows.push(row("Optimizer", groupsTable(c.optimizers), "optimizer"));
  const user = config && config.user;
  if (user && typeof user === "object") {
    rows.push(row("Config", h("table", { class: "ctx-user" }, h("tbody", {}, flatten(user).map(([k, v]) =>
      h("tr", { dataset: { key: k } }, h("th", { scope: "row" }, h("code", {}, k)), h("td", {}, hparamText(v)))))), "user"));
  }
  return rows;
}

/** The one line the closed panel shows: command, commit, host, torch. */
export function contextSummary(config) {
  const c = (config && config.context) || {};
  const parts = [];
  if (c.argv && c.argv.length) parts.push(shellLine(c.argv));
  if (c.git) parts.push(`git ${gitText(c.git)}`);
  if (c.host) parts.push(String(c.host));
  if (c.versions && c.versions.torch) parts.push(`torch ${c.versions.torch}`);
  return parts.join(" · ");
}

/** The Run card (closed to one line; open for everything), filled from RunPublic by `load`. */
export function runContextView() {
  const body = h("div", { class: "ctx-body" });
  const summary = h("span", { class: "ctx-summary muted" });
  const card = h("section", { class: "card card-wide run-context", dataset: { card: "run-context" }, "aria-labelledby": "title-run-context" },
    h("details", { class: "ctx-details" },
      h("summary", { class: "card-head" }, h("div", { class: "card-titles" },
        h("h2", { id: "title-run-context" }, "Run"), summary)),
      h("p", { class: "card-help" }, "What the training script ran with, as gradwatch recorded it at watch()"),
      body));
  const render = (run) => {
    const config = run && run.config;
    const rows = contextRows(config);
    card.dataset.fields = String(rows.length);
    summary.textContent = contextSummary(config);
    setChildren(body, rows.length ? h("table", { class: "ctx-table" }, h("tbody", {}, rows))
      : h("p", { class: "muted" }, "This run's hook recorded no context (an older gradwatch)."));
  };
  return {
    card,
    render,
    load: async (ctx) => render(ctx.state.run),
    append() {},
  };
}
