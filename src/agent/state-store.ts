// One record per CNI attachment (container id + ifname) in the agent's state
// directory: what ADD set up, so DEL, CHECK, GC and `meshcap status` can act on
// it after the netns is gone or the agent restarted. Each record is its own
// JSON file written atomically (tmp + rename): an agent crash leaves either
// the old record or the new one, never half of one. No fsync: a record
// describes kernel state (pins, maps, netns rules) that a reboot erases too,
// so it only has to survive the process, and the page cache does that; fsync
// cost ~0.8 ms per ADD on disk for nothing (the default dir is tmpfs anyway).
import { chmodSync, closeSync, mkdirSync, openSync, readdirSync, readFileSync, renameSync, rmSync, unlinkSync, writeSync } from 'node:fs';
import path from 'node:path';
import type { MeshProfile } from '../mesh/vocabulary.js';
import type { Mode } from '../loader/mode.js';
import { buildCaptureConfig, type CaptureConfig, type CaptureSettings } from '../redirect/config.js';

export const STATE_VERSION = 1;
export const DEFAULT_STATE_DIR = '/var/run/meshcap/state';

export interface AttachmentRecord {
  version: typeof STATE_VERSION;
  containerId: string;
  ifname: string;
  podNamespace: string;
  podName: string;
  podUid?: string;
  /** CNI_NETNS at ADD. */
  netns: string;
  /** The netns cookie (decimal), the pod's identity in eBPF mode; null if the kernel cannot tell it. */
  netnsCookie: string | null;
  mode: Mode;
  /** Why this pod is not in the node's mode, if it is not. */
  modeReason?: string;
  profile: MeshProfile;
  /** The capture settings as applied (CaptureConfig without its derived `parsed`). */
  settings: CaptureSettings;
  podIPs: string[];
  createdAt: string;
}

export class StateError extends Error {
  constructor(readonly file: string, detail: string) {
    super(`state record ${file}: ${detail}`);
    this.name = 'StateError';
  }
}

export function attachmentKey(containerId: string, ifname: string): string {
  // Both are validated by the CNI layer ([A-Za-z0-9_.-] and no '/'), so the
  // key is a safe file name; '@' cannot occur in a container id.
  return `${containerId}@${ifname}`;
}

export function settingsOf(config: CaptureConfig): CaptureSettings {
  const { parsed: _parsed, ...settings } = config;
  return settings;
}

/**
 * One CaptureConfig per distinct settings: a node's pods share a few (one
 * per workload), and a pass over 10,000 records parsed each one anew. The
 * objects are shared, so nothing may change one (nothing does); the cache
 * starts over past CONFIGS_KEPT distinct settings.
 */
const configs = new Map<string, CaptureConfig>();
const CONFIGS_KEPT = 4096;

export function configOf(rec: AttachmentRecord): CaptureConfig {
  // Interned settings (the store's records all have them) are frozen and
  // shared: their config is found by identity, without the JSON (a pass
  // over 10,000 pods asked twice per pod: ~70 ms and ~10 MiB of strings).
  const isInterned = interned.has(rec.settings);
  const hit = isInterned ? configOfInterned.get(rec.settings) : undefined;
  if (hit) return hit;
  const key = JSON.stringify(rec.settings);
  let cfg = configs.get(key);
  if (!cfg) {
    cfg = buildCaptureConfig(rec.settings);
    if (configs.size >= CONFIGS_KEPT) configs.clear();
    configs.set(key, cfg);
  }
  if (isInterned) configOfInterned.set(rec.settings, cfg);
  return cfg;
}

/** configOf's answer for interned settings objects, by identity. */
const configOfInterned = new WeakMap<CaptureSettings, CaptureConfig>();

/**
 * The CaptureConfig configOf keeps for cfg's settings (cfg itself, kept, when
 * there is none yet): an ADD's freshly decided config swapped for the shared
 * one, so what is derived per config object (the map entry templates of
 * src/maps/pod-entries.ts, ~20 us per pod to build) is built once per
 * workload, not per pod. cfg must be a strict build of its settings (as
 * decideAdd's are), which is what configOf would build from them.
 */
