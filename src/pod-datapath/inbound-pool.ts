// Pod inbound programs loaded ahead of the pods that will use them. A pod's
// program is a stub (bpf/inbound-stub.bpf.c: names its pod, tail-calls the
// node's shared mc_inbound_main, see src/loader/inbound-shared.ts): ~0.4 ms of
// CPU to load (libbpf open, BTF, a .bss map, two pinned maps reused; the
// verifier's part is near nothing), against ~1.6 ms for a whole
// bpf/inbound.bpf.c, which a pod gets only where the kernel refused the shared
// program. Either way the load is the largest part of a meshed CNI ADD;
// everything else an ADD does to capture inbound (write the cookie, link, pin)
// is ~0.05 ms. So the agent keeps a few loaded instances whose netns cookie is
// not written yet and loads the next ones in the background, one at a time,
// after an ADD took one. An ADD that finds the pool empty loads its own.
//
// An instance in the pool is attached nowhere and pinned nowhere: it lives on
// the agent's fds only, so closing the pool (agent stop) or the agent dying
// frees it. Each one was loaded against the maps pinned at that moment; the
// pool belongs to one EbpfBackend (one set of pinned maps) and is closed with
// it when a self-check reloads the datapath.
import * as bpf from '../native/addon.js';
import path from 'node:path';
import { existsSync } from 'node:fs';
import { INBOUND_SHARED_PROGRAM, INBOUND_STUB_OBJECT, INBOUND_STUB_PROGRAM, INBOUND_TAIL_MAP, POD_INBOUND_OBJECT, POD_INBOUND_PROGRAM, objectPath, pinLayout } from '../loader/manifest.js';
import type { SizedMap } from '../loader/map-sizes.js';
import { adoptPinnedSizes, pinnedSizes } from '../loader/pinned-map-sizes.js';
import { MAP } from '../maps/layout.js';

/** The variable in the .bss of inbound-stub.bpf.c (and inbound.bpf.c) that holds the pod's netns cookie. */
const NETNS_VAR = 'mc_netns';

/** A loaded, unattached inbound program and the map holding its netns cookie. */
export interface InboundInstance {
  /** stub: tail-calls the shared program; whole: bpf/inbound.bpf.c (the kernel refused the shared one). */
  kind: 'stub' | 'whole';
  obj: bpf.BpfObject;
  progFd: number;
  /** The object's .bss (one array element: mc_netns). */
  netnsMapFd: number;
  /** Kernel id of the map this instance depends on: mc_inbound_tail (stub) or mc_pods (whole). */
  mapId: number;
}

/** True when pods get stubs: the shared program is pinned (src/loader/inbound-shared.ts put it in its slot first); else each pod gets a whole mc_inbound. */
export function inboundSharedReady(pinRoot: string): boolean {
  return existsSync(pinLayout(pinRoot).prog(INBOUND_SHARED_PROGRAM));
}

/**
 * Loads one instance against the maps pinned in mapsDir (not attached, cookie
 * 0): a stub when the shared program is in place (pinned beside mapsDir), else
 * a whole program. `sizes`: the pins' LRU sizes read once by the caller (a
 * whole program carries those maps; a stub none); without, read from the pins.
 */
export async function loadInboundInstance(mapsDir: string, sizes?: ReadonlyMap<SizedMap, number>): Promise<InboundInstance> {
  const kind = inboundSharedReady(path.dirname(mapsDir)) ? 'stub' : 'whole';
  const file = kind === 'stub' ? INBOUND_STUB_OBJECT : POD_INBOUND_OBJECT;
  const progName = kind === 'stub' ? INBOUND_STUB_PROGRAM : POD_INBOUND_PROGRAM;
  const mapName = kind === 'stub' ? INBOUND_TAIL_MAP : MAP.pods;
  const obj = bpf.openObject(objectPath(file), { mapPinDir: mapsDir });
  try {
    // A whole program carries every map; the LRU maps' sizes are the node's (chosen at load).
    if (kind === 'whole') adoptPinnedSizes(obj, sizes ?? mapsDir);
    await obj.load();
    const prog = obj.programs().find((p) => p.name === progName);
    if (!prog) throw new Error(`${file} has no program ${progName}: rebuild (npm run setup)`);
    const maps = obj.maps();
    // libbpf names it "<object prefix>.bss"; mc_netns is its only variable.
    const bss = maps.find((m) => m.name.endsWith('.bss'));
    if (!bss || bss.valueSize !== 8) {
      throw new Error(`${file} has no 8-byte .bss holding ${NETNS_VAR} (an object from an older build?): rebuild (npm run setup)`);
    }
    const dep = maps.find((m) => m.name === mapName);
    if (!dep) throw new Error(`${file} does not use ${mapName}: rebuild (npm run setup)`);
    return { kind, obj, progFd: prog.fd, netnsMapFd: bss.fd, mapId: bpf.mapInfo(dep.fd).id };
  } catch (e) {
    obj.close();
    throw e;
  }
}

