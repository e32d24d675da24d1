// The run page (/runs/{id}): fetches the run over REST, draws one view per card (see
// views/run-views.js), then follows /ws/live?run=ID and appends each step to the charts.
// Loading: the run, its parameters and metric names are asked for first (pages/run-first.js,
// before this module has loaded); then every view asks for its data, those in view first, and
// Plotly is compiled while the server answers; each chart draws in its own turn, those in view
// first (charts/turns.js).
// Live steps are queued and handed to the views once per animation frame; each chart then
// draws them with one extendTraces when its pacer lets it (charts/pacer.js), so 20 steps/s
// costs a few draws per second. After a dropped connection, or a change the charts cannot
// absorb (a new metric, a chart grown past its budget), everything is fetched again over REST.
// Findings (views/findings.js) come over REST and then live (`finding` messages); each one with
// a first step is drawn on every step-axis chart as a dotted line where it began.
// Zoom is shared by every chart and kept in the URL (?from=&to=); once it settles (ZOOM_DELAY_MS)
// each chart fetches the window again, at full resolution when it has few enough steps, and
// drops answers that a newer zoom has overtaken; zooming out draws the overview again.
// Charts out of view fetch and draw a zoom when they are scrolled to.
// What the page has drawn is published for tests and benchmarks/dashboard.py: body[data-ready]
// and the performance mark `gradwatch:ready` once every chart is drawn; body[data-zoom] and the
// mark `gradwatch:zoomed` once every chart in view shows the zoom's window ("FROM-TO", or "all");
// window.gradwatch, the test hook (page.js), holds the state and the views.
// The page's state is one object, `page`, that only this module writes; views read `page.state`.

import { api, ApiError, liveUrl, UnreachableError } from "../api.js";
import { findingAlerts } from "../attention.js";
import { LineChart } from "../charts/line.js";
import { smoothWeight } from "../smoothing.js";
import { markersOf, partialMarkers } from "../charts/markers.js";
import { whenPlotly } from "../charts/theme.js";
import { inViewFirst, nearView } from "../charts/turns.js";
import { byId, h, notice, setChildren } from "../dom.js";
import { fmtTime } from "../format.js";
import { LiveSocket, renderLiveStatus } from "../live.js";
import { firstScalar } from "../names.js";
import { exposeForTests, shareXRange, startIt, unreachableNotice } from "../page.js";
import { parseRanks } from "../ranks.js";
import { queryValue, readQuery, writeQuery } from "../url.js";
import { headerView } from "../views/header.js";
import { smoothingControl } from "../views/smoothing-control.js";
import { createRunViews } from "../views/run-views.js";
import { urlRange } from "../views/zoom.js";
import { zoomNote } from "../views/zoom-note.js";
import { runId, takeFirst } from "./run-first.js";

const MAX_POINTS = 4000;      // a live chart past this many points per series is refetched (downsampled)
const MAX_QUEUE = 20000;      // live steps waiting (hidden tab): past this, drop them and refetch
const FINDINGS_EVERY_MS = 15000;
const ZOOM_DELAY_MS = 40;     // a zoom fetches its window once it has settled this long
const WAIT_FOR_RUN_MS = 2000; // a run not on the server yet is asked for again this often (and when it is announced)

/** What the page holds between events; only this module writes it. */
const page = {
  state: null,     // what the views read (the run, its parameters, the choices the URL keeps)
  ctx: null,       // what views load with: { state }
  grid: null,      // the cards' container
  notice: null,    // the page-wide notice (errors, waiting for the run)
  header: null,
  note: null,      // the zoom, said in the top bar
  alerts: null,    // the finding count in a hidden tab's title, and desktop notifications
  socket: null,
  views: null,     // createRunViews(): the views by name, which are present, the other-scalar select
  present: null,
  otherSelect: null,
  otherScalars: null,
  addStateViews: null,
  findingsShown: [], // the findings marked on the charts
  partial: [],       // a distributed run's partial steps, shaded on the charts (markers.js)
  loading: null,     // the load in progress
  loadedOnce: false,
  waitTimer: 0,      // the next ask for a run not on the server yet
  reloadTimer: null,
  zoomTimer: 0,
  zoomRound: 0,
  queue: [],         // live steps waiting for the next frame
  frame: 0,
  lastFindings: 0,
  warnedKeys: new Set(), // metrics without a chart yet, fetched again once each
  firstStepsReload: false,
};