export function sharedConfig(cfg: CaptureConfig): CaptureConfig {
  // Already a shared one: podToCaptureConfig hands back the same object for
  // the same settings (src/redirect/pod.ts), so most ADDs end here without
  // the settings' JSON.
  if (settingsOfShared.has(cfg)) return cfg;
  const settings = settingsOf(cfg);
  const key = JSON.stringify(settings);
  let known = configs.get(key);
  if (!known) {
    if (configs.size >= CONFIGS_KEPT) configs.clear();
    configs.set(key, cfg);
    known = cfg;
  }
  // its record's settings, interned with the key already made (put() then needs no second JSON)
  if (!settingsOfShared.has(known)) settingsOfShared.set(known, internKeyed(key, settings));
  return known;
}

const settingsOfShared = new WeakMap<CaptureConfig, CaptureSettings>();

/** A record's settings for cfg: the interned ones for a config from sharedConfig, else settingsOf(cfg). */
export function recordSettings(cfg: CaptureConfig): CaptureSettings {
  return settingsOfShared.get(cfg) ?? settingsOf(cfg);
}

/**
 * One frozen settings object per distinct settings, shared by every record
 * that has them: a node's pods carry a few (one per workload), and 10,000
 * records each holding its own copy were most of the state index's heap.
 * Keyed by the settings' JSON as written (key order included), so a record
 * rewritten from the shared object is byte-identical to the one it came
 * from. Frozen deeply: it is shared, so nothing may change it (nothing
 * does; now a write would throw instead of changing other pods' records).
 * Starts over past CONFIGS_KEPT distinct settings, as `configs` does.
 */
const sharedSettings = new Map<string, CaptureSettings>();

/** The interned objects themselves: interning one again is a lookup, not a JSON. */
const interned = new WeakSet<CaptureSettings>();

export function internSettings(settings: CaptureSettings): CaptureSettings {
  if (interned.has(settings)) return settings;
  return internKeyed(JSON.stringify(settings), settings);
}

function internKeyed(key: string, settings: CaptureSettings): CaptureSettings {
  let shared = sharedSettings.get(key);
  if (!shared) {
    shared = deepFreeze(structuredClone(settings));
    if (sharedSettings.size >= CONFIGS_KEPT) sharedSettings.clear();
    sharedSettings.set(key, shared);
    interned.add(shared);
  }
  return shared;
}

function deepFreeze<T>(v: T): T {
  if (typeof v === 'object' && v !== null && !Object.isFrozen(v)) {
    for (const x of Object.values(v)) deepFreeze(x);
    Object.freeze(v);
  }
  return v;
}

/**
 * Shared settings as JSON.stringify(record, null, 1) writes them (the
 * `"settings": {...}` member at depth 1), once per shared object: they are
 * most of a record's text and the same for a workload's pods.
 */
const settingsText = new WeakMap<CaptureSettings, string>();
const SETTINGS_SLOT = '\n "settings": 0,\n';

/** The record file's text: JSON.stringify(rec, null, 1) + newline, byte for byte, with shared settings spliced in from their cached text. */
export function recordText(rec: AttachmentRecord): string {
  const s = rec.settings;
  if (interned.has(s)) {
    let text = settingsText.get(s);
    if (text === undefined) {
      text = JSON.stringify({ settings: s }, null, 1).slice(2, -2);
      settingsText.set(s, text);
    }
    const bare = JSON.stringify({ ...rec, settings: 0 }, null, 1);
    // (a string value cannot hold the slot: JSON escapes its newlines)
    const at = bare.indexOf(SETTINGS_SLOT);
    if (at >= 0) return `${bare.slice(0, at)}\n${text},\n${bare.slice(at + SETTINGS_SLOT.length)}\n`;
  }
  return JSON.stringify(rec, null, 1) + '\n';
}

export function cookieOf(rec: AttachmentRecord): bigint | null {
  return rec.netnsCookie === null ? null : BigInt(rec.netnsCookie);
}

