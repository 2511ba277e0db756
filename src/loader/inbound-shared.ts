// The node's one inbound program (bpf/inbound-shared.bpf.c): verified once per
// datapath load, put in slot 0 of the pinned prog array mc_inbound_tail that
// every pod's stub (bpf/inbound-stub.bpf.c) tail-calls, and pinned at
// <pin root>/progs/mc_inbound_main so a later load can tell whether the slot
// already holds this build. A newer build replaces the slot's program with one
// map update (the kernel swaps the pointer): a SYN sees the old program or the
// new one, never an empty slot.
import { existsSync, mkdirSync, readdirSync, unlinkSync } from 'node:fs';
import path from 'node:path';
import * as bpf from '../native/addon.js';
import { loadWhole, setInstanceNetns, StubTemplate, type InboundInstance } from '../pod-datapath/inbound-pool.js';
import { INBOUND_SHARED_OBJECT, INBOUND_SHARED_PROGRAM, INBOUND_STUB_PROGRAM, INBOUND_TAIL_MAP, objectPath, pinLayout } from './manifest.js';
import type { MapSizeState } from './map-sizes.js';
import { pinnedSizes, setMapSizes } from './pinned-map-sizes.js';

export interface InboundSharedState {
  pin: string;
  progId: number;
  progTag: string;
  /** created: the slot was empty; replaced: another program was in it; adopted: this build already was. */
  action: 'created' | 'adopted' | 'replaced';
  /** Pods whose stub was moved onto a new prog array (the old one's pin was gone: see relinkStubs). */
  relinked: number;
}

/**
 * This load's shared program was refused (the kernel's verifier, a missing
 * object, ...); pods get whole programs. `retired`: stubs an earlier load
 * linked, moved onto whole programs (the program in the slot is an earlier
 * build's, whose hand-off may not be exact: retireShared).
 */
export class InboundSharedRefused extends Error {
  constructor(message: string, readonly retired: number) {
    super(message);
    this.name = 'InboundSharedRefused';
  }
}

const KEY0 = Buffer.alloc(4);
/** The per-CPU hand-off map every stub writes (bpf/inbound-tail.h). */
const INBOUND_ARG_MAP = 'mc_inbound_arg';
/** Its value: MC_INBOUND_HANDS (4) hands of { owner, netns }, then tail_failed (bpf/inbound-tail.h). */
export const INBOUND_ARG_SIZE = 4 * 16 + 8;

/**
 * A pinned hand-off of another layout (16 bytes: { netns, tail_failed }, one
 * unguarded cookie per CPU, before 2026-11-25) cannot be reused (libbpf
 * refuses the size), and its stubs must not tail-call a program of this
 * layout: its pins go with the prog array's and the shared program's, so this
 * load makes a new array and arg and moves every stub onto them in place
 * (relinkToTemplate). The old stubs meanwhile tail-call an emptied array and
 * refuse captured connections: never around the proxy.
 */
function retireOldLayout(mapsDir: string, sharedPin: string): void {
  const argPin = path.join(mapsDir, INBOUND_ARG_MAP);
  if (!existsSync(argPin)) return;
  const fd = bpf.objGet(argPin);
  let size: number;
  try {
    size = bpf.mapInfo(fd).valueSize;
  } finally {
    bpf.closeFd(fd);
  }
  if (size === INBOUND_ARG_SIZE) return;
  for (const p of [argPin, path.join(mapsDir, INBOUND_TAIL_MAP), sharedPin]) if (existsSync(p)) unlinkSync(p);
}

function u32(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(n);
  return b;
}

/** The id of the program in slot 0 of the prog array (a lookup from user space answers the id); null when empty. */
export function tailSlotProgId(tailFd: number): number | null {
  const v = bpf.mapLookup(tailFd, KEY0, 4);
  return v ? v.readUInt32LE(0) : null;
}

/** Id and tag of the pinned shared program; null when none is pinned. */
function pinnedShared(pin: string): { id: number; tag: string } | null {
  if (!existsSync(pin)) return null;
  const fd = bpf.objGet(pin);
  try {
    const i = bpf.progInfo(fd);
    return { id: i.id, tag: i.tag };
  } finally {
    bpf.closeFd(fd);
  }
}

/**
 * Loads bpf/inbound-shared.bpf.o against the maps pinned under pinRoot (sizes:
 * the LRU maps' sizes this load settled on), fills slot 0 of mc_inbound_tail
 * unless it holds this build already, and pins the program.
 */