/** Read the URL, lay out the cards, load the run and follow /ws/live. */
export function init() {
  const q = readQuery();
  const num = (v) => (v === null || v === "" || Number.isNaN(Number(v)) ? null : Number(v));
  const state = (page.state = {
    runId,
    run: null,
    params: [],
    paramIndex: new Map(),   // name -> index in /params (the order of live arrays)
    metrics: { scalars: [], params: [] },
    groups: [],              // param groups (/groups), for their names
    selected: q.param || [], // parameters chosen by name (?param=); empty: the top k
    module: queryValue(q, "module"), // or every parameter of this module (?module=)
    top: Math.max(1, Math.round(num(queryValue(q, "top")) || 5)), // the top k (?top=&order=asc|desc)
    order: queryValue(q, "order") === "asc" ? "asc" : "desc",
    shown: [],               // parameters drawn in the per-parameter charts
    latest: {},              // latest value of each scalar, for the header
    xRange: urlRange(queryValue(q, "from"), queryValue(q, "to")),
    otherScalar: queryValue(q, "scalar"),
    smooth: smoothWeight(queryValue(q, "smooth")), // the line charts' EMA weight (?smooth=), 0: off
    ranksChosen: parseRanks(queryValue(q, "ranks")), // a big job's ranks to draw (?ranks=0-3,17), null: the default
  });
  page.ctx = { state };
  page.header = headerView(byId("run-header"), [smoothingControl(state.smooth, setSmoothing)]);
  page.alerts = findingAlerts(() => (state.run ? `${state.run.name || state.run.id} · gradwatch` : document.title));
  page.grid = byId("charts");
  page.notice = byId("page-notice");
  page.note = zoomNote(() => onXRange(null));

  Object.assign(page, createRunViews(state, {
    onXRange,
    onSelect: select,
    onParam: addParam,
    onModule: selectModule,
    onTop: selectTop,
    onOtherScalar: (key) => {
      state.otherScalar = key;
      saveUrl();
      loadViews([page.views.other]).then(() => { if (state.xRange) scheduleZoom(); }).catch(showError);
    },
    onRanks: saveUrl,
    onPartial: (ranges) => {
      page.partial = partialMarkers(ranges);
      drawMarkers(page.findingsShown);
    },
    onFindings: (list) => {
      page.findingsShown = list;
      drawMarkers(list);
      if (state.run) page.alerts.update(list, state.run.name || state.run.id);
    },
  }));
  for (const v of Object.values(page.views)) page.grid.appendChild(v.card);

  page.socket = new LiveSocket(liveUrl(runId), {
    onMessage,
    onStatus: (s, ms) => renderLiveStatus(page.header.liveEl, s, ms),
    onOpen: (reconnected) => { if (reconnected || !page.loadedOnce) requestReload(0); },
  });

  if (!runId) {
    showError(new ApiError(404, "no run id in the address"));
  } else {
    page.socket.start();
    loadAll();
    setInterval(() => { if (state.run && state.run.status === "running") page.header.tick(state); }, 5000);
  }

  exposeForTests({ state, views: page.views });
}

const onXRange = (range) => {
  shareXRange(page.state, page.note, Object.values(page.views), range);
  saveUrl();
  scheduleZoom();
};
const select = (names) => {
  const { state } = page;
  state.selected = names;
  state.module = null;
  saveUrl();
  reloadParams();
};
const selectModule = (path) => {
  const { state } = page;
  state.module = path;
  state.selected = [];
  saveUrl();
  reloadParams();
};
const selectTop = (k, order) => {
  const { state } = page;
  state.top = k;
  state.order = order;
  state.selected = [];
  state.module = null;
  saveUrl();
  reloadParams();
};
const addParam = (name) => {
  if (!page.state.shown.includes(name)) select([...page.state.shown, name]);
  page.views.paramNorms.card.scrollIntoView({ behavior: "smooth", block: "start" });
};

/** Mark where each finding began, and a distributed run's partial steps, on every chart with a step axis. */
function drawMarkers(findings) {
  const markers = [...markersOf(findings), ...page.partial].sort((a, b) => a.step - b.step || a.code.localeCompare(b.code));
  for (const v of Object.values(page.views)) {
    if (v.chart && v.chart.setMarkers) v.chart.setMarkers(markers).catch((err) => console.warn("gradwatch: markers:", err));
  }
}

