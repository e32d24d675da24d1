// Parameters by module. A parameter's module is its name without the last part
// ("blocks.0.attn.qkv.weight" -> "blocks.0.attn.qkv"; "" for a top-level one), as PyTorch's
// named_parameters() spells it. Pure functions of the names: the heatmaps order their rows
// with them and the per-parameter picker offers whole modules.

/** The module path of a parameter name ("" when the parameter is not in a module). */
export function moduleOf(name) {
  const i = name.lastIndexOf(".");
  return i < 0 ? "" : name.slice(0, i);
}

/** The parameters of module `path` (directly or in its submodules), in the order of `names`. */
export function moduleParams(names, path) {
  if (!path) return names.slice();
  const prefix = `${path}.`;
  return names.filter((n) => n.startsWith(prefix));
}

/**
 * Indices of `names` grouped by module at every depth: each module's parameters, and its
 * submodules', are consecutive. Modules (and parameters within a module) keep the order in
 * which they first appear, which is the model's own order, so a model already grouped keeps it.
 */
export function moduleOrder(names) {
  const root = { items: [], children: new Map() };
  names.forEach((name, index) => {
    const parts = moduleOf(name) ? moduleOf(name).split(".") : [];
    let node = root;
    for (const part of parts) {
      let child = node.children.get(part);
      if (!child) {
        child = { items: [], children: new Map() };
        node.children.set(part, child);
        node.items.push(child);
      }
      node = child;
    }
    node.items.push(index);
  });
  const out = [];
  const walk = (node) => {
    for (const item of node.items) {
      if (typeof item === "number") out.push(item);
      else walk(item);
    }
  };
  walk(root);
  return out;
}

/** The module of `name` cut to its first `depth` parts. */
function moduleAt(name, depth) {
  const mod = moduleOf(name);
  if (!mod || depth <= 0) return "";
  return mod.split(".").slice(0, depth).join(".");
}

/**
 * Runs of consecutive names (ordered by moduleOrder) in the same module cut to `depth` parts:
 * [{module, start, end}] with end exclusive; module "" holds top-level parameters.
 */
export function moduleGroups(names, depth) {
  const groups = [];
  names.forEach((name, i) => {
    const mod = moduleAt(name, depth);
    const last = groups[groups.length - 1];
    if (last && last.module === mod) last.end = i + 1;
    else groups.push({ module: mod, start: i, end: i + 1 });
  });
  return groups;
}

/** The deepest grouping with at most `maxGroups` groups (depth 1 at least): {depth, groups}. */
export function coarseGroups(names, maxGroups) {
  const deepest = Math.max(1, ...names.map((n) => (moduleOf(n) ? moduleOf(n).split(".").length : 0)));
  let best = { depth: 1, groups: moduleGroups(names, 1) };
  for (let depth = 2; depth <= deepest; depth++) {
    const groups = moduleGroups(names, depth);
    if (groups.length > maxGroups) break;
    best = { depth, groups };
  }
  return best;
}

/**
 * Every module that holds parameters, in moduleOrder's order, with its depth and how many
 * parameters it holds (submodules included): [{path, depth, count}].
 */
export function moduleList(names) {
  const counts = new Map();
  for (const i of moduleOrder(names)) {
    const parts = moduleOf(names[i]) ? moduleOf(names[i]).split(".") : [];
    for (let d = 1; d <= parts.length; d++) {
      const path = parts.slice(0, d).join(".");
      counts.set(path, (counts.get(path) || 0) + 1);
    }
  }
  return [...counts].map(([path, count]) => ({ path, depth: path.split(".").length, count }));
}
