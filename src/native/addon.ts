// Typed entry point to meshcap_native.node (native/addon/): libbpf objects,
// bpf_link attach/update/detach, map element ops, feature probes, netns
// cookies and SO_ORIGINAL_DST. Loaded relative to this module, so it resolves
// the same from src/ (vitest) and dist/ (built): both sit two levels below
// the repository root.
import { createRequire } from 'node:module';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { NativeError, type NativeErrorInit } from './errors.js';

export { NativeError } from './errors.js';

export interface ProgramInfo {
  name: string;
  section: string;
  type: number;
  expectedAttachType: number;
  /** -1 before load (and after a failed load). Owned by the BpfObject: closed by close(). */
  fd: number;
}

export interface MapInfo {
  name: string;
  type: number;
  keySize: number;
  valueSize: number;
  maxEntries: number;
  /** -1 before load. Owned by the BpfObject: closed by close(). */
  fd: number;
  pinPath: string | null;
}

export interface BpfObject {
  readonly path: string;
  /** Before load: overwrite a `const volatile` global in .rodata (size must match the variable). */
  setRodata(varName: string, value: Buffer): void;
  /**
   * Before load: the map's max_entries (bpf_map__set_max_entries). Throws
   * NativeError (ENOENT: no such map in the object). A pinned map is reused
   * only when its size equals this, so pass the pinned map's own size to adopt it.
   */
  setMaxEntries(mapName: string, maxEntries: number): void;
  /** bpf_object__load on a worker thread; rejects with NativeError (.log has the verifier log). */
  load(): Promise<void>;
  programs(): ProgramInfo[];
  maps(): MapInfo[];
  /** bpf_object__close: closes program/map fds; pins and links made from them stay. Idempotent. */
  close(): void;
}

export interface OpenObjectOptions {
  /**
   * Pin every (non-internal) map at `${mapPinDir}/${mapName}`: a compatible
   * pinned map is reused, a missing one created and pinned, an incompatible
   * one fails load() naming the map. Internal maps (.rodata/.data/.bss) are
   * never pinned: they carry per-load configuration.
   */
  mapPinDir?: string;
}

export interface LinkInfo {
  id: number;
  progId: number;
  type: number;
  attachType: number | null;
  cgroupId: bigint | null;
  netnsIno: number | null;
}

export interface ProgInfo {
  id: number;
  name: string;
  type: number;
  /** 16 hex chars */
  tag: string;
}

export interface KernelMapInfo {
  id: number;
  name: string;
  type: number;
  keySize: number;
  valueSize: number;
  maxEntries: number;
  flags: number;
}

export interface ProbeAttachResult {
  ok: boolean;
  code?: string;
  errno?: number;
  /** which step failed: 'bpf_prog_load' or 'bpf_link_create' */
  syscall?: string;
}

export interface MapEntriesOptions {
  /** Walk the keys one by one even where batch lookup works (tests). */
  noBatch?: boolean;
  /** Entries asked per batch call (default min(max_entries, 4096); grown when a hash bucket holds more). */
  chunk?: number;
}

/** A whole map's entries (mapEntries). */
export interface MapEntries {
  count: number;
  keySize: number;
  /** Per-CPU maps: every possible CPU's slot, 8-byte aligned each. */
  valueSize: number;
  keys: Buffer;
  values: Buffer;
  /** false: the map type or kernel has no batch lookup and the keys were walked one by one. */
  batched: boolean;
}

export interface OriginalDst {
  family: 4 | 6;
  address: string;
  port: number;
  /** the bytes the kernel returned (optlen of them) */
  raw: Buffer;
  optlen: number;
}