/** Kernel id of the map pinned at mapsDir/name; null when none. */
function pinnedMapId(mapsDir: string, name: string): number | null {
  let fd: number;
  try {
    fd = bpf.objGet(path.join(mapsDir, name));
  } catch {
    return null;
  }
  try {
    return bpf.mapInfo(fd).id;
  } finally {
    bpf.closeFd(fd);
  }
}

const KEY0 = Buffer.alloc(4);

/**
 * Gives the instance its pod: written before the instance is linked into the
 * pod's netns, so it never runs with another cookie (and never with 0 there).
 */
export function setInstanceNetns(inst: InboundInstance, netns: bigint): void {
  const v = Buffer.alloc(8);
  v.writeBigUInt64LE(netns);
  bpf.mapUpdate(inst.netnsMapFd, KEY0, v);
}

export interface InboundPoolOptions {
  /** Where the maps the instances read are pinned. */
  mapsDir: string;
  /** Instances kept loaded (0: none; every ADD loads its own). */
  size: number;
  /** Kernel id of the mc_pods map the owner writes: an instance reading another one is never handed out. */
  podsMapId: number;
  /** A background load failed (the next take() tries again; ADDs load their own meanwhile). */
  onError?: (err: Error) => void;
}

export class InboundPool {
  private ready: InboundInstance[] = [];
  private filling: Promise<void> | null = null;
  private closed = false;
  private refillQueued = false;
  /** The pins' LRU sizes, read at the first load (three pin opens less per instance). */
  private sizes: Map<SizedMap, number> | undefined;
  /** Counters for metrics and tests. */
  readonly counts = { hits: 0, misses: 0, loaded: 0, failed: 0, discarded: 0 };

  constructor(private readonly o: InboundPoolOptions) {}

  get size(): number {
    return this.o.size;
  }

  /** Instances loaded and waiting. */
  get available(): number {
    return this.ready.length;
  }

  /** A loaded instance, or undefined when none is ready (the caller loads one). Refills after this turn. */
  take(): InboundInstance | undefined {
    const inst = this.ready.pop();
    if (inst) this.counts.hits++;
    else if (this.o.size > 0) this.counts.misses++;
    // Not now: opening the object (ELF, ~0.1 ms, on this thread) would delay
    // the ADD that is taking it; the ADD's reply goes out before this runs.
    if (!this.refillQueued) {
      this.refillQueued = true;
      setImmediate(() => {
        this.refillQueued = false;
        this.fill();
      });
    }
    return inst;
  }

  /** Loads instances in the background, one at a time, up to size. Idempotent. */
  fill(): void {
    if (this.closed || this.filling || this.ready.length >= this.o.size) return;
    this.filling = this.run().finally(() => {
      this.filling = null;
    });
  }

  /** Resolves when the pool is full (or a load failed, or it was closed): tests and benches. */
  async filled(): Promise<void> {
    this.fill();
    await this.filling;
  }

  private async run(): Promise<void> {
    while (!this.closed && this.ready.length < this.o.size) {
      let inst: InboundInstance;
      try {
        this.sizes ??= pinnedSizes(this.o.mapsDir);
        inst = await loadInboundInstance(this.o.mapsDir, this.sizes);
      } catch (e) {
        // Stop until the next take(): a kernel that refuses the object
        // refuses it every time, and the ADD that loads its own reports why.
        // The sizes are read again then (a reload may have re-pinned the maps).
        this.sizes = undefined;
        this.counts.failed++;
        this.o.onError?.(e as Error);
        return;
      }
      // A whole program must read the owner's mc_pods; a stub must use the
      // prog array pinned now (one whose pin is gone was emptied by the kernel).
      const current = inst.kind === 'whole' ? this.o.podsMapId : pinnedMapId(this.o.mapsDir, INBOUND_TAIL_MAP);
      if (this.closed || inst.mapId !== current) {
        // Closed meanwhile, or the maps were replaced under the pins: the
        // owner is about to be replaced too.
        if (!this.closed) this.counts.discarded++;
        inst.obj.close();
        return;
      }
      this.counts.loaded++;
      this.ready.push(inst);
    }
  }

  /** Kernel ids of the waiting programs (tests: they must be gone after close). */
  programIds(): number[] {
    return this.ready.map((i) => bpf.progInfo(i.progFd).id);
  }

  /** Frees every waiting instance (nothing of them is attached or pinned). Idempotent. */
  close(): void {
    this.closed = true;
    for (const inst of this.ready.splice(0)) inst.obj.close();
  }
}
