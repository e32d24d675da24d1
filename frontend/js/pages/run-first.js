// The run page's first three requests (the run, its parameters, its metric names), sent as
// soon as this module and api.js have loaded: run.html runs it on its own, before the rest of
// the page's modules have arrived, and pages/run.js imports this same instance and takes the
// answers. Every request for chart data needs them, so they start the page's work.

import { api } from "../api.js";

/** The run of this page: /runs/{id}, or ?id= */
export const runId = decodeURIComponent(location.pathname.split("/").filter(Boolean)[1]
  || new URLSearchParams(location.search).get("id") || "");

let first = runId ? Promise.all([api.run(runId), api.params(runId), api.metrics(runId)]) : null;
if (first) first.catch(() => {}); // a failure is shown by pages/run.js, which takes the promise

/** The first answers ([run, params, metrics]), once; null after that (later loads ask again). */
export function takeFirst() {
  const f = first;
  first = null;
  return f;
}