/** Half-width cards go in pairs; the last of an odd run of them takes the whole row. */
function balanceGrid() {
  const { grid } = page;
  let run = [];
  const endRun = () => {
    if (run.length % 2 === 1) run[run.length - 1].classList.add("card-auto-wide");
    run = [];
  };
  for (const card of grid.children) {
    const was = card.classList.contains("card-auto-wide");
    card.classList.remove("card-auto-wide");
    if (!card.hidden && !card.classList.contains("card-wide")) run.push(card);
    else if (!card.hidden) endRun();
    card.dataset.wasWide = was ? "1" : "";
  }
  endRun();
  for (const card of grid.children) {
    const chart = card.querySelector(".js-plotly-plot");
    if (chart && (card.dataset.wasWide === "1") !== card.classList.contains("card-auto-wide")) window.Plotly.Plots.resize(chart);
    delete card.dataset.wasWide;
  }
}

function saveUrl() {
  const { state } = page;
  writeQuery({
    param: state.selected,
    module: state.module,
    top: state.top !== 5 ? state.top : null,
    order: state.order === "asc" ? "asc" : null,
    from: state.xRange ? Math.round(state.xRange[0]) : null,
    to: state.xRange ? Math.round(state.xRange[1]) : null,
    scalar: state.otherScalar,
    smooth: state.smooth || null,
    ranks: state.ranksChosen ? state.ranksChosen.join(",") : null,
  });
}

/** A new smoothing weight: every line chart fetches (or computes) its smoothed series again. */
function setSmoothing(weight) {
  page.state.smooth = weight;
  saveUrl();
  const lines = Object.values(page.views).filter((v) => v.chart instanceof LineChart && !v.card.hidden);
  loadViews(lines).then(() => { if (page.state.xRange) scheduleZoom(); }).catch(showError);
}

// ---- loading over REST -------------------------------------------------------------------

async function loadAll() {
  if (page.loading) return page.loading;
  const { state, views, grid, header } = page;
  page.loading = (async () => {
    try {
      const first = takeFirst() || Promise.all([api.run(runId), api.params(runId), api.metrics(runId)]);
      const groups = api.groups(runId).then((g) => g.data || []).catch(() => []); // names only: a failure leaves "group G"
      const [run, params, metrics] = await first;
      state.run = run;
      state.groups = await groups;
      grid.hidden = false;
      state.params = params.data || [];
      state.paramIndex = new Map(state.params.map((p, i) => [p.name, p.index ?? i]));
      state.metrics = { scalars: metrics.scalars || [], params: metrics.params || [] };
      state.latest = {};
      for (const v of page.addStateViews(state.metrics.params)) grid.insertBefore(v.card, views.updateRatio.card);
      fillOtherSelect();
      for (const [name, present] of Object.entries(page.present)) views[name].card.hidden = !present();
      balanceGrid();
      header.render(state);
      page.alerts.title();
      const drawn = loadViews(Object.values(views).filter((v) => !v.card.hidden));
      whenPlotly().catch(showError); // the requests are out: compile Plotly while the server answers
      await drawn;
      if (!state.run.steps) {
        for (const el of grid.querySelectorAll("[data-chart]")) el.dataset.empty = "Waiting for the first step…";
      }
      header.renderStats(state);
      setChildren(page.notice);
      document.body.dataset.state = "loaded";
      page.loadedOnce = true;
      page.lastFindings = Date.now();
      if (state.xRange) onXRange(state.xRange);
      if (document.body.dataset.ready !== "1") performance.mark("gradwatch:ready");
      document.body.dataset.ready = "1";
    } catch (err) {
      showError(err);
    } finally {
      page.loading = null;
      scheduleFlush();
      if (document.body.dataset.zoom === "pending" && !page.zoomTimer) scheduleZoom();
    }
  })();
  return page.loading;
}

/**
 * Fetch and draw `list`: every view asks for its data at once, the views in view (or near it)
 * first, so that the server answers while the browser compiles Plotly; each chart then draws in
 * its turn, those in view first, whatever order the answers come in (charts/turns.js). Why all at
 * once, with the figures: docs/benchmarks.md, Figures behind code choices. The per-parameter
 * followers (optimizer state) ask for the same choice as the gradient-norm chart; one whose
 * parameters came out different (live steps moved the top k between the two answers) is
 * fetched again by the names the gradient-norm chart shows. A view that fails shows why in its
 * card and the others still draw; an unreachable server fails all.
 */
async function loadViews(list) {
  const load = (v, names = undefined) => v.load(page.ctx, names).catch((err) => {
    if (err instanceof UnreachableError) throw err;
    console.warn(`gradwatch: ${v.card.dataset.card}:`, err);
    if (v.fail) v.fail(err);
  });
  const near = list.filter((v) => nearView(v.card));
  const nearDrawn = Promise.all(near.map((v) => load(v)));
  inViewFirst(nearDrawn, near.map((v) => v.card));
  await Promise.all([nearDrawn, ...list.filter((v) => !near.includes(v)).map((v) => load(v))]);
  const same = (a, b) => a.length === b.length && a.every((n, i) => n === b[i]);
  const shown = page.state.shown;
  const again = list.filter((v) => v.follows && !same(v.params(), shown));
  await Promise.all(again.map((v) => load(v, shown.slice())));
}