// Names the rest of meshcap relies on; checked when the addon loads so the
// typed properties below are true on this build (the tables hold every
// enumerator of the system <linux/bpf.h>, these are just the guaranteed ones).
const PROG_TYPES = ['CGROUP_SKB', 'CGROUP_SOCK', 'CGROUP_SOCK_ADDR', 'CGROUP_SOCKOPT', 'SOCK_OPS', 'SK_MSG', 'SK_SKB', 'SK_LOOKUP', 'SCHED_CLS', 'SCHED_ACT'] as const;
const ATTACH_TYPES = ['CGROUP_INET_INGRESS', 'CGROUP_INET_EGRESS', 'CGROUP_INET_SOCK_CREATE', 'CGROUP_SOCK_OPS', 'SK_MSG_VERDICT', 'SK_SKB_STREAM_PARSER', 'SK_SKB_STREAM_VERDICT', 'CGROUP_INET4_CONNECT', 'CGROUP_INET6_CONNECT', 'CGROUP_INET4_BIND', 'CGROUP_INET6_BIND', 'CGROUP_INET4_POST_BIND', 'CGROUP_INET6_POST_BIND', 'CGROUP_UDP4_SENDMSG', 'CGROUP_UDP6_SENDMSG', 'CGROUP_UDP4_RECVMSG', 'CGROUP_UDP6_RECVMSG', 'CGROUP_GETSOCKOPT', 'CGROUP_SETSOCKOPT', 'CGROUP_INET4_GETPEERNAME', 'CGROUP_INET6_GETPEERNAME', 'CGROUP_INET4_GETSOCKNAME', 'CGROUP_INET6_GETSOCKNAME', 'CGROUP_INET_SOCK_RELEASE', 'SK_LOOKUP'] as const;
const MAP_TYPES = ['HASH', 'ARRAY', 'PERCPU_HASH', 'PERCPU_ARRAY', 'LRU_HASH', 'LPM_TRIE', 'SOCKMAP', 'SOCKHASH', 'SK_STORAGE', 'RINGBUF'] as const;
const LINK_TYPES = ['CGROUP', 'NETNS', 'XDP'] as const;
const HELPERS = ['map_lookup_elem', 'map_update_elem', 'map_delete_elem', 'get_netns_cookie', 'get_socket_cookie', 'get_current_uid_gid', 'sock_hash_update', 'msg_redirect_hash', 'sk_lookup_tcp', 'sk_assign', 'sk_release', 'sk_storage_get', 'bind'] as const;

type Table<K extends string> = Record<string, number> & Record<K, number>;

export interface Consts {
  progType: Table<(typeof PROG_TYPES)[number]>;
  attachType: Table<(typeof ATTACH_TYPES)[number]>;
  mapType: Table<(typeof MAP_TYPES)[number]>;
  linkType: Table<(typeof LINK_TYPES)[number]>;
  helper: Table<(typeof HELPERS)[number]>;
  BPF_ANY: number;
  BPF_NOEXIST: number;
  BPF_EXIST: number;
  BPF_F_REPLACE: number;
  BPF_F_LOCK: number;
}