export async function loadInboundShared(pinRoot: string, sizes: MapSizeState[], objectDir?: string): Promise<InboundSharedState> {
  try {
    return await loadChecked(pinRoot, sizes, objectDir);
  } catch (e) {
    // Whatever is in slot 0 now (an earlier build's program, whose hand-off
    // may not be exact on this kernel) must not decide for new pods, nor for
    // the pods whose stubs tail-call it.
    const retired = await retireShared(pinRoot);
    throw new InboundSharedRefused(`${(e as Error).message}${retired ? `; ${retired} pods' stubs moved onto whole programs` : ''}`, retired);
  }
}

async function loadChecked(pinRoot: string, sizes: MapSizeState[], objectDir?: string): Promise<InboundSharedState> {
  const L = pinLayout(pinRoot);
  retireOldLayout(L.maps, L.prog(INBOUND_SHARED_PROGRAM));
  // No pinned prog array: this load makes one (first load, upgrade, its pin
  // was removed, or the hand-off's layout changed).
  const freshTail = !existsSync(path.join(L.maps, INBOUND_TAIL_MAP));
  const obj = bpf.openObject(objectPath(INBOUND_SHARED_OBJECT, objectDir), { mapPinDir: L.maps });
  try {
    setMapSizes(obj, sizes.map((s) => [s.name, s.maxEntries] as const));
    await obj.load();
    const prog = obj.programs().find((p) => p.name === INBOUND_SHARED_PROGRAM);
    const tail = obj.maps().find((m) => m.name === INBOUND_TAIL_MAP);
    if (!prog || !tail) throw new Error(`${INBOUND_SHARED_OBJECT} has no program ${INBOUND_SHARED_PROGRAM} or map ${INBOUND_TAIL_MAP}: the build is out of date (npm run setup)`);
    // The stubs' side of the hand-off must load here too (BPF_CMPXCHG: 5.12;
    // a pointer stored in a map: CAP_PERFMON), or no pod could get one: then
    // whole programs, before anything is put in the slot.
    new StubTemplate(L.maps).close();
    const info = bpf.progInfo(prog.fd);
    const pin = L.prog(INBOUND_SHARED_PROGRAM);
    const inSlot = tailSlotProgId(tail.fd);
    const pinned = pinnedShared(pin);
    if (inSlot !== null && pinned && pinned.id === inSlot && pinned.tag === info.tag) {
      return { pin, progId: pinned.id, progTag: pinned.tag, action: 'adopted', relinked: 0 };
    }
    // The slot first: from here on every stub runs the new program. The pin
    // only records which one that is.
    bpf.mapUpdate(tail.fd, KEY0, u32(prog.fd));
    mkdirSync(L.progs, { recursive: true });
    if (existsSync(pin)) unlinkSync(pin);
    bpf.objPin(prog.fd, pin);
    const relinked = freshTail ? await relinkToTemplate(pinRoot) : 0;
    return { pin, progId: info.id, progTag: info.tag, action: inSlot === null ? 'created' : 'replaced', relinked };
  } finally {
    obj.close();
  }
}

/**
 * The shared program refused: no new pod gets a stub (its pin goes, so
 * inboundSharedReady() is false) and every pod whose stub an earlier load
 * linked gets a whole program in place (bpf_link_update). The slot keeps its
 * program for a stub whose move failed (its pod keeps what it had).
 */
async function retireShared(pinRoot: string): Promise<number> {
  const L = pinLayout(pinRoot);
  const pin = L.prog(INBOUND_SHARED_PROGRAM);
  if (existsSync(pin)) unlinkSync(pin);
  // every stub, pin or not: one whose array this load emptied (retireOldLayout) refuses until moved
  const cookies = podCookies(pinRoot);
  if (cookies.length === 0) return 0;
  let sizes: ReturnType<typeof pinnedSizes> | undefined;
  return relinkStubs(pinRoot, cookies, async () => loadWhole(L.maps, (sizes ??= pinnedSizes(L.maps))));
}

/**
 * Stubs linked before this load's new prog array tail-call the old one, which
 * the kernel emptied when its pin went (they refuse captured connections
 * then): give each such pod a new stub, in place (bpf_link_update: the link
 * never runs without a program). A stub is known by its name and by using the
 * pinned mc_inbound_arg (stubs of older builds, cookie an immediate or in a
 * libbpf-loaded .bss, match too; each gets a new one); whole programs
 * (older meshcap, or a kernel without the shared one) need no slot and stay.
 */
async function relinkToTemplate(pinRoot: string): Promise<number> {
  const cookies = podCookies(pinRoot);
  if (cookies.length === 0) return 0;
  const template = new StubTemplate(pinLayout(pinRoot).maps);
  try {
    return await relinkStubs(pinRoot, cookies, async () => template.instance());
  } finally {
    template.close();
  }
}

function podCookies(pinRoot: string): string[] {
  const L = pinLayout(pinRoot);
  return existsSync(L.pods) ? readdirSync(L.pods).filter((d) => /^\d+$/.test(d) && existsSync(L.podInbound(BigInt(d)))) : [];
}

/** Gives each of these pods linked to a stub the instance make() returns, its cookie written first, in place. */
async function relinkStubs(pinRoot: string, cookies: string[], make: () => Promise<InboundInstance>): Promise<number> {
  const L = pinLayout(pinRoot);
  let relinked = 0;
  for (const c of cookies) {
    const fd = bpf.objGet(L.podInbound(BigInt(c)));
    try {
      if (!isStub(bpf.linkInfo(fd).progId)) continue;
      let inst: InboundInstance;
      try {
        inst = await make();
      } catch {
        continue; // the pod keeps its stub (and the slot its program)
      }
      try {
        setInstanceNetns(inst, BigInt(c));
        bpf.linkUpdate(fd, inst.progFd);
      } catch {
        continue; // a link whose netns is gone (ENOLINK) has nothing to capture
      } finally {
        inst.close(); // the link holds the program now
      }
      relinked++;
    } finally {
      bpf.closeFd(fd);
    }
  }
  return relinked;
}

/** True when program progId is a pod stub (of any build: named so; links under pods/ are meshcap's). Whole programs are named mc_inbound. */
function isStub(progId: number): boolean {
  let fd: number;
  try {
    fd = bpf.progGetFdById(progId);
  } catch {
    return false; // gone meanwhile
  }
  try {
    return bpf.progInfo(fd).name === INBOUND_STUB_PROGRAM;
  } finally {
    bpf.closeFd(fd);
  }
}