function reloadParams() {
  const { views } = page;
  const list = Object.values(views).filter((v) => (v === views.paramNorms || v.follows) && !v.card.hidden);
  loadViews(list).then(() => { if (page.state.xRange) scheduleZoom(); }).catch(showError);
}

// ---- zoom: the window at full resolution ---------------------------------------------------

/** The steps a zoom shows, [first, last], or null for the whole run. */
function stepWindow(range) {
  if (!range) return null;
  const start = Math.max(0, Math.ceil(Math.min(range[0], range[1])));
  const end = Math.floor(Math.max(range[0], range[1]));
  return end >= start ? [start, end] : null;
}

function scheduleZoom() {
  clearTimeout(page.zoomTimer);
  document.body.dataset.zoom = "pending";
  page.zoomTimer = setTimeout(applyZoom, ZOOM_DELAY_MS);
}

/** Every chart fetches the zoomed window (or goes back to its overview); one round at a time wins. */
async function applyZoom() {
  page.zoomTimer = 0;
  if (!page.loadedOnce || page.loading) return; // loadAll zooms again when it is done
  const round = ++page.zoomRound;
  const win = stepWindow(page.state.xRange);
  const list = Object.values(page.views).filter((v) => !v.card.hidden && v.zoom);
  const results = await Promise.allSettled(list.map((v) => v.zoom(page.ctx, win)));
  for (const [i, r] of results.entries()) {
    if (r.status === "fulfilled") continue;
    if (r.reason instanceof UnreachableError) showError(r.reason);
    else console.warn(`gradwatch: zoom: ${list[i].card.dataset.card}:`, r.reason);
  }
  if (round !== page.zoomRound || page.zoomTimer) return;
  document.body.dataset.zoom = win ? `${win[0]}-${win[1]}` : "all";
  performance.mark("gradwatch:zoomed", { detail: document.body.dataset.zoom });
}

function requestReload(delayMs = 500) {
  clearTimeout(page.reloadTimer);
  page.reloadTimer = setTimeout(() => { page.reloadTimer = null; loadAll(); }, delayMs);
}

function fillOtherSelect() {
  const { state } = page;
  const keys = page.otherScalars();
  if (!keys.includes(state.otherScalar)) state.otherScalar = firstScalar(keys);
  setChildren(page.otherSelect, keys.map((k) => h("option", { value: k, selected: k === state.otherScalar }, k)));
}

function showError(err) {
  const deleted = err instanceof ApiError && err.status === 404 && err.body && err.body.run === "deleted";
  const waiting = err instanceof ApiError && err.status === 404 && runId && !deleted;
  if (!waiting && !deleted) console.error(err);
  document.body.dataset.state = "error";
  if (err instanceof ApiError && err.status === 404 && !runId) {
    setChildren(page.notice, notice("error", "Run not found",
      h("p", {}, "This address names no run. ", h("a", { href: "/" }, "See all runs"), ".")));
    page.grid.hidden = true;
    page.socket.stop();
    renderLiveStatus(page.header.liveEl, "offline");
  } else if (deleted) {
    // The server remembers the ids of the runs deleted from it: this one will not arrive.
    const when = Number(err.body.deleted_at);
    setChildren(page.notice, notice("error", "This run was deleted",
      h("p", {}, "The run ", h("code", {}, runId), " was deleted from this server",
        Number.isFinite(when) ? ` on ${fmtTime(when)}` : "", ". ", h("a", { href: "/" }, "See all runs"), ".")));
    document.body.dataset.state = "deleted";
    page.grid.hidden = true;
    clearTimeout(page.waitTimer);
  } else if (waiting) {
    // watch() prints the run's address before its hello reaches the server, and a run trained
    // while the server was away arrives with `gradwatch sync`: wait for it rather than give up.
    setChildren(page.notice, notice("loading", "Waiting for this run",
      h("p", {}, "No run with the id ", h("code", {}, runId), " has reached this server yet, and none by that id was ",
        "deleted from it: either it has not arrived, or it never existed. A training script that has just called ",
        h("code", {}, "gradwatch.watch()"), " appears within seconds; one that trained while the server was away, once ",
        h("code", {}, "gradwatch sync"), " delivers it. This page shows the run as soon as it arrives. ",
        h("a", { href: "/" }, "See all runs"), ".")));
    document.body.dataset.state = "waiting";
    page.grid.hidden = true;
    clearTimeout(page.waitTimer);
    page.waitTimer = setTimeout(loadAll, WAIT_FOR_RUN_MS);
  } else if (err instanceof UnreachableError) {
    setChildren(page.notice, unreachableNotice(...startIt(), "; this page reconnects by itself and shows what it missed."));
  } else if (!page.loadedOnce) {
    setChildren(page.notice, notice("error", "This run could not be loaded", h("p", {}, String(err.message || err))));
  }
}

