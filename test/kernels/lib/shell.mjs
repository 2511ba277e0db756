// @ts-check
// POSIX shell quoting for the scripts the host writes into the guest.

/** @param {string} s */
export function shQuote(s) {
  return `'${String(s).replace(/'/g, `'\\''`)}'`;
}

/** @param {Record<string, string>} env  -> lines `export K='v'` */
export function shExports(env) {
  return Object.entries(env).map(([k, v]) => {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k)) throw new Error(`invalid environment variable name '${k}'`);
    return `export ${k}=${shQuote(v)}`;
  }).join('\n');
}