interface Binding {
  _setErrorFactory(factory: (init: NativeErrorInit) => Error): void;
  openObject(path: string, opts?: OpenObjectOptions): BpfObject;
  linkCreateCgroup(progFd: number, cgroupPath: string, attachType: number): number;
  linkCreateNetns(progFd: number, netnsPath: string, attachType: number): number;
  linkUpdate(linkFd: number, newProgFd: number, oldProgFd?: number): void;
  linkDetach(linkFd: number): void;
  progAttach(progFd: number, targetFd: number, attachType: number): void;
  progDetach(progFd: number, targetFd: number, attachType: number): void;
  linkInfo(fd: number): LinkInfo;
  linksProveNetns(pins: string[], netnsPaths: string[]): boolean[];
  linksProveNetnsAsync(pins: string[], netnsPaths: string[]): Promise<boolean[]>;
  progInfo(fd: number): ProgInfo;
  cgroupPrograms(cgroupPath: string, attachType: number): { id: number; name: string }[];
  ProgTemplate: new (path: string, opts: ProgTemplateOptions) => ProgTemplate;
  progMapIds(fd: number): number[];
  progGetFdById(id: number): number;
  progTestRunSkLookup(fd: number, ctx: SkLookupTestCtx): { retval: number; cookie: bigint };
  instanceSetU64(mapFd: number, value: bigint): void;
  mapInfo(fd: number): KernelMapInfo;
  objPin(fd: number, path: string): void;
  objGet(path: string): number;
  closeFd(fd: number): void;
  mapUpdate(fd: number, key: Buffer, value: Buffer, flags?: number): void;
  mapLookup(fd: number, key: Buffer, valueSize: number): Buffer | null;
  mapDelete(fd: number, key: Buffer): boolean;
  mapKeys(fd: number, keySize: number): Buffer[];
  mapKeysPacked(fd: number, keySize: number): Buffer;
  mapEntries(fd: number, opts?: MapEntriesOptions): MapEntries;
  mapUpdateBatch(fd: number, keys: Buffer[], values: Buffer[]): void;
  mapDeleteBatch(fd: number, keys: Buffer[]): number;
  mapUpdateEach(fd: number, keys: Buffer[], values: Buffer[], flags?: number): number;
  probeProgType(progType: number): boolean;
  probeMapType(mapType: number): boolean;
  probeHelper(progType: number, helperId: number): boolean;
  probeAttach(progType: number, expectedAttachType: number, targetPath: string): ProbeAttachResult;
  netnsCookie(netnsPath: string): Promise<bigint>;
  netnsReadSysctl(netnsPath: string, file: string): Promise<string>;
  netnsReplyRoutes(netnsPath: string, op: 'add' | 'remove', addrs: string[], table: number, protocol: number): void;
  getOriginalDst(fd: number, level: 'ipv4' | 'ipv6'): OriginalDst;
  setTransparent(fd: number, level: 'ipv4' | 'ipv6'): void;
  takeFd(pid: number, fd: number): number;
  mallocTrim(): boolean;
  CniListener: new (path: string, opts: CniListenerOptions, onEvent: CniEventHandler) => CniListener;
  libbpfVersion(): string;
  takeLibbpfLog(): string;
  consts: Consts;
}

/** Where the addon is: MESHCAP_NATIVE_ADDON if set, else build/native/Release of this checkout. */
export const addonPath: string =
  process.env.MESHCAP_NATIVE_ADDON ??
  fileURLToPath(new URL('../../build/native/Release/meshcap_native.node', import.meta.url));

function loadBinding(): Binding {
  if (!existsSync(addonPath)) {
    throw new Error(
      `meshcap native addon not found at ${addonPath}: build it with \`npx cmake-js compile -d native -O build/native\` (or npm run build)`,
    );
  }
  const binding = createRequire(import.meta.url)(addonPath) as Binding;
  binding._setErrorFactory((init) => new NativeError(init));
  const c = binding.consts;
  const required: [string, Record<string, number>, readonly string[]][] = [
    ['progType', c.progType, PROG_TYPES],
    ['attachType', c.attachType, ATTACH_TYPES],
    ['mapType', c.mapType, MAP_TYPES],
    ['linkType', c.linkType, LINK_TYPES],
    ['helper', c.helper, HELPERS],
  ];
  for (const [table, values, names] of required) {
    const missing = names.filter((n) => typeof values[n] !== 'number');
    if (missing.length) {
      throw new Error(`meshcap native addon at ${addonPath}: consts.${table} lacks ${missing.join(', ')} (built against an old <linux/bpf.h>?)`);
    }
  }
  return binding;
}

const native = loadBinding();

export const consts: Consts = native.consts;

