// @ts-check
// Which .ko files to insmod, in which order, for a set of module names:
// resolved from the kernel's modules.dep, skipping modules built into the
// kernel (modules.builtin). Pure: no file system access.

/** Module name as the kernel knows it: basename without .ko, '-' -> '_'. */
export function moduleName(relPath) {
  const base = relPath.slice(relPath.lastIndexOf('/') + 1);
  return base.replace(/\.ko(\.(xz|zst|gz))?$/, '').replace(/-/g, '_');
}

/**
 * @param {string} text  modules.dep ("kernel/a.ko: kernel/b.ko kernel/c.ko")
 * @returns {Map<string, { path: string, deps: string[] }>} keyed by module name
 */
export function parseModulesDep(text) {
  const mods = new Map();
  for (const line of text.split('\n')) {
    const colon = line.indexOf(':');
    if (colon <= 0) continue;
    const path = line.slice(0, colon).trim();
    const deps = line.slice(colon + 1).trim().split(/\s+/).filter(Boolean);
    mods.set(moduleName(path), { path, deps });
  }
  return mods;
}

/** @param {string} text modules.builtin (one path per line) */
export function parseModulesBuiltin(text) {
  return new Set(text.split('\n').map((l) => l.trim()).filter(Boolean).map(moduleName));
}

/**
 * Paths (relative to lib/modules/<release>) to insmod so that every wanted
 * module is loaded, each after its dependencies, each once.
 * @param {Map<string, { path: string, deps: string[] }>} dep
 * @param {Set<string>} builtin
 * @param {string[]} wanted  module names ('-' or '_' both accepted)
 * @returns {string[]}
 */
export function loadOrder(dep, builtin, wanted) {
  /** @type {string[]} */
  const order = [];
  const done = new Set();
  const visiting = new Set();
  /** @param {string} name @param {string[]} chain  users of name, outermost first */
  const visit = (name, chain) => {
    if (done.has(name) || builtin.has(name)) return;
    const m = dep.get(name);
    if (!m) throw new Error(`module ${name} (needed by ${[...chain].reverse().join(' <- ') || 'the VM init'}) is neither in modules.dep nor built in`);
    if (visiting.has(name)) throw new Error(`module dependency cycle: ${[...chain.slice(chain.indexOf(name)), name].join(' -> ')}`);
    visiting.add(name);
    for (const d of m.deps) visit(moduleName(d), [...chain, name]);
    visiting.delete(name);
    done.add(name);
    order.push(m.path);
  };
  for (const w of wanted) visit(w.replace(/-/g, '_'), []);
  return order;
}
