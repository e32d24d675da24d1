// The comparison page (/compare?runs=ID,ID): the same scalars of several runs on shared
// axes (total gradient norm, loss, learning rate, one more scalar of your choice) and the
// gradient norm of one parameter that the runs share. Run status follows /ws/live.

import { api, ApiError, liveUrl, runPageUrl, UnreachableError } from "../api.js";
import { byId, h, notice, setChildren, statusBadge } from "../dom.js";
import { fmtCount, fmtDuration, runDuration, toNumbers } from "../format.js";
import { LineChart } from "../charts/line.js";
import { seriesColor } from "../charts/theme.js";
import { LiveSocket, renderLiveStatus } from "../live.js";
import { queryValue, readQuery, writeQuery } from "../url.js";
import { chartCard, toggle } from "../views/card.js";

const q = readQuery();
const ids = [...new Set((queryValue(q, "runs", "") || "").split(",").map((s) => s.trim()).filter(Boolean))];
const state = {
  ids,
  runs: [],            // RunPublic per id (null when missing)
  metrics: [],         // /metrics per id
  params: [],          // parameter names per id
  extra: queryValue(q, "scalar"),
  param: queryValue(q, "param"),
  xRange: null,
};

const runsEl = byId("compare-runs");
const grid = byId("charts");
const pageNotice = byId("page-notice");
const charts = [];

function onXRange(range) {
  state.xRange = range;
  for (const c of charts) c.chart.setXRange(range);
}

/** A card comparing one scalar (or one parameter's metric) across the runs. */
function compareCard(id, title, help, fetchOne, { log = false, tools = [] } = {}) {
  const logToggle = toggle("log", log, (on) => chart.setLog(on), "Logarithmic y axis");
  const { card, plot } = chartCard({ id, title, help, tools: [...tools, logToggle] });
  const chart = new LineChart(plot, { name: id, log, emptyText: "None of these runs has this", onXRange });
  const entry = {
    card, chart,
    async load() {
      const results = await Promise.all(state.runs.map((r) => (r ? fetchOne(r).catch(() => null) : null)));
      const series = [];
      results.forEach((res, i) => {
        if (!res) return;
        series[i] = { name: label(i), x: res.step || [], y: toNumbers(res.value) };
      });
      // Keep each run's colour: a run without this value gets an empty series.
      await chart.setSeries(state.runs.map((r, i) => series[i] || { name: label(i), x: [], y: [] }));
    },
  };
  charts.push(entry);
  grid.appendChild(card);
  return entry;
}

function label(i) {
  const r = state.runs[i];
  if (!r) return state.ids[i];
  const name = r.name || r.id;
  const dup = state.runs.filter((o) => o && (o.name || o.id) === name).length > 1;
  return dup ? `${name} (${r.id})` : name;
}

const has = (key) => (r, i) => (state.metrics[i] && state.metrics[i].scalars || []).includes(key);
const seriesIf = (key) => (r) => {
  const i = state.runs.indexOf(r);
  return has(key)(r, i) ? api.series(r.id, key) : Promise.resolve(null);
};

const extraSelect = h("select", {
  class: "input input-small", "aria-label": "Scalar to compare",
  onchange: (e) => { state.extra = e.target.value; save(); extraCard.load(); },
});
const paramSelect = h("select", {
  class: "input input-small param-select", "aria-label": "Parameter to compare",
  onchange: (e) => { state.param = e.target.value; save(); paramCard.load(); },
});

compareCard("compare-grad-norm-total", "Total gradient norm", "‖grad‖₂ over all parameters", seriesIf("grad_norm_total"), { log: true });
compareCard("compare-loss", "Loss", "As each training script reported it", seriesIf("loss"));
compareCard("compare-lr", "Learning rate", "Parameter group 0", seriesIf("lr/0"));
const extraCard = compareCard("compare-scalar", "Another scalar", "Pick any scalar the runs report",
  (r) => (state.extra ? seriesIf(state.extra)(r) : Promise.resolve(null)), { tools: [extraSelect] });