export function openObject(path: string, opts?: OpenObjectOptions): BpfObject {
  return native.openObject(path, opts);
}
/** bpf_link_create on an O_RDONLY fd of the cgroup directory; returns the link fd. */
export function linkCreateCgroup(progFd: number, cgroupPath: string, attachType: number): number {
  return native.linkCreateCgroup(progFd, cgroupPath, attachType);
}
/** bpf_link_create on a netns file (/proc/<pid>/ns/net, /var/run/netns/<name>), e.g. BPF_SK_LOOKUP. */
export function linkCreateNetns(progFd: number, netnsPath: string, attachType: number): number {
  return native.linkCreateNetns(progFd, netnsPath, attachType);
}
/** Swap the link's program in place (BPF_F_REPLACE with oldProgFd: only if it still runs that one). */
export function linkUpdate(linkFd: number, newProgFd: number, oldProgFd?: number): void {
  if (oldProgFd === undefined) native.linkUpdate(linkFd, newProgFd);
  else native.linkUpdate(linkFd, newProgFd, oldProgFd);
}
export function linkDetach(linkFd: number): void {
  native.linkDetach(linkFd);
}
/** bpf_prog_attach to a map (e.g. an sk_msg verdict on a sockhash); replaces the one attached. */
export function progAttach(progFd: number, targetFd: number, attachType: number): void {
  native.progAttach(progFd, targetFd, attachType);
}
export function progDetach(progFd: number, targetFd: number, attachType: number): void {
  native.progDetach(progFd, targetFd, attachType);
}
export function linkInfo(fd: number): LinkInfo {
  return native.linkInfo(fd);
}
/**
 * For each pair: true when the link pinned at pins[i] is a netns link living
 * in the netns netnsPaths[i] names now (inode and nsfs device match); false
 * for anything else (no pin, not a link, netns gone, path replaced). One call
 * for a pass over every pod.
 */
export function linksProveNetns(pins: string[], netnsPaths: string[]): boolean[] {
  return native.linksProveNetns(pins, netnsPaths);
}
/** linksProveNetns on a libuv worker thread: the JS thread does other work meanwhile. */
export function linksProveNetnsAsync(pins: string[], netnsPaths: string[]): Promise<boolean[]> {
  return native.linksProveNetnsAsync(pins, netnsPaths);
}
export function progInfo(fd: number): ProgInfo {
  return native.progInfo(fd);
}
export interface ProgTemplateOptions {
  /** Non-internal maps are reused from (or created and pinned at) mapPinDir/<name>, as openObject's. */
  mapPinDir: string;
  program: string;
  /** Passed to each BPF_PROG_LOAD (libbpf 1.1 has no getter for the object's). */
  license: string;
}

/**
 * One program of an object loaded once through libbpf (native/addon/src/prog_template.cc),
 * then loaded again per instance from its final instructions, its one reference to
 * the object's .bss pointed at a fresh 1-entry array of its own.
 */
export interface ProgTemplate {
  readonly insnCount: number;
  /** The template's own program (libbpf's load, reading the template's .bss); owned by the template. */
  readonly progFd: number;
  /** One BPF_MAP_CREATE + one BPF_PROG_LOAD (synchronous, ~0.3 ms of CPU for the inbound stub): the instance and its own .bss (zeroed), fds the caller closes. NativeError with the verifier log. */
  instantiate(): { progFd: number; mapFd: number };
  /**
   * The same on a libuv worker thread (the verifier and the JIT off the event loop). The template's
   * object stays open until every load in flight is done, even across close(); the fds are the caller's.
   */
  instantiateAsync(): Promise<{ progFd: number; mapFd: number }>;
  /** Closes the template's object and its map fds (instances keep their own references). Idempotent. */
  close(): void;
}

