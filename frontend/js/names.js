// Names of series, read from the data: which scalars the hook makes of its own accord (the
// rest are the user's, logged with w.log()), and which series to show first when the user has
// not picked one.

/** Scalars the hook sends by itself (docs/protocol.md): every other scalar is the user's. */
const HOOK_SCALAR = /^(grad_norm_total|backward_passes|lr\/\d+|mem\/.+|amp\/.+|opt\/\d+\/steps|hook\/.+)$/;

/** Whether the user logged scalar `key` (w.log(...)), rather than the hook sending it. */
export function isUserScalar(key) {
  return !HOOK_SCALAR.test(key);
}

/** The scalar to show first among `keys` (sorted): the first the user logged, else the first. */
export function firstScalar(keys) {
  return keys.find(isUserScalar) ?? keys[0] ?? null;
}

/**
 * What to show first of several runs' names (`lists[i]`: run i's, null when it is missing):
 * a name every run has, else the one most runs have; among those, `prefer`red ones first, then
 * in order of first appearance. Null when no run has any.
 */
export function mostShared(lists, prefer = () => true) {
  const known = lists.filter(Boolean);
  const count = new Map();
  for (const list of known) for (const n of new Set(list)) count.set(n, (count.get(n) || 0) + 1);
  let best = null;
  for (const [name, n] of count) {
    if (best === null) { best = name; continue; }
    const b = count.get(best);
    if (n > b || (n === b && prefer(name) && !prefer(best))) best = name;
  }
  return best;
}