const paramCard = compareCard("compare-param", "Gradient norm of one parameter", "A parameter the runs share by name",
  async (r) => {
    if (!state.param) return null;
    const res = await api.paramSeries(r.id, "grad_norm", { params: [state.param] });
    const s = (res.series || [])[0];
    return s ? { step: res.step, value: s.value } : null;
  }, { log: true, tools: [paramSelect] });
paramCard.card.classList.add("card-wide");

function save() {
  writeQuery({ runs: state.ids.join(","), scalar: state.extra, param: state.param });
}

function renderRuns() {
  setChildren(runsEl, h("ul", { class: "compare-list" }, state.ids.map((id, i) => {
    const r = state.runs[i];
    return h("li", { class: "compare-run" },
      h("span", { class: "swatch", style: `background:${seriesColor(i)}`, "aria-hidden": "true" }),
      r ? [h("a", { href: runPageUrl(r.id) }, r.name || r.id), " ", statusBadge(r.status),
        h("span", { class: "muted" }, ` ${r.project || "default"} · ${fmtCount(r.steps)} steps · ${fmtDuration(runDuration(r))}`)]
        : [h("code", {}, id), h("span", { class: "muted" }, " not found")]);
  })));
}

function fillSelects() {
  const scalars = [...new Set(state.metrics.flatMap((m) => (m ? m.scalars || [] : [])))]
    .filter((k) => !["grad_norm_total", "loss", "lr/0"].includes(k)).sort();
  if (!scalars.includes(state.extra)) state.extra = scalars[0] || null;
  setChildren(extraSelect, scalars.map((k) => h("option", { value: k, selected: k === state.extra }, k)));
  extraCard.card.hidden = !scalars.length;

  const lists = state.params.filter(Boolean);
  const common = lists.length ? lists[0].filter((n) => lists.every((l) => l.includes(n))) : [];
  if (!common.includes(state.param)) state.param = common[0] || null;
  setChildren(paramSelect, common.map((n) => h("option", { value: n, selected: n === state.param }, n)));
  paramCard.card.hidden = !common.length;
}

async function load() {
  if (state.ids.length === 0) {
    setChildren(pageNotice, notice("empty", "Nothing to compare",
      h("p", {}, "Pick runs on the ", h("a", { href: "/" }, "run list"), " and press Compare.")));
    grid.hidden = true;
    document.body.dataset.ready = "1";
    return;
  }
  try {
    const got = await Promise.all(state.ids.map(async (id) => {
      try {
        const [run, metrics, params] = await Promise.all([api.run(id), api.metrics(id), api.params(id)]);
        return [run, metrics, (params.data || []).map((p) => p.name)];
      } catch (err) {
        if (err instanceof ApiError && err.status === 404) return [null, null, null];
        throw err;
      }
    }));
    state.runs = got.map((g) => g[0]);
    state.metrics = got.map((g) => g[1]);
    state.params = got.map((g) => g[2]);
    document.title = `Compare ${state.runs.filter(Boolean).map((r) => r.name || r.id).join(", ")} · gradwatch`;
    renderRuns();
    fillSelects();
    save();
    await Promise.all(charts.filter((c) => !c.card.hidden).map((c) => c.load()));
    setChildren(pageNotice);
  } catch (err) {
    console.error(err);
    setChildren(pageNotice, err instanceof UnreachableError
      ? notice("error", "The gradwatch server is unreachable", h("p", {}, "Start it with ", h("code", {}, "gradwatch serve"), "; this page reconnects by itself."))
      : notice("error", "The runs could not be loaded", h("p", {}, String(err.message || err))));
  }
  document.body.dataset.ready = "1";
}

byId("refresh").addEventListener("click", () => load());

new LiveSocket(liveUrl(), {
  onMessage: (msg) => {
    if (msg.type !== "run" || !msg.run) return;
    const i = state.ids.indexOf(msg.run.id);
    if (i >= 0 && state.runs[i]) {
      state.runs[i] = { ...state.runs[i], ...msg.run };
      renderRuns();
    }
  },
  onStatus: (s, ms) => renderLiveStatus(byId("live"), s, ms),
  onOpen: (reconnected) => { if (reconnected) load(); },
}).start();

load();