/** Loads the template synchronously (a libbpf open + load); throws when the program has not exactly one ld_imm64 of its object's .bss. */
export function loadProgTemplate(path: string, opts: ProgTemplateOptions): ProgTemplate {
  return new native.ProgTemplate(path, opts);
}
/** Key 0 of a 1-entry array of 8-byte values := value (a template instance's own .bss; one info + one update syscall, no /proc read). */
export function instanceSetU64(mapFd: number, value: bigint): void {
  native.instanceSetU64(mapFd, value);
}
/** Ids of the maps a program uses (bpf_prog_info.map_ids). */
export function progMapIds(fd: number): number[] {
  return native.progMapIds(fd);
}
/** A new fd of the program with this id (bpf_prog_get_fd_by_id); the caller closes it. */
export function progGetFdById(id: number): number {
  return native.progGetFdById(id);
}
/** An sk_lookup test run's TCP lookup: addresses network order (4 or 16 bytes by family), ports host order. */
export interface SkLookupTestCtx {
  family: 2 | 10;
  remoteIp: Buffer;
  remotePort: number;
  localIp: Buffer;
  localPort: number;
}
/** One BPF_PROG_TEST_RUN of an sk_lookup program (5.14+), in this thread's process context with bottom halves enabled; cookie: the selected socket's, 0n for none. */
export function progTestRunSkLookup(fd: number, ctx: SkLookupTestCtx): { retval: number; cookie: bigint } {
  return native.progTestRunSkLookup(fd, ctx);
}
/** BPF_PROG_QUERY: the programs attached to this cgroup for one hook, in the order they run. */
export function cgroupPrograms(cgroupPath: string, attachType: number): { id: number; name: string }[] {
  return native.cgroupPrograms(cgroupPath, attachType);
}
export function mapInfo(fd: number): KernelMapInfo {
  return native.mapInfo(fd);
}
export function objPin(fd: number, path: string): void {
  native.objPin(fd, path);
}
export function objGet(path: string): number {
  return native.objGet(path);
}
export function closeFd(fd: number): void {
  native.closeFd(fd);
}
/** flags: consts.BPF_ANY (default), BPF_NOEXIST, BPF_EXIST. */
export function mapUpdate(fd: number, key: Buffer, value: Buffer, flags?: number): void {
  if (flags === undefined) native.mapUpdate(fd, key, value);
  else native.mapUpdate(fd, key, value, flags);
}
/** The value, or null when the key is absent. valueSize must equal the map's (per-CPU: all CPUs' slots). */
export function mapLookup(fd: number, key: Buffer, valueSize: number): Buffer | null {
  return native.mapLookup(fd, key, valueSize);
}
/** false when the key was absent. */
export function mapDelete(fd: number, key: Buffer): boolean {
  return native.mapDelete(fd, key);
}
export function mapKeys(fd: number, keySize: number): Buffer[] {
  return native.mapKeys(fd, keySize);
}
/** Every key, end to end in one Buffer (key i at [i*keySize, (i+1)*keySize)): mapKeys without a Buffer per key. */
export function mapKeysPacked(fd: number, keySize: number): Buffer {
  return native.mapKeysPacked(fd, keySize);
}
/**
 * Every entry of a map, packed: entry i's key is keys[i*keySize, (i+1)*keySize),
 * its value likewise in values. BPF_MAP_LOOKUP_BATCH where the kernel and map
 * type have it (`batched`), else a key walk with one lookup per key; noBatch
 * forces the walk (tests).
 */
export function mapEntries(fd: number, opts?: MapEntriesOptions): MapEntries {
  return opts === undefined ? native.mapEntries(fd) : native.mapEntries(fd, opts);
}
export function mapUpdateBatch(fd: number, keys: Buffer[], values: Buffer[]): void {
  native.mapUpdateBatch(fd, keys, values);
}
/** Deletes every present key; returns how many were present. */
export function mapDeleteBatch(fd: number, keys: Buffer[]): number {
  return native.mapDeleteBatch(fd, keys);
}
/**
 * Writes the entries in order, one update each (any map type), after one size
 * check for all; stops at the first the kernel refuses and returns how many
 * were written before it (keys.length: all). mapUpdate of that entry names the error.
 */
export function mapUpdateEach(fd: number, keys: Buffer[], values: Buffer[], flags?: number): number {
  return flags === undefined ? native.mapUpdateEach(fd, keys, values) : native.mapUpdateEach(fd, keys, values, flags);
}
export function probeProgType(progType: number): boolean {
  return native.probeProgType(progType);
}
export function probeMapType(mapType: number): boolean {
  return native.probeMapType(mapType);
}
export function probeHelper(progType: number, helperId: number): boolean {
  return native.probeHelper(progType, helperId);
}
/** Trial load of `r0 = 1; exit` with that type + bpf_link_create on targetPath; both closed again. */
export function probeAttach(progType: number, expectedAttachType: number, targetPath: string): ProbeAttachResult {
  return native.probeAttach(progType, expectedAttachType, targetPath);
}
/** SO_NETNS_COOKIE of the netns at netnsPath, read on a short-lived thread that setns()es into it. */
export function netnsCookie(netnsPath: string): Promise<bigint> {
  return native.netnsCookie(netnsPath);
}

