// View state in the address bar, so that a view can be shared by copying its URL.
// Run page: ?param=NAME (repeatable: the parameters shown) or ?module=PATH (every parameter of a
// module) or ?top=K&order=asc|desc (the K largest/smallest), &from=STEP&to=STEP (the zoom),
// &ranks=0-3,17 (a distributed run's ranks to draw, beyond 8 ranks).
// Run list: ?q=TEXT&project=NAME&status=STATUS&tag=TAG&sort=COLUMN&dir=asc|desc.
// Compare: ?runs=ID,ID&x=step|time&layout=overlay|side&scalar=KEY&metric=METRIC&param=NAME (repeatable).

/** The current query as {key: [values]}. */
export function readQuery() {
  const out = {};
  for (const [k, v] of new URLSearchParams(location.search)) (out[k] ||= []).push(v);
  return out;
}

/** First value of a query key, or `fallback`. */
export function queryValue(q, key, fallback = null) {
  return q[key] && q[key].length ? q[key][0] : fallback;
}

/** Replace the query with `values` ({key: value | [values] | null}) without reloading. */
export function writeQuery(values) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(values)) {
    if (v === null || v === undefined || v === "") continue;
    for (const item of Array.isArray(v) ? v : [v]) q.append(k, String(item));
  }
  const s = q.toString();
  const url = `${location.pathname}${s ? `?${s}` : ""}${location.hash}`;
  if (url !== `${location.pathname}${location.search}${location.hash}`) history.replaceState(null, "", url);
}