function validRecord(v: unknown): v is AttachmentRecord {
  const r = v as Partial<AttachmentRecord> | null;
  return (
    typeof r === 'object' && r !== null && r.version === STATE_VERSION &&
    typeof r.containerId === 'string' && typeof r.ifname === 'string' &&
    typeof r.podNamespace === 'string' && typeof r.podName === 'string' &&
    typeof r.netns === 'string' && (r.netnsCookie === null || typeof r.netnsCookie === 'string') &&
    (r.mode === 'ebpf' || r.mode === 'iptables') && typeof r.settings === 'object' && r.settings !== null &&
    Array.isArray(r.podIPs)
  );
}

/**
 * The interned settings of records read before, by the text of their
 * `settings` member as recordText writes it: a record whose settings text is
 * known is parsed without it (most of its bytes) and takes the shared object,
 * without a JSON.stringify to intern it (at 10,000 records, ~80 ms of a
 * `meshcap status`).
 */
const settingsByText = new Map<string, CaptureSettings>();
const SETTINGS_MEMBER = '\n "settings": ';

/** A record file's JSON; settingsText: its settings' text where parsed in full (for settingsByText). */
function parseRecord(text: string): { value: unknown; settingsText?: string } {
  // Where recordText (JSON.stringify(rec, null, 1)) put the settings: a
  // top-level member, the object's closing brace the first line that is
  // one space and `}` (deeper lines are indented more; a JSON string holds
  // no raw newline). Any other layout is parsed whole.
  const at = text.indexOf(SETTINGS_MEMBER);
  const from = at + SETTINGS_MEMBER.length;
  const end = at >= 0 && text[from] === '{' ? text.indexOf('\n }', from) : -1;
  if (end < 0 || text.includes(SETTINGS_MEMBER, end)) return { value: JSON.parse(text) };
  const settingsText = text.slice(from, end + 3);
  // (a line of another top-level member inside: not what recordText writes)
  if (settingsText.includes('\n "')) return { value: JSON.parse(text) };
  const known = settingsByText.get(settingsText);
  if (!known) return { value: JSON.parse(text), settingsText };
  const value: unknown = JSON.parse(`${text.slice(0, from)}0${text.slice(end + 3)}`);
  if (typeof value === 'object' && value !== null) (value as { settings: unknown }).settings = known;
  return { value };
}

/** Reads every record in `dir` (no directory: none). Unreadable files are reported, not fatal. */
export function readRecords(dir: string): { records: AttachmentRecord[]; problems: string[] } {
  const records: AttachmentRecord[] = [];
  const problems: string[] = [];
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return { records, problems };
    throw err;
  }
  for (const name of names.sort()) {
    if (!name.endsWith('.json')) continue;
    const file = path.join(dir, name);
    try {
      const { value: v, settingsText } = parseRecord(readFileSync(file, 'utf8'));
      if (!validRecord(v)) throw new Error(`not a version ${STATE_VERSION} attachment record`);
      v.settings = internSettings(v.settings);
      if (settingsText !== undefined) {
        if (settingsByText.size >= CONFIGS_KEPT) settingsByText.clear();
        settingsByText.set(settingsText, v.settings);
      }
      records.push(v);
    } catch (err) {
      problems.push(new StateError(file, (err as Error).message).message);
    }
  }
  return { records, problems };
}

/** Whether two records are attachments of one network namespace: by cookie where both have one, else by CNI_NETNS. */
export function sameNetns(a: AttachmentRecord, b: AttachmentRecord): boolean {
  if (a.netnsCookie !== null && b.netnsCookie !== null) return a.netnsCookie === b.netnsCookie;
  return a.netns !== '' && a.netns === b.netns;
}

/** The keys a record is found under in the netns index: its cookie and its CNI_NETNS. */
function netnsKeys(r: AttachmentRecord): string[] {
  const keys: string[] = [];
  if (r.netnsCookie !== null) keys.push(`c${r.netnsCookie}`);
  if (r.netns !== '') keys.push(`p${r.netns}`);
  return keys;
}

