// Param groups by name: the words for `lr/G` (param group G, counting across optimizers in the
// order of GET /api/runs/{id}/groups), the same on the run page, in compare's charts and in its
// settings table. A group's own name (param_groups[i]["name"]) when it has one.

/**
 * A group's words: its name, else "group I"; prefixed by its optimizer when the run has several.
 * @param {{optimizer: number, index: number, name?: string|null}} g
 */
export function groupLabel(g, severalOptimizers = false) {
  return `${severalOptimizers ? `optimizer ${g.optimizer} · ` : ""}${g.name || `group ${g.index}`}`;
}

/** The run's groups in `lr/G` order (by optimizer, then index), with their labels: [{group, label}]. */
export function labelledGroups(groups) {
  const ordered = (groups || []).slice().sort((a, b) => a.optimizer - b.optimizer || a.index - b.index);
  const several = ordered.some((g) => g.optimizer > 0);
  return ordered.map((g) => ({ group: g, label: groupLabel(g, several) }));
}

/** The words for scalar `lr/G` of a run with `groups`: its group's label, or "group G" when unknown. */
export function lrLabel(groups, key) {
  const g = Number(key.slice(3));
  const found = labelledGroups(groups)[g];
  return found ? found.label : `group ${g}`;
}

/**
 * The groups of several runs matched by label, in order of first appearance: [{label, at}],
 * `at[i]` being run i's G for that label (-1 where it has none). A run whose groups are unknown
 * (null) counts as having one unnamed group, so that its `lr/0` is still drawn.
 */
export function sharedGroups(groupsPerRun) {
  const out = [];
  groupsPerRun.forEach((groups, i) => {
    const labels = groups && groups.length ? labelledGroups(groups).map((x) => x.label) : ["group 0"];
    labels.forEach((label, g) => {
      let entry = out.find((e) => e.label === label);
      if (!entry) {
        entry = { label, at: groupsPerRun.map(() => -1) };
        out.push(entry);
      }
      entry.at[i] = g;
    });
  });
  return out;
}
