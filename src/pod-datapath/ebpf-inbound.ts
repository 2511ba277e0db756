// Per-pod inbound capture: one sk_lookup program per meshed pod (it carries
// the pod's netns cookie itself: sk_lookup cannot ask for it), attached
// to the pod's netns through a pinned bpf_link at
// <pin root>/pods/<cookie>/inbound. Since issue 19 it is a stub that
// tail-calls the node's shared program (src/loader/inbound-shared.ts), its
// cookie in a 1-entry array of its own: the agent's pool keeps a few loaded
// ahead and an ADD writes the cookie into one, then links it (inbound-pool.ts).
import { existsSync, mkdirSync, rmdirSync, rmSync, statSync } from 'node:fs';
import * as bpf from '../native/addon.js';
import { ForeignPinError } from '../loader/datapath.js';
import { bpfFdKind, readFdinfo } from '../loader/fdinfo.js';
import { pinLayout } from '../loader/manifest.js';
import { loadInboundInstance, setInstanceNetns, type InboundPool } from './inbound-pool.js';

export interface InboundLink {
  pin: string;
  /** The adopted link's id; null for a link made now (not asked: one syscall less per ADD). */
  linkId: number | null;
  action: 'created' | 'adopted';
}

/**
 * Attach (or adopt) the pod's inbound program. Idempotent for the same netns.
 * A link pinned by an older meshcap (a whole mc_inbound per pod, cookie in
 * .bss or as a .rodata constant, or a stub with its cookie an immediate) is
 * adopted the same way: it decides as the shared program does, from the same
 * pinned maps.
 */
export async function attachPodInbound(pinRoot: string, netns: bigint, netnsPath: string, pool?: InboundPool): Promise<InboundLink> {
  const L = pinLayout(pinRoot);
  const pin = L.podInbound(netns);
  // A new pod directory holds no pin: only an existing one is looked into.
  if (!makePodDir(L.podDir(netns)) && existsSync(pin)) {
    const netnsIno = statSync(netnsPath).ino;
    const fd = bpf.objGet(pin);
    try {
      if (bpfFdKind(readFdinfo(fd)) !== 'link') throw new ForeignPinError(pin, 'expected a pinned sk_lookup link');
      const li = bpf.linkInfo(fd);
      if (li.netnsIno === netnsIno) return { pin, linkId: li.id, action: 'adopted' };
    } finally {
      bpf.closeFd(fd);
    }
    // A link for a netns that is gone (cookies are never reused, but be safe).
    rmSync(pin);
  }
  const inst = pool?.take() ?? (await loadInboundInstance(L.maps));
  try {
    setInstanceNetns(inst, netns);
    const fd = bpf.linkCreateNetns(inst.progFd, netnsPath, bpf.consts.attachType.SK_LOOKUP!);
    try {
      bpf.objPin(fd, pin);
      return { pin, linkId: null, action: 'created' };
    } finally {
      bpf.closeFd(fd);
    }
  } finally {
    // The link (when made) holds the program and its cookie array. The
    // agent's own fds go after the ADD has answered (off the runtime's wait).
    setImmediate(() => inst.close());
  }
}

/**
 * The pod's pin directory; true when made now. One mkdir (recursive: a JS
 * walk with a stat per level) unless <pin root>/pods is missing.
 */
function makePodDir(dir: string): boolean {
  try {
    mkdirSync(dir);
    return true;
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'EEXIST') return false;
    if (code !== 'ENOENT') throw e;
    mkdirSync(dir, { recursive: true });
    return true;
  }
}

/** Detach and unpin the pod's inbound program; fine when already gone. */
export function detachPodInbound(pinRoot: string, netns: bigint): boolean {
  const L = pinLayout(pinRoot);
  const pin = L.podInbound(netns);
  let removed = false;
  if (existsSync(pin)) {
    const fd = bpf.objGet(pin);
    try {
      if (bpfFdKind(readFdinfo(fd)) === 'link') bpf.linkDetach(fd);
    } catch {
      // A netns that died already detached its links ("defunct"): unpin only.
    } finally {
      bpf.closeFd(fd);
    }
    rmSync(pin);
    removed = true;
  }
  removePodDir(L.podDir(netns));
  return removed;
}

/**
 * The pod's pin directory holds only its inbound link, so one rmdir does:
 * rmSync({recursive, force}) walked it in JS with an lstat first, ~50 us on
 * every outbound-only ADD and every DEL (issue 19). Anything else found in it
 * (a hand-made pin) is still swept.
 */
function removePodDir(dir: string): void {
  try {
    rmdirSync(dir);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return;
    if (code === 'ENOTEMPTY' || code === 'EEXIST') rmSync(dir, { recursive: true, force: true });
    else throw e;
  }
}

let nsfs: number | undefined;
/** The device of nsfs (namespace files): an inode number means a netns only there. */
const nsfsDev = () => (nsfs ??= statSync('/proc/self/ns/net').dev);

/**
 * True when the pod's pinned link proves that `netnsPath` names the netns of
 * `cookie` now: the link was made into that cookie's netns at ADD, and a live
 * link reports its netns's inode (0 once the netns is gone), so a match means
 * the path's netns is the link's. A few syscalls, where the cookie of the path
 * needs a setns on a helper thread. False says nothing (no link, gone,
 * replaced): the caller looks the cookie up.
 */
export function linkProvesNetns(pinRoot: string, netns: bigint, netnsPath: string): boolean {
  let fd: number;
  try {
    fd = bpf.objGet(pinLayout(pinRoot).podInbound(netns));
  } catch {
    return false;
  }
  try {
    const ino = bpf.linkInfo(fd).netnsIno;
    if (ino === null || ino === 0) return false;
    const st = statSync(netnsPath);
    return st.ino === ino && st.dev === nsfsDev();
  } catch {
    return false; // not a link, or no such path
  } finally {
    bpf.closeFd(fd);
  }
}

function proofArgs(pinRoot: string, pods: { netns: bigint; netnsPath: string }[]): [string[], string[]] {
  const L = pinLayout(pinRoot);
  return [pods.map((p) => L.podInbound(p.netns)), pods.map((p) => p.netnsPath)];
}

/** linkProvesNetns for many pods in one native call (a pass over every pod). */
export function linksProveNetns(pinRoot: string, pods: { netns: bigint; netnsPath: string }[]): boolean[] {
  return bpf.linksProveNetns(...proofArgs(pinRoot, pods));
}

/** linksProveNetns on a worker thread: the caller's JS runs meanwhile. */
export function linksProveNetnsAsync(pinRoot: string, pods: { netns: bigint; netnsPath: string }[]): Promise<boolean[]> {
  return bpf.linksProveNetnsAsync(...proofArgs(pinRoot, pods));
}

export function hasPodInbound(pinRoot: string, netns: bigint): boolean {
  return existsSync(pinLayout(pinRoot).podInbound(netns));
}