/** A /proc/sys/net/ file as the netns at netnsPath has it, read on a short-lived thread that setns()es into it. */
export function netnsReadSysctl(netnsPath: string, file: string): Promise<string> {
  return native.netnsReadSysctl(netnsPath, file);
}
/**
 * The route of redirected connections' replies to the pod's IPv4 addresses,
 * on lo, for TCP from 127.0.0.0/8 (native/addon/src/netns_routes.cc; an
 * address the netns does not have is left alone), added or removed over rtnetlink through a socket made in the netns (the calling
 * thread steps into it for the socket() alone): synchronous, ~0.1 ms.
 */
export function netnsReplyRoutes(netnsPath: string, op: 'add' | 'remove', addrs: string[], table: number, protocol: number): void {
  native.netnsReplyRoutes(netnsPath, op, addrs, table, protocol);
}
export function getOriginalDst(fd: number, level: 'ipv4' | 'ipv6'): OriginalDst {
  return native.getOriginalDst(fd, level);
}

/** IP_TRANSPARENT / IPV6_TRANSPARENT on a listener (TPROXY delivers only to transparent sockets). */
export function setTransparent(fd: number, level: 'ipv4' | 'ipv6'): void {
  native.setTransparent(fd, level);
}
/** A duplicate (O_CLOEXEC) of fd `fd` of process `pid` (pidfd_open + pidfd_getfd, Linux 5.6; needs ptrace rights over pid). */
export function takeFd(pid: number, fd: number): number {
  return native.takeFd(pid, fd);
}
/** glibc's malloc_trim(0): free pages inside the malloc heap back to the kernel; true when some were. */
export function mallocTrim(): boolean {
  return native.mallocTrim();
}
/** What the CNI listener's thread tells JavaScript about a connection (native/addon/src/cni_listener.cc). */
export const CniEventKind = {
  /** The whole request (text), the client half-closed. */
  request: 0,
  /** The peer is not allowUid (pid/uid/gid say who), or text says why its uid is unknown. */
  refused: 1,
  /** The request passed maxRequestBytes; the rest of its input is dropped. */
  tooBig: 2,
  /** The request was not complete within readTimeoutMs. */
  timeout: 3,
  /** The listening socket failed (text, e.g. accept4: EMFILE); id 0, nothing to answer. */
  error: 4,
} as const;
export type CniEventKind = (typeof CniEventKind)[keyof typeof CniEventKind];
export interface CniListenerOptions {
  maxRequestBytes: number;
  /** From accept to the request's end; also how long a client is given to close after its answer. */
  readTimeoutMs: number;
  /** The only uid that may connect (SO_PEERCRED); -1 for any. */
  allowUid: number;
  backlog: number;
}
/** ageMs: since the connection was accepted. uid/gid -1 when unknown. */
export type CniEventHandler = (id: number, kind: CniEventKind, text: string, pid: number, uid: number, gid: number, ageMs: number) => void;
/**
 * The CNI socket served by a native thread: it binds (0600) and listens at
 * construction, reads each request to the client's half-close, and calls
 * onEvent once per connection (except kind error); every such event expects
 * one reply(id, text).
 */
export interface CniListener {
  /** Queues the answer; false when that connection is gone or the listener closed. */
  reply(id: number, text: string): boolean;
  /** Stops accepting and cuts open connections without an answer; the socket file stays. */
  close(): void;
  /** Connections open now. */
  readonly open: number;
}
export function cniListen(path: string, opts: CniListenerOptions, onEvent: CniEventHandler): CniListener {
  return new native.CniListener(path, opts, onEvent);
}
export function libbpfVersion(): string {
  return native.libbpfVersion();
}
/** libbpf messages printed outside a load/open (e.g. by probes) since the last call; drains the buffer. */
export function takeLibbpfLog(): string {
  return native.takeLibbpfLog();
}
