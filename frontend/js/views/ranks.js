// The Ranks section of a distributed run's page: a card with each rank (status, last step, lost,
// a link to its own run page), the partial steps and lost ranks in words, and four charts with one
// line per rank: step time, time before backward, memory and the rank's own gradient norm. A job
// of more than SMALL_JOB_RANKS ranks draws instead the spread across its ranks (bands of min-max
// and p5-p95 around the median, one /ranks/spread request per chart) and names its outlier ranks.
//
// Every figure is read from the rank's child run (`JOB.rR`) through the endpoints any run has:
// GET /api/runs/{job}/ranks once per load, then per chart one /series request per rank drawn
// (and one /metrics per rank, for the memory chart's key). Up to MAX_SHOWN_RANKS ranks are drawn
// (ranks.js, shownRanks): at most 8 x 5 requests a refresh, whatever the world size; a bigger job
// draws rank 0, its lost ranks and the lowest others, and the card takes another choice (?ranks=).
// The page's live steps are the job's, not the ranks': when steps come, or the job's status
// changes, the section fetches again, at most every REFRESH_MS.

import { api, runPageUrl } from "../api.js";
import { LineChart } from "../charts/line.js";
import { h, notice, setChildren, statusBadge } from "../dom.js";
import { byteUnit, fmtAgo, fmtBytes, fmtCount, fmtNum, fmtTime, isNonFinite, toNumbers } from "../format.js";
import {
  absentRanks, drawsSpread, findStraggler, listRanks, MAX_SHOWN_RANKS, outliersText, parseRanks, partialText,
  rankMemoryKey, shownRanks, spreadSeries,
} from "../ranks.js";
import { chartCard } from "./card.js";
import { pointsFor } from "./scalars.js";

const REFRESH_MS = 5000;
const MAX_RANGES_LISTED = 12; // partial ranges named in the notice; the rest are counted

/** The charts, in page order: their card ids, words, and which scalar of a rank each draws. */
const CHARTS = [
  { id: "rank-step-time", title: "Step time per rank", unit: "s",
    help: "Seconds from the end of each rank's previous optimizer step to the end of this one (time/step_s)",
    key: () => "time/step_s", spread: "time/step_s" },
  { id: "rank-before-backward", title: "Time before backward per rank", unit: "s",
    help: "Seconds until the step's first gradient arrived: forward pass and data loading (time/before_backward_s). "
      + "The straggler's stands apart; the other ranks wait for it inside backward.",
    key: () => "time/before_backward_s", spread: "time/before_backward_s" },
  { id: "rank-memory", title: "Memory per rank", bytes: true,
    help: "Each rank's CUDA allocated bytes (mem/cuda:N/allocated), or its process's resident set (mem/rss_bytes) without CUDA",
    key: (scalars) => rankMemoryKey(scalars), spread: "memory" },
  { id: "rank-grad-norm", title: "Gradient norm per rank", log: true,
    help: "‖grad‖₂ of each rank's own gradients (its shard under FSDP; the same on every rank under DDP)",
    key: () => "grad_norm_total", spread: "grad_norm_total" },
];

/**
 * @param {object} state  the run page's state (read only here; `state.ranksChosen` is this section's)
 * @param {{onXRange: Function, onRanks?: () => void, onPartial?: (ranges: object[]) => void}} on
 *   onRanks: the user chose the ranks to draw; onPartial: the partial ranges, after each load
 * @returns {Object<string, object>} the views, in page order: `ranks` (the card) and a chart view per CHARTS entry
 */
