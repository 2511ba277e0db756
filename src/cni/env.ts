// The runtime's environment: CNI_ARGS, and the container id and interface
// name rules.
import { CniError } from './errors.js';
import { CNI_ERROR_CODES, NAME_PATTERN } from './rules.js';

/** CNI_ARGS "K=V;K=V" -> object. Empty segments are skipped; a pair without
 * "=" or with an empty key is an error (code 4), as in libcni's LoadArgs. */
export function parseCniArgs(s: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const pair of s.split(';')) {
    if (pair === '') continue;
    const eq = pair.indexOf('=');
    if (eq <= 0) throw new CniError(CNI_ERROR_CODES.INVALID_ENV, `CNI_ARGS: invalid pair ${JSON.stringify(pair)} (want KEY=VALUE)`);
    out[pair.slice(0, eq)] = pair.slice(eq + 1);
  }
  return out;
}

const CONTAINER_ID_RE = new RegExp(NAME_PATTERN);

/** The spec's container id rule: alphanumeric first, then [A-Za-z0-9_.-]. */
export function validateContainerId(id: string): void {
  if (id === '') throw new CniError(CNI_ERROR_CODES.INVALID_ENV, 'CNI_CONTAINERID is not set');
  if (!CONTAINER_ID_RE.test(id)) {
    throw new CniError(CNI_ERROR_CODES.INVALID_ENV, 'CNI_CONTAINERID has invalid characters (want [A-Za-z0-9][A-Za-z0-9_.-]*)', id);
  }
}

/** Linux interface name rules (as libcni's ValidateInterfaceName). */
export function validateIfname(name: string): void {
  const bad = (why: string) => new CniError(CNI_ERROR_CODES.INVALID_ENV, `CNI_IFNAME ${JSON.stringify(name)} ${why}`);
  if (name === '') throw new CniError(CNI_ERROR_CODES.INVALID_ENV, 'CNI_IFNAME is not set');
  if (Buffer.byteLength(name) > 15) throw bad('is longer than 15 bytes');
  if (name === '.' || name === '..') throw bad('is not a valid interface name');
  if (/[/:\s]/.test(name)) throw bad('contains "/", ":" or whitespace');
}
