// The node's CNI network config as install-cni reads and edits it, pure (no
// file system): which file the runtime uses, and that file with meshcap-cni
// inserted last or removed.
//
// Which file: libcni's ConfFiles order (names ending .conf, .conflist, .json,
// sorted), the first one the runtime can load wins (containerd and CRI-O via
// ocicni skip a file that does not parse, a .conflist without plugins, and a
// .conf/.json without "type"). The edit is a text edit (jsonc-parser's
// parseTree gives the offsets): every byte outside the plugins array's tail stays as the primary
// CNI wrote it, so key order, number formats (1.0, 1e3, big integers) and
// unknown fields are kept exactly, not re-serialised through JSON.parse.
import { findNodeAtLocation, parseTree, type FormattingOptions, type Node as JsonNode } from 'jsonc-parser';
import { isDeepStrictEqual } from 'node:util';

export const PLUGIN_TYPE = 'meshcap-cni';
export const CONF_EXTENSIONS = ['.conf', '.conflist', '.json'] as const;

/** meshcap's plugin entry: `type` plus what the forwarder reads (docs/cni.md). */
export interface MeshcapEntry {
  type: typeof PLUGIN_TYPE;
  agentSocket: string;
  agentTimeoutMs?: number;
  excludeNamespaces?: string[];
  [key: string]: unknown;
}

export interface ConfFile {
  name: string;
  text: string;
}

export type Loaded =
  | { ok: true; kind: 'conflist' | 'conf'; value: Record<string, unknown>; plugins: Record<string, unknown>[] }
  | { ok: false; reason: string };

const isObj = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

export function isConfName(name: string): boolean {
  return !name.startsWith('.') && CONF_EXTENSIONS.some((e) => name.endsWith(e));
}

/** One file as the runtime would load it (ocicni/containerd's rules), or why it is skipped. */
export function loadConf(f: ConfFile): Loaded {
  let value: unknown;
  try {
    value = JSON.parse(f.text);
  } catch (err) {
    return { ok: false, reason: `not valid JSON (${(err as Error).message})` };
  }
  if (!isObj(value)) return { ok: false, reason: 'not a JSON object' };
  if (f.name.endsWith('.conflist')) {
    if (typeof value.name !== 'string' || value.name === '') return { ok: false, reason: 'a .conflist without "name"' };
    const plugins = value.plugins;
    if (!Array.isArray(plugins) || plugins.length === 0) return { ok: false, reason: 'a .conflist without plugins' };
    if (!plugins.every(isObj)) return { ok: false, reason: 'a plugin entry is not an object' };
    return { ok: true, kind: 'conflist', value, plugins };
  }
  if (typeof value.type !== 'string' || value.type === '') return { ok: false, reason: 'no "type" (a .conflist named .conf?)' };
  return { ok: true, kind: 'conf', value, plugins: [value] };
}

export interface Primary {
  file: ConfFile;
  loaded: Extract<Loaded, { ok: true }>;
  /** Files before it that the runtime skips, and why. */
  skipped: { name: string; reason: string }[];
}

/**
 * The file the runtime uses: the first loadable one in lexical order, or the
 * override (which must exist and load). null when there is none (yet).
 */
export function findPrimary(files: readonly ConfFile[], override?: string): Primary | null {
  const sorted = files.filter((f) => isConfName(f.name)).sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  const skipped: { name: string; reason: string }[] = [];
  for (const f of sorted) {
    if (override && f.name !== override) continue;
    const loaded = loadConf(f);
    if (!loaded.ok) {
      skipped.push({ name: f.name, reason: loaded.reason });
      continue;
    }
    return { file: f, loaded, skipped };
  }
  return null;
}

export const isMeshcap = (p: unknown): boolean => isObj(p) && p.type === PLUGIN_TYPE;

/** Whether the loaded config has exactly `entry` as its last plugin and nowhere else. */
export function hasEntry(loaded: Extract<Loaded, { ok: true }>, entry: MeshcapEntry): boolean {
  if (loaded.kind !== 'conflist') return false;
  const at = loaded.plugins.findIndex(isMeshcap);
  return at === loaded.plugins.length - 1 && isDeepStrictEqual(loaded.plugins[at], entry);
}

/** The file's own indentation, so the inserted lines look like its others. */
function formattingOf(text: string): FormattingOptions {
  const eol = text.includes('\r\n') ? '\r\n' : '\n';
  const m = /\n([ \t]+)\S/.exec(text);
  if (m?.[1]?.startsWith('\t')) return { insertSpaces: false, tabSize: 1, eol };
  return { insertSpaces: true, tabSize: m ? Math.min(m[1]!.length, 8) : 2, eol };
}

export type Edit =
  | { action: 'unchanged'; name: string; text: string }
  /** `name` is the file to write; `remove` the file it replaces (a .conf turned into a .conflist). */
  | { action: 'inserted' | 'replaced' | 'converted'; name: string; text: string; remove?: string };

/** The plugins array of a conflist's text, with its elements' offsets (jsonc-parser's tree). */
function pluginsNode(text: string): JsonNode {
  const root = parseTree(text);
  const node = root && findNodeAtLocation(root, ['plugins']);
  if (!node || node.type !== 'array' || !node.children) throw new Error('no plugins array');
  return node;
}

/** The whitespace before an element, so the inserted one lines up with it. */
function indentBefore(text: string, offset: number): string {
  const lineStart = text.lastIndexOf('\n', offset - 1) + 1;
  const lead = text.slice(lineStart, offset);
  return /^[ \t]*$/.test(lead) ? lead : '';
}