export function createRanksViews(state, { onXRange, onRanks = () => {}, onPartial = () => {} }) {
  const body = h("div", { class: "ranks-body" });
  const pick = h("input", {
    class: "input input-small", type: "text", placeholder: "0-7", size: 10, "aria-label": "Ranks to draw",
    title: `Up to ${MAX_SHOWN_RANKS} ranks, e.g. 0-3,17`,
    onchange: () => choose(pick.value),
  });
  const pickLabel = h("label", { class: "ranks-pick", hidden: true }, "Draw ranks ", pick);
  const straggler = h("p", { class: "ranks-straggler", hidden: true, role: "status" });
  const help = "Each rank of the job streams to a run of its own (its link); the charts draw one line per rank.";
  const card = h("section", { class: "card card-wide", dataset: { card: "ranks" }, "aria-labelledby": "title-ranks" },
    h("header", { class: "card-head" },
      h("div", { class: "card-titles" }, h("h2", { id: "title-ranks" }, "Ranks"), h("p", { class: "card-help" }, help)),
      h("div", { class: "card-tools" }, pickLabel)),
    straggler,
    body);

  let ctxSaved = null;
  let inFlight = null;   // the /ranks answer being fetched: the five views of one load share it
  let lastLoad = 0;
  let answer = null;     // the last /ranks answer, with `shown` (the ranks drawn)

  /** /ranks, once for every view that loads at the same time. */
  function fetchRanks(ctx) {
    if (!inFlight) {
      inFlight = api.ranks(ctx.state.runId).then((a) => {
        a.shown = shownRanks(a.ranks || [], ctx.state.ranksChosen || null);
        answer = a;
        return a;
      }).finally(() => { inFlight = null; });
    }
    return inFlight;
  }

  function choose(text) {
    const ranks = parseRanks(text);
    pick.setCustomValidity(ranks || !text.trim() ? "" : "ranks like 0-3,17");
    if (!ranks && text.trim()) { pick.reportValidity(); return; }
    state.ranksChosen = ranks;
    onRanks();
    if (ctxSaved) reloadAll(ctxSaved);
  }

  function reloadAll(ctx) {
    for (const v of Object.values(views)) v.load(ctx).catch((err) => { if (v.fail) v.fail(err); });
  }

  let refreshTimer = 0;

  /** The job moved on (live steps, a new status): fetch again, at most every REFRESH_MS. */
  function maybeRefresh() {
    if (!ctxSaved || refreshTimer) return;
    refreshTimer = setTimeout(() => {
      refreshTimer = 0;
      reloadAll(ctxSaved);
    }, Math.max(0, lastLoad + REFRESH_MS - Date.now()));
  }

  const tableView = {
    card,
    async load(ctx) {
      ctxSaved = ctx;
      lastLoad = Date.now();
      const a = await fetchRanks(ctx);
      renderTable(a, ctx.state);
      onPartial((a.partial && a.partial.ranges) || []);
      pickLabel.hidden = (a.ranks || []).length <= MAX_SHOWN_RANKS || drawsSpread(a.world_size);
      card.dataset.worldSize = String(a.world_size);
      card.dataset.shown = a.shown.join(",");
    },
    append: maybeRefresh,
    onStatus: maybeRefresh,
    fail(err) { setChildren(body, notice("error", "The ranks could not be loaded", h("p", {}, String(err.message || err)))); },
  };

  function renderTable(a, st) {
    const ranks = a.ranks || [];
    const lost = ranks.filter((r) => r.lost);
    const partial = a.partial || { steps: 0, ranges: [] };
    const notices = [];
    if (lost.length) {
      notices.push(h("li", { dataset: { lost: lost.map((r) => r.rank).join(",") } },
        `Rank${lost.length === 1 ? "" : "s"} ${listRanks(lost.map((r) => r.rank))} ${lost.length === 1 ? "was" : "were"} lost: `,
        lost.map((r, i) => [i ? "; " : "", `rank ${r.rank} sent nothing after step ${r.last_step ?? "—"}`]),
        "."));
    }
    const absent = absentRanks(a.world_size, ranks);
    if (absent.length) {
      const named = absent.length > MAX_RANGES_LISTED ? [...absent.slice(0, MAX_RANGES_LISTED), `${absent.length - MAX_RANGES_LISTED} more`] : absent;
      notices.push(h("li", { dataset: { absent: absent.join(",") } },
        `Rank${absent.length === 1 ? "" : "s"} ${listRanks(named)} ${absent.length === 1 ? "has" : "have"} not reached this server.`));
    }
    const ranges = partial.ranges || [];
    for (const r of ranges.slice(0, MAX_RANGES_LISTED)) notices.push(h("li", { dataset: { partial: `${r.first}-${r.last}` } }, `${partialText(r)}.`));
    if (ranges.length > MAX_RANGES_LISTED) notices.push(h("li", {}, `… and ${ranges.length - MAX_RANGES_LISTED} more ranges.`));
    const shown = new Set(a.shown);
    setChildren(body,
      notices.length ? h("div", { class: "notice notice-warning ranks-notice", role: "status",
        dataset: { partialSteps: String(partial.steps || 0) } },
      h("p", { class: "notice-title" }, partial.steps
        ? `${fmtCount(partial.steps)} step${partial.steps === 1 ? " was" : "s were"} stored without every rank: their global values leave those ranks out`
        : lost.length ? "A rank was lost" : "Not every rank is here"),
      h("ul", {}, notices)) : null,
      h("div", { class: "table-wrap" }, h("table", { class: "ranks-table" },
        h("thead", {}, h("tr", {},
          ["Rank", "Status", "Last step", "Steps", "Last heard", "Run"].map((t, i) => h("th", { scope: "col", class: i && i < 4 && i !== 1 ? "num" : "" }, t)))),
        h("tbody", {}, ranks.map((r) => h("tr", { dataset: { rank: String(r.rank), lost: r.lost ? "1" : "", shown: shown.has(r.rank) ? "1" : "" } },
          h("td", {}, `rank ${r.rank}`),
          h("td", {}, statusBadge(r.status), r.lost ? h("span", { class: "fcount fcount-error" }, "lost") : null),
          h("td", { class: "num" }, r.last_step != null ? fmtCount(r.last_step) : "—"),
          h("td", { class: "num" }, fmtCount(r.steps)),
          h("td", { title: fmtTime(r.updated_at) }, fmtAgo(r.updated_at)),
          h("td", {}, h("a", { href: runPageUrl(r.run_id), class: "rank-link" }, r.run_id))))))));
    if (st.run && (a.ranks || []).length > MAX_SHOWN_RANKS) pick.value = a.shown.join(",");
  }

  function showStraggler(found, label) {
    straggler.hidden = !found;
    card.dataset.straggler = found ? String(found.rank) : "";
    if (found) {
      setChildren(straggler, h("strong", {}, `Rank ${found.rank} is the straggler`),
        `: ${fmtNum(found.seconds)} s ${label} per step (median), the other ranks ${fmtNum(found.others)} s.`);
    }
  }

  const views = { ranks: tableView };
  for (const spec of CHARTS) views[spec.id] = rankChartView(spec, { fetchRanks, onXRange, maybeRefresh, showStraggler });
  return views;
}

