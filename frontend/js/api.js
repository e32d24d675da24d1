// Every route the dashboard calls, and nothing else builds a server URL.
//
//   GET  /api/runs?project=&q=&status=&limit=&offset=          run list          (runs)
//   GET  /api/runs/{id}                                         one run           (run)
//   GET  /api/runs/{id}/params                                  parameter list    (params)
//   GET  /api/runs/{id}/metrics                                 metric names      (metrics)
//   GET  /api/runs/{id}/series?key=&start=&end=&max_points=     one scalar        (series)
//   GET  /api/runs/{id}/params/series?metric=&param=&top=&...   per-parameter     (paramSeries)
//   GET  /api/runs/{id}/heatmap?metric=&start=&end=&max_steps=  parameter x step  (heatmap)
//   GET  /api/runs/{id}/diagnostics                             findings          (diagnostics)
//   GET  /api/runs/{id}/export?format=csv|json|parquet          download link     (exportUrl)
//   WS   /ws/live                                               run events        (liveUrl)
//   WS   /ws/live?run={id}                                      run events + steps (liveUrl)
//
// Pages: /  (run list), /runs/{id} (one run), /compare?runs=ID,ID (runPageUrl, compareUrl).
// See docs/api.md and the "Live protocol" section of docs/protocol.md.

/** An HTTP answer other than 2xx; `status` is the code, `message` the server's detail. */
export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.name = "ApiError";
    this.status = status;
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

async function getJSON(path, params = {}, { signal } = {}) {
  let res;
  try {
    res = await fetch(path + query(params), { headers: { Accept: "application/json" }, signal });
  } catch (err) {
    if (err && err.name === "AbortError") throw err;
    throw new UnreachableError(err);
  }
  if (!res.ok) {
    let detail = `${res.status} ${res.statusText}`;
    try {
      const body = await res.json();
      if (body && body.detail) detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
    } catch { /* not JSON: keep the status line */ }
    throw new ApiError(res.status, detail);
  }
  return res.json();
}

const runPath = (id) => `/api/runs/${enc(id)}`;

export const api = {
  health: () => getJSON("/api/health"),
  runs: ({ project, q, status, limit = 500, offset = 0 } = {}, opts) =>
    getJSON("/api/runs", { project, q, status, limit, offset }, opts),
  run: (id, opts) => getJSON(runPath(id), {}, opts),
  params: (id, opts) => getJSON(`${runPath(id)}/params`, {}, opts),
  metrics: (id, opts) => getJSON(`${runPath(id)}/metrics`, {}, opts),
  series: (id, key, { start, end, maxPoints } = {}, opts) =>
    getJSON(`${runPath(id)}/series`, { key, start, end, max_points: maxPoints }, opts),
  paramSeries: (id, metric, { params, top, order, start, end, maxPoints } = {}, opts) =>
    getJSON(`${runPath(id)}/params/series`,
      { metric, param: params && params.length ? params : undefined, top, order, start, end, max_points: maxPoints }, opts),
  heatmap: (id, metric, { start, end, maxSteps } = {}, opts) =>
    getJSON(`${runPath(id)}/heatmap`, { metric, start, end, max_steps: maxSteps }, opts),
  diagnostics: (id, opts) => getJSON(`${runPath(id)}/diagnostics`, {}, opts),
};

/** The download link of a run's export. */
export function exportUrl(id, format) {
  return `${runPath(id)}/export${query({ format })}`;
}

/** The live websocket URL: every run's events, plus one run's steps when `runId` is given. */
export function liveUrl(runId) {
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  return `${proto}//${location.host}/ws/live${runId ? query({ run: runId }) : ""}`;
}

export const runPageUrl = (id) => `/runs/${enc(id)}`;
export const compareUrl = (ids) => `/compare?runs=${ids.map(enc).join(",")}`;
