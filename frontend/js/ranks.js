// The per-rank view of a distributed run, as pure functions of the server's answers
// (GET /api/runs/{id}/ranks, each child run's metric names and series): which ranks to draw,
// which memory figure each rank has, which rank is the straggler, and the partial steps in words.
// views/ranks.js draws them; tests/frontend/ranks.test.mjs checks them.

/** Ranks drawn at once: one series request per rank per chart, so 4 x 8 requests at most. */
export const MAX_SHOWN_RANKS = 8;

/** Jobs of more ranks than this draw the spread across ranks (quantile bands, outlier ranks),
 * one request per chart, instead of a line per rank: past 16 lines a chart tells nothing. */
export const SMALL_JOB_RANKS = 16;

/** Whether a job of `worldSize` ranks draws bands (else a line per rank drawn). */
export function drawsSpread(worldSize) {
  return Number.isInteger(worldSize) && worldSize > SMALL_JOB_RANKS;
}

/**
 * The chart series of a spread (GET /api/runs/{job}/ranks/spread): two bands around the median
 * across ranks, min-max and p5-p95, each drawn as the LineChart draws a downsampled series.
 * @param {{steps: number[], min: (number|null)[], p5: (number|null)[], p50: (number|null)[], p95: (number|null)[], max: (number|null)[]}} s
 */
export function spreadSeries(s, toNumbers = (v) => v.map((x) => (x === null ? NaN : x))) {
  const x = s.steps || [];
  const p50 = toNumbers(s.p50 || []);
  return [
    { name: "ranks: min–max (line: median)", x, y: p50, min: toNumbers(s.min || []), max: toNumbers(s.max || []) },
    { name: "ranks: p5–p95", x, y: p50.slice(), min: toNumbers(s.p5 || []), max: toNumbers(s.p95 || []) },
  ];
}

/** The outlier ranks in words: "rank 5 (0.05, the ranks' median 0.01)", "ranks 5 and 9 above, 3 below". */
export function outliersText(outliers, fmt = String) {
  if (!outliers || !outliers.length) return "No rank stands apart.";
  const parts = outliers.map((o) => `rank ${o.rank} ${o.high ? "above" : "below"} (${fmt(o.median)}; the ranks' median ${fmt(o.others)})`);
  return `Outlier rank${outliers.length === 1 ? "" : "s"}: ${parts.join(", ")}.`;
}

/** A run list badge for a distributed run ("2 ranks"), or null for a single-process one. */
export function ranksBadgeText(worldSize) {
  return Number.isInteger(worldSize) && worldSize > 1 ? `${worldSize} ranks` : null;
}

/**
 * The memory series of one rank: its CUDA device's allocated bytes when it reports one (the
 * lowest device number if several), else the process's resident set, else null.
 * @param {string[]} scalars  the rank's scalar names (GET /api/runs/{child}/metrics)
 */
export function rankMemoryKey(scalars) {
  const cuda = scalars.filter((k) => /^mem\/cuda:\d+\/allocated$/.test(k))
    .sort((a, b) => Number(a.split(/[:/]/)[2]) - Number(b.split(/[:/]/)[2]));
  if (cuda.length) return cuda[0];
  return scalars.includes("mem/rss_bytes") ? "mem/rss_bytes" : null;
}

/** The ranks of a job of `worldSize` that have not reached the server (no run of theirs in `ranks`). */
export function absentRanks(worldSize, ranks) {
  const here = new Set(ranks.map((r) => r.rank));
  const out = [];
  for (let r = 0; r < worldSize; r++) if (!here.has(r)) out.push(r);
  return out;
}

/** "1", "1 and 3", "1, 3 and 4". */
export function listRanks(ranks) {
  const r = ranks.map(String);
  return r.length < 2 ? r.join("") : `${r.slice(0, -1).join(", ")} and ${r[r.length - 1]}`;
}

/** A partial range in words: "steps 38-60 are missing rank 1", "step 7 is missing ranks 0 and 2". */
export function partialText({ first, last, missing }) {
  const steps = first === last ? `step ${first} is` : `steps ${first}-${last} are`;
  return `${steps} missing rank${missing.length === 1 ? "" : "s"} ${listRanks(missing)}`;
}

/**
 * The ranks to draw: all when there are at most `cap`; else those asked for (`chosen`, in the
 * run's ranks), or rank 0, the lost ranks and then the lowest others, `cap` in all, in order.
 * @param {{rank: number, lost: boolean}[]} ranks  as /ranks lists them
 * @param {number[]|null} chosen  ranks the user asked for (?ranks=)
 */
export function shownRanks(ranks, chosen = null, cap = MAX_SHOWN_RANKS) {
  const all = ranks.map((r) => r.rank);
  if (chosen && chosen.length) {
    const asked = new Set(chosen);
    return all.filter((r) => asked.has(r)).slice(0, cap);
  }
  if (all.length <= cap) return all;
  const picked = new Set([all[0], ...ranks.filter((r) => r.lost).map((r) => r.rank)]);
  for (const r of all) {
    if (picked.size >= cap) break;
    picked.add(r);
  }
  return all.filter((r) => picked.has(r)).slice(0, cap);
}

/** "0-3,17" as [0, 1, 2, 3, 17]; anything that is not such a list is null. */
export function parseRanks(text) {
  const s = String(text || "").replace(/\s+/g, "");
  if (!s) return null;
  const out = [];
  for (const part of s.split(",")) {
    const m = /^(\d{1,5})(?:-(\d{1,5}))?$/.exec(part);
    if (!m) return null;
    const a = Number(m[1]);
    const b = m[2] === undefined ? a : Number(m[2]);
    if (b < a || b - a > 65535) return null;
    for (let r = a; r <= b; r++) out.push(r);
  }
  return [...new Set(out)].sort((x, y) => x - y);
}

/** The median of the finite numbers of `values`, or null when there are none. */
export function median(values) {
  const v = values.filter((x) => typeof x === "number" && Number.isFinite(x)).sort((a, b) => a - b);
  if (!v.length) return null;
  const mid = v.length >> 1;
  return v.length % 2 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
}

/** A rank stands apart when its median is this many times the others' (and MIN_GAP_S more). */
export const STRAGGLER_RATIO = 1.5;
export const STRAGGLER_MIN_GAP_S = 0.002;

/**
 * The straggler among ranks, from each rank's seconds before backward per step (forward and
 * data loading: under DDP the other ranks wait for the slowest one inside backward, so their
 * step times are alike and this is where the slow rank stands apart): the rank whose median is
 * at least STRAGGLER_RATIO times the median of the other ranks' medians, and STRAGGLER_MIN_GAP_S
 * seconds more; null when no rank stands apart (or fewer than two ranks have values).
 * @param {{rank: number, values: (number|null)[]}[]} perRank
 * @returns {{rank: number, seconds: number, others: number}|null}
 */
export function findStraggler(perRank) {
  const medians = perRank.map((r) => ({ rank: r.rank, m: median(r.values) })).filter((r) => r.m !== null);
  if (medians.length < 2) return null;
  const top = medians.reduce((a, b) => (b.m > a.m ? b : a));
  const others = median(medians.filter((r) => r !== top).map((r) => r.m));
  if (top.m < STRAGGLER_RATIO * others || top.m - others < STRAGGLER_MIN_GAP_S) return null;
  return { rank: top.rank, seconds: top.m, others };
}