// ---- live ----------------------------------------------------------------------------------

function onMessage(msg) {
  const { state, views, queue } = page;
  if (msg.type === "step" && msg.run_id === runId) {
    queue.push(msg);
    if (queue.length > MAX_QUEUE) {
      queue.length = 0;
      requestReload(0);
    }
    scheduleFlush();
  } else if (msg.type === "finding" && msg.run_id === runId) {
    views.findings.upsert(msg.finding);
  } else if (msg.type === "run" && msg.run && msg.run.id === runId && !state.run) {
    loadAll(); // the run this page waits for has reached the server
  } else if (msg.type === "run" && msg.run && msg.run.id === runId && state.run) {
    const before = state.run.status;
    // last_step is where the charts' live steps stand (flush drops what is not past it): a run
    // message (its close) can overtake the steps queued for the next frame, so it moves it only
    // once those are drawn.
    if (queue.length && page.frame) {
      cancelAnimationFrame(page.frame);
      page.frame = 0;
      flush();
    }
    const drawn = queue.length ? { steps: state.run.steps, last_step: state.run.last_step }
      : { steps: Math.max(msg.run.steps || 0, state.run.steps || 0), last_step: Math.max(msg.run.last_step || 0, state.run.last_step || 0) };
    state.run = { ...msg.run, ...drawn };
    page.header.render(state);
    page.alerts.title();
    if (before !== state.run.status) {
      views.findings.load(page.ctx);
      for (const v of Object.values(views)) if (v.onStatus && !v.card.hidden) v.onStatus();
    }
  }
}

function scheduleFlush() {
  if (!page.frame && page.queue.length) page.frame = requestAnimationFrame(flush);
}

/** Apply every queued step: one append per view, whatever the number of steps. */
function flush() {
  page.frame = 0;
  if (page.loading || !page.loadedOnce || page.reloadTimer) return;
  const { state, views } = page;
  const msgs = page.queue.splice(0).sort((a, b) => a.step - b.step);
  const last = state.run.last_step || 0;
  const fresh = msgs.filter((m) => m.step > last);
  // The flight recorder's window (scalar flight/resent): norms of steps drawn already without
  // them. The charts fetch the run's series again, which hold them now (a step is never drawn twice).
  const late = msgs.some((m) => m.step <= last && m.scalars && "flight/resent" in m.scalars);
  if (late) return requestReload(0);
  if (!fresh.length) return;
  if (!state.run.steps && !page.firstStepsReload) {
    page.firstStepsReload = true; // the run's first steps: fetch them to pick the parameters to show
    return requestReload(0);
  }
  if (needsReload(fresh)) requestReload();
  state.run.steps = (state.run.steps || 0) + fresh.length;
  state.run.last_step = fresh[fresh.length - 1].step;
  for (const v of Object.values(views)) if (!v.card.hidden) v.append(fresh);
  page.header.onSteps(state, fresh);
  const grown = Object.values(views).some((v) => !v.card.hidden && v.pointsPerSeries && v.pointsPerSeries() > MAX_POINTS);
  if (grown) requestReload(0);
  else if (Date.now() - page.lastFindings > FINDINGS_EVERY_MS) {
    page.lastFindings = Date.now();
    views.findings.load(page.ctx);
  }
}

/** A metric the page has no chart for yet: fetch again (once per new name). */
function needsReload(msgs) {
  const { state, warnedKeys } = page;
  let found = false;
  for (const m of msgs) {
    for (const k of Object.keys(m.scalars || {})) {
      if (!state.metrics.scalars.includes(k) && !warnedKeys.has(`s:${k}`)) { warnedKeys.add(`s:${k}`); found = true; }
    }
    for (const k of Object.keys(m.params || {})) {
      if (!state.metrics.params.includes(k) && !warnedKeys.has(`p:${k}`)) { warnedKeys.add(`p:${k}`); found = true; }
    }
  }
  return found;
}