/** One chart of the section: a line per rank drawn, from each child run's series of `spec.key`. */
function rankChartView(spec, { fetchRanks, onXRange, maybeRefresh, showStraggler }) {
  const { card, plot } = chartCard({ id: spec.id, title: spec.title, help: spec.help });
  const outliers = h("p", { class: "card-help rank-outliers", hidden: true, role: "status" });
  card.append(outliers);
  const chart = new LineChart(plot, { name: spec.id, log: Boolean(spec.log), unit: spec.unit || "", emptyText: "No rank reports this", onXRange });
  const keys = new Map(); // child run id -> the key found in its metric names (asked for until found)

  async function keyOf(runId) {
    if (!spec.bytes) return spec.key([]);
    if (!keys.get(runId)) keys.set(runId, spec.key((await api.metrics(runId)).scalars || []));
    return keys.get(runId);
  }

  async function seriesOf(rank, runId, maxPoints) {
    const key = await keyOf(runId);
    const name = `rank ${rank}`;
    if (!key) return { name, x: [], y: [], min: null, max: null, key };
    try {
      const r = await api.series(runId, key, { maxPoints });
      return {
        name: spec.bytes && key !== "mem/rss_bytes" ? `${name} · ${key.split("/")[1]}` : name,
        x: r.step || [], y: toNumbers(r.value),
        min: r.downsampled && r.min ? toNumbers(r.min) : null,
        max: r.downsampled && r.max ? toNumbers(r.max) : null,
        key,
      };
    } catch (err) {
      if (err && err.status === 404) return { name, x: [], y: [], min: null, max: null, key }; // the rank has no such series (yet)
      throw err;
    }
  }

  return {
    card,
    chart,
    async load(ctx) {
      const a = await fetchRanks(ctx);
      if (drawsSpread(a.world_size)) return loadSpread(ctx, a);
      outliers.hidden = true;
      const byRank = new Map((a.ranks || []).map((r) => [r.rank, r]));
      const maxPoints = pointsFor(plot);
      const series = await Promise.all(a.shown.map((rank) => seriesOf(rank, byRank.get(rank).run_id, maxPoints)));
      if (spec.bytes) {
        let peak = 0;
        for (const s of series) for (const v of s.y) if (v !== null && !isNonFinite(v)) peak = Math.max(peak, Math.abs(v));
        const [unit, size] = byteUnit(peak || 1);
        chart.setScale(size, unit);
        chart.opts.yTitle = unit;
      }
      plot.dataset.ranks = a.shown.join(",");
      plot.dataset.keys = series.map((s) => s.key || "").join(",");
      if (spec.id === "rank-before-backward") {
        showStraggler(findStraggler(series.map((s, i) => ({ rank: a.shown[i], values: s.y }))), "before backward");
      }
      await chart.setSeries(series);
      return series;
    },
    append: maybeRefresh,
    setXRange: (range) => chart.setXRange(range),
    fail: (err) => chart.fail(err),
  };

  /** A big job: the spread across its ranks, one request (docs/distributed.md, The Ranks section). */
  async function loadSpread(ctx, a) {
    const s = await api.ranksSpread(ctx.state.runId, spec.spread);
    const series = spreadSeries(s, toNumbers);
    const fmt = (v) => (spec.bytes ? fmtBytes(v) : fmtNum(v));
    if (spec.bytes) {
      let peak = 0;
      for (const v of series[0].max) if (Number.isFinite(v)) peak = Math.max(peak, Math.abs(v));
      const [unit, size] = byteUnit(peak || 1);
      chart.setScale(size, unit);
      chart.opts.yTitle = unit;
    }
    plot.dataset.spread = spec.spread;
    plot.dataset.ranks = String(s.ranks);
    plot.dataset.outliers = (s.outliers || []).map((o) => o.rank).join(",");
    outliers.hidden = false;
    setChildren(outliers, outliersText(s.outliers, fmt));
    if (spec.id === "rank-before-backward") {
      const top = (s.outliers || []).find((o) => o.high);
      showStraggler(top ? { rank: top.rank, seconds: top.median, others: top.others } : null, "before backward");
    }
    await chart.setSeries(series);
    return series;
  }
}
