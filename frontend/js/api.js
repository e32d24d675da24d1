// Every route the dashboard calls, and nothing else builds a server URL.
//
//   GET  /api/runs?project=&q=&status=&tag=&limit=&offset=     run list          (runs)
//   GET  /api/runs/{id}                                         one run           (run)
//   PATCH /api/runs/{id}  {name?, tags?}                        rename, tag       (updateRun; token)
//   DELETE /api/runs/{id}                                       delete            (deleteRun; token)
//   GET  /api/runs/{id}/params                                  parameter list    (params)
//   GET  /api/runs/{id}/groups                                  param groups      (groups)
//   GET  /api/runs/{id}/metrics                                 metric names      (metrics)
//   GET  /api/runs/{id}/series?key=&start=&end=&max_points=&time=&smooth=  one scalar   (series)
//   GET  /api/runs/{id}/params/series?metric=&param=&top=&rank_by=&...&time=&smooth=  per-parameter (paramSeries)
//   GET  /api/runs/{id}/params/spread?metric=&start=&end=&max_points=  spread across parameters (spread)
//   GET  /api/runs/{id}/heatmap?metric=&start=&end=&max_steps=&encoding=f32  parameter x step  (heatmap)
//   GET  /api/runs/{id}/diagnostics                             findings          (diagnostics)
//   GET  /api/runs/{id}/ranks                                   a job's ranks, partial steps (ranks)
//   GET  /api/runs/{id}/export?format=csv|json|parquet&table=params|steps  download link (exportUrl)
//   WS   /ws/live                                               run events        (liveUrl)
//   WS   /ws/live?run={id}                                      run events + steps (liveUrl)
//
// Pages: /  (run list), /runs/{id} (one run), /compare?runs=ID,ID (runPageUrl, compareUrl).
// See docs/api.md and the "Live protocol" section of docs/protocol.md.
//
// Writes send the server's token (`gradwatch serve --token`) once the user has given it: it is
// kept in sessionStorage for this tab only (setToken), and a 401 is an ApiError with status 401.

/**
 * An HTTP answer other than 2xx; `status` is the code, `message` the server's detail, `body`
 * the answer's JSON (a run's 404 says `run`: "deleted" or "unknown"), or null.
 */
export class ApiError extends Error {
  constructor(status, message, body = null) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.body = body;
  }
}

/** The server could not be reached at all (down, restarting, network gone). */
export class UnreachableError extends Error {
  constructor(cause) {
    super("The gradwatch server is unreachable.");
    this.name = "UnreachableError";
    this.cause = cause;
  }
}

const enc = encodeURIComponent;

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v === undefined || v === null || v === "") continue;
    for (const item of Array.isArray(v) ? v : [v]) q.append(k, String(item));
  }
  const s = q.toString();
  return s ? `?${s}` : "";
}

const TOKEN_KEY = "gradwatch.token";

/** The write token given in this tab, or "". */
export function getToken() {
  try { return sessionStorage.getItem(TOKEN_KEY) || ""; } catch { return ""; }
}

/** Keep the write token for this tab ("" forgets it). */
export function setToken(token) {
  try {
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch { /* storage disabled: the token lasts until the page is left */ }
}

async function getJSON(path, params = {}, opts = {}) {
  return request("GET", path + query(params), undefined, opts);
}

async function request(method, url, body, { signal } = {}) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const token = method !== "GET" ? getToken() : "";
  if (token) headers.Authorization = `Bearer ${token}`;
  let res;
  try {
    res = await fetch(url, { method, headers, signal, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (err) {
    if (err && err.name === "AbortError") throw err;
    throw new UnreachableError(err);
  }
  if (!res.ok) {
    let detail = `${res.status} ${res.statusText}`;
    let answer = null;
    try {
      answer = await res.json();
      if (answer && answer.detail) detail = typeof answer.detail === "string" ? answer.detail : JSON.stringify(answer.detail);
    } catch { /* not JSON: keep the status line */ }
    throw new ApiError(res.status, detail, answer);
  }
  return res.status === 204 ? null : res.json();
}

const runPath = (id) => `/api/runs/${enc(id)}`;

export const api = {
  health: () => getJSON("/api/health"),
  runs: ({ project, q, status, tag, limit = 500, offset = 0 } = {}, opts) =>
    getJSON("/api/runs", { project, q, status, tag, limit, offset }, opts),
  run: (id, opts) => getJSON(runPath(id), {}, opts),
  /** `changes`: {name?: string, tags?: string[]}; resolves to the updated run. */
  updateRun: (id, changes, opts) => request("PATCH", runPath(id), changes, opts),
  deleteRun: (id, opts) => request("DELETE", runPath(id), undefined, opts),
  params: (id, opts) => getJSON(`${runPath(id)}/params`, {}, opts),
  groups: (id, opts) => getJSON(`${runPath(id)}/groups`, {}, opts),
  metrics: (id, opts) => getJSON(`${runPath(id)}/metrics`, {}, opts),
  /** `smooth`: the server's debiased EMA of the raw series, before downsampling (0 or absent: off). */
  series: (id, key, { start, end, maxPoints, time, smooth } = {}, opts) =>
    getJSON(`${runPath(id)}/series`, { key, start, end, max_points: maxPoints, time: time ? "true" : undefined,
      smooth: smooth || undefined }, opts),
  paramSeries: (id, metric, { params, top, order, rankBy, start, end, maxPoints, time, smooth } = {}, opts) =>
    getJSON(`${runPath(id)}/params/series`,
      { metric, param: params && params.length ? params : undefined, top, order, rank_by: rankBy, start, end,
        max_points: maxPoints, time: time ? "true" : undefined, smooth: smooth || undefined }, opts),
  spread: (id, metric, { start, end, maxPoints } = {}, opts) =>
    getJSON(`${runPath(id)}/params/spread`, { metric, start, end, max_points: maxPoints }, opts),
  /** Cells as base64 float32 (`z_f32`, grid.js decodes them): a quarter of JSON's bytes, nothing to parse. */
  heatmap: (id, metric, { start, end, maxSteps } = {}, opts) =>
    getJSON(`${runPath(id)}/heatmap`, { metric, start, end, max_steps: maxSteps, encoding: "f32" }, opts),
  diagnostics: (id, opts) => getJSON(`${runPath(id)}/diagnostics`, {}, opts),
  /** A distributed run's ranks (each one's child run) and its partial steps (docs/api.md, Ranks). */
  ranks: (id, opts) => getJSON(`${runPath(id)}/ranks`, {}, opts),
  /** A per-rank scalar across a job's ranks: per step min/p5/p50/p95/max, and the outlier ranks. */
  ranksSpread: (id, metric, opts) => getJSON(`${runPath(id)}/ranks/spread`, { metric }, opts),
};

/** The download link of a run's export: per parameter (`table` "params", the default) or per step ("steps"). */
export function exportUrl(id, format, table = "params") {
  return `${runPath(id)}/export${query({ format, table: table === "params" ? undefined : table })}`;
}

/** The live websocket URL: every run's events, plus one run's steps when `runId` is given. */
export function liveUrl(runId) {
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  return `${proto}//${location.host}/ws/live${runId ? query({ run: runId }) : ""}`;
}

export const runPageUrl = (id) => `/runs/${enc(id)}`;
export const compareUrl = (ids) => `/compare?runs=${ids.map(enc).join(",")}`;