/** Drops every meshcap-cni plugin from a conflist's text (each with the comma before it, or after it when first). */
function withoutMeshcap(text: string, plugins: readonly unknown[]): string {
  let out = text;
  for (let i = plugins.length - 1; i >= 0; i--) {
    if (!isMeshcap(plugins[i])) continue;
    const els = pluginsNode(out).children!;
    const el = els[i]!;
    let from: number;
    let to: number;
    if (i > 0) {
      const prev = els[i - 1]!;
      from = prev.offset + prev.length;
      to = el.offset + el.length;
    } else if (els.length > 1) {
      from = el.offset;
      to = els[1]!.offset;
    } else {
      from = el.offset;
      to = el.offset + el.length;
    }
    out = out.slice(0, from) + out.slice(to);
  }
  return out;
}

/** Appends `entry` after the last plugin, indented like it; the rest of the text is untouched. */
function appendPlugin(text: string, entry: MeshcapEntry): string {
  const els = pluginsNode(text).children!;
  const last = els[els.length - 1]!;
  const eol = text.includes('\r\n') ? '\r\n' : '\n';
  const ind = indentBefore(text, last.offset);
  const fmt = formattingOf(text);
  const multiline = ind !== '' || text.slice(last.offset, last.offset + last.length).includes('\n');
  const body = multiline
    ? JSON.stringify(entry, null, fmt.insertSpaces ? (fmt.tabSize ?? 2) : '\t').split('\n').join(eol + ind)
    : JSON.stringify(entry);
  const at = last.offset + last.length;
  const sep = ind !== '' ? `,${eol}${ind}` : multiline ? ', ' : ',';
  return text.slice(0, at) + sep + body + text.slice(at);
}

/**
 * The primary file with meshcap-cni as its last plugin (exactly once, equal to
 * `entry`). A .conflist is edited in place; a .conf/.json becomes
 * `<name>list`, a .conflist whose first plugin is the old file's text
 * verbatim (istio-cni converts the same way; cniVersion and name move to the
 * list, as libcni's ConfListFromConf does).
 */
export function insertEntry(p: Primary, entry: MeshcapEntry): Edit {
  const { file, loaded } = p;
  if (hasEntry(loaded, entry)) return { action: 'unchanged', name: file.name, text: file.text };
  if (loaded.kind === 'conflist') {
    const had = loaded.plugins.some(isMeshcap);
    const kept = loaded.plugins.filter((x) => !isMeshcap(x));
    if (kept.length === 0) throw new Error(`${file.name} chains only meshcap-cni: there is no primary CNI plugin to chain after`);
    const text = appendPlugin(withoutMeshcap(file.text, loaded.plugins), entry);
    return { action: had ? 'replaced' : 'inserted', name: file.name, text };
  }
  const v = loaded.value;
  if (typeof v.name !== 'string' || v.name === '') throw new Error(`${file.name} has no "name": cannot turn it into a .conflist (libcni needs the network's name)`);
  const head: Record<string, unknown> = {};
  if (v.cniVersion !== undefined) head.cniVersion = v.cniVersion;
  head.name = v.name;
  const fmt = formattingOf(file.text);
  const ind = fmt.insertSpaces ? ' '.repeat(fmt.tabSize ?? 2) : '\t';
  const eol = fmt.eol ?? '\n';
  const indentBlock = (s: string, by: string) => s.split(/\r?\n/).map((l) => (l === '' ? l : by + l)).join(eol);
  const entryText = JSON.stringify(entry, null, fmt.insertSpaces ? (fmt.tabSize ?? 2) : '\t');
  const lines = [
    '{',
    ...Object.entries(head).map(([k, val]) => `${ind}${JSON.stringify(k)}: ${JSON.stringify(val)},`),
    `${ind}"plugins": [`,
    `${indentBlock(file.text.trim(), ind + ind)},`,
    indentBlock(entryText, ind + ind),
    `${ind}]`,
    '}',
    '',
  ];
  const base = file.name.replace(/\.(conf|json)$/, '');
  return { action: 'converted', name: `${base}.conflist`, text: lines.join(eol), remove: file.name };
}

/** The file without any meshcap-cni plugin; null when it has none (or is not a loadable conflist). */
export function removeEntry(f: ConfFile): string | null {
  const loaded = loadConf(f);
  if (!loaded.ok || loaded.kind !== 'conflist' || !loaded.plugins.some(isMeshcap)) return null;
  return withoutMeshcap(f.text, loaded.plugins);
}

export interface ChainCheck {
  ok: boolean;
  file: string | null;
  detail: string;
}

/** Whether the runtime's config has meshcap's entry last: install-cni's readiness. */
export function checkChain(files: readonly ConfFile[], entry: MeshcapEntry, override?: string): ChainCheck {
  const p = findPrimary(files, override);
  if (!p) return { ok: false, file: null, detail: override ? `${override} is missing or not a loadable CNI config` : 'no loadable CNI network config yet (waiting for the primary CNI)' };
  if (hasEntry(p.loaded, entry)) return { ok: true, file: p.file.name, detail: `meshcap-cni is last in ${p.file.name}` };
  const types = p.loaded.plugins.map((x) => String(x.type));
  return { ok: false, file: p.file.name, detail: `${p.file.name} does not end with meshcap's entry (plugins: ${types.join(', ')})` };
}
