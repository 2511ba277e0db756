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
import { pinnedMapId, setInstanceNetns, StubTemplate } from '../pod-datapath/inbound-pool.js';
import { INBOUND_SHARED_OBJECT, INBOUND_SHARED_PROGRAM, INBOUND_STUB_PROGRAM, INBOUND_TAIL_MAP, objectPath, pinLayout } from './manifest.js';
import type { MapSizeState } from './map-sizes.js';
import { setMapSizes } from './pinned-map-sizes.js';

export interface InboundSharedState {
  pin: string;
  progId: number;
  progTag: string;
  /** created: the slot was empty; replaced: another program was in it; adopted: this build already was. */
  action: 'created' | 'adopted' | 'replaced';
  /** Pods whose stub was moved onto a new prog array (the old one's pin was gone: see relinkStubs). */
  relinked: number;
}

const KEY0 = Buffer.alloc(4);
/** The per-CPU hand-off map every stub writes (bpf/inbound-tail.h). */
const INBOUND_ARG_MAP = 'mc_inbound_arg';

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
  const L = pinLayout(pinRoot);
  // No pinned prog array: this load makes one (first load, upgrade, or its pin was removed).
  const freshTail = !existsSync(path.join(L.maps, INBOUND_TAIL_MAP));
  const obj = bpf.openObject(objectPath(INBOUND_SHARED_OBJECT, objectDir), { mapPinDir: L.maps });
  try {
    setMapSizes(obj, sizes.map((s) => [s.name, s.maxEntries] as const));
    await obj.load();
    const prog = obj.programs().find((p) => p.name === INBOUND_SHARED_PROGRAM);
    const tail = obj.maps().find((m) => m.name === INBOUND_TAIL_MAP);
    if (!prog || !tail) throw new Error(`${INBOUND_SHARED_OBJECT} has no program ${INBOUND_SHARED_PROGRAM} or map ${INBOUND_TAIL_MAP}: the build is out of date (npm run setup)`);
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
    const relinked = freshTail ? await relinkStubs(pinRoot) : 0;
    return { pin, progId: info.id, progTag: info.tag, action: inSlot === null ? 'created' : 'replaced', relinked };
  } finally {
    obj.close();
  }
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
async function relinkStubs(pinRoot: string): Promise<number> {
  const L = pinLayout(pinRoot);
  const cookies = existsSync(L.pods) ? readdirSync(L.pods).filter((d) => /^\d+$/.test(d) && existsSync(L.podInbound(BigInt(d)))) : [];
  if (cookies.length === 0) return 0;
  // every stub uses the node's mc_inbound_arg, pinned by the shared object's load
  const argId = pinnedMapId(L.maps, INBOUND_ARG_MAP);
  if (argId === null) return 0;
  const template = new StubTemplate(L.maps);
  let relinked = 0;
  try {
    for (const c of cookies) {
      const fd = bpf.objGet(L.podInbound(BigInt(c)));
      try {
        if (!isStub(bpf.linkInfo(fd).progId, argId)) continue;
        const stub = template.instance();
        try {
          setInstanceNetns(stub, BigInt(c));
          bpf.linkUpdate(fd, stub.progFd);
        } catch {
          continue; // a link whose netns is gone (ENOLINK) has nothing to capture
        } finally {
          stub.close(); // the link holds the program now
        }
        relinked++;
      } finally {
        bpf.closeFd(fd);
      }
    }
  } finally {
    template.close();
  }
  return relinked;
}

/** True when program progId is a pod stub: named so, and using the node's mc_inbound_arg. */
function isStub(progId: number, argId: number): boolean {
  let fd: number;
  try {
    fd = bpf.progGetFdById(progId);
  } catch {
    return false; // gone meanwhile
  }
  try {
    return bpf.progInfo(fd).name === INBOUND_STUB_PROGRAM && bpf.progMapIds(fd).includes(argId);
  } finally {
    bpf.closeFd(fd);
  }
}