/** The state directory plus an in-memory index of it (the agent is its only writer). */
export class StateStore {
  private readonly index = new Map<string, AttachmentRecord>();
  /**
   * Attachment keys by netns cookie and by CNI_NETNS: DEL asks whether
   * another attachment shares the netns, and a walk over every record per DEL
   * (a 10,000-element array and a compare each) grew with the node's pods.
   */
  private readonly byNetns = new Map<string, Set<string>>();
  private tmpSeq = 0;
  /** dir normalised, with its '/': a record's path is one concatenation (path.join cost ~5 us per ADD). */
  private readonly prefix: string;

  constructor(readonly dir: string) {
    this.prefix = path.join(dir, '_').slice(0, -1);
  }

  /** Creates the directory and loads what a previous agent left. Returns unreadable files. */
  open(): string[] {
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    // root-only also when it already existed: records name every pod and its capture settings
    chmodSync(this.dir, 0o700);
    const { records, problems } = readRecords(this.dir);
    for (const r of records) this.set(r);
    return problems;
  }

  private set(r: AttachmentRecord): void {
    const key = attachmentKey(r.containerId, r.ifname);
    this.unset(key);
    this.index.set(key, r);
    for (const k of netnsKeys(r)) {
      let keys = this.byNetns.get(k);
      if (!keys) this.byNetns.set(k, (keys = new Set()));
      keys.add(key);
    }
  }

  private unset(key: string): void {
    const old = this.index.get(key);
    if (!old) return;
    this.index.delete(key);
    for (const k of netnsKeys(old)) {
      const keys = this.byNetns.get(k);
      keys?.delete(key);
      if (keys?.size === 0) this.byNetns.delete(k);
    }
  }

  /** Another attachment of `rec`'s network namespace (Multus: eth0 and net1 each ran the chain), if there is one. */
  siblingOf(rec: AttachmentRecord): AttachmentRecord | undefined {
    const self = attachmentKey(rec.containerId, rec.ifname);
    for (const k of netnsKeys(rec)) {
      for (const key of this.byNetns.get(k) ?? []) {
        if (key === self) continue;
        const r = this.index.get(key)!;
        if (sameNetns(r, rec)) return r;
      }
    }
    return undefined;
  }

  get(containerId: string, ifname: string): AttachmentRecord | undefined {
    return this.index.get(attachmentKey(containerId, ifname));
  }

  list(): AttachmentRecord[] {
    return [...this.index.values()];
  }

  fileOf(containerId: string, ifname: string): string {
    // the key is never '.' or '..' and has no '/' (it holds an '@'): join would change nothing in it
    return `${this.prefix}${attachmentKey(containerId, ifname)}.json`;
  }

  // Synchronous on purpose: a record is a few hundred bytes on tmpfs, three
  // syscalls of a few microseconds; the promise API took four trips through
  // libuv's thread pool per ADD (~1 ms on a busy node, behind any BPF load
  // running there).
  async put(rec: AttachmentRecord): Promise<void> {
    const file = this.fileOf(rec.containerId, rec.ifname);
    const tmp = `${file}.${process.pid}.${this.tmpSeq++}.tmp`;
    try {
      writeWhole(tmp, recordText(rec));
      renameSync(tmp, file);
    } catch (err) {
      rmSync(tmp, { force: true });
      throw err;
    }
    // A copy holding the shared settings: the caller's object stays its own.
    this.set({ ...rec, settings: internSettings(rec.settings) });
  }

  async remove(containerId: string, ifname: string): Promise<void> {
    // unlink, not rmSync({force}): Node 20's rmSync is a JS walk (an lstat,
    // then the unlink), a syscall and JS per DEL for a path that is a file.
    try {
      unlinkSync(this.fileOf(containerId, ifname));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    }
    this.unset(attachmentKey(containerId, ifname));
  }
}

/** writeFileSync(file, text, { mode: 0o600 }) without its option and argument handling (~5 us per record). */
function writeWhole(file: string, text: string): void {
  const buf = Buffer.from(text);
  const fd = openSync(file, 'w', 0o600);
  try {
    for (let off = 0; off < buf.length;) off += writeSync(fd, buf, off);
  } finally {
    closeSync(fd);
  }
}
