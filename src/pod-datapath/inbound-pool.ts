// A pod's inbound program, loaded as cheaply as the kernel allows. Where the
// node's shared program is in place (src/loader/inbound-shared.ts), a pod's
// program is a stub (bpf/inbound-stub.bpf.c: names its pod, tail-calls the
// shared mc_inbound_main) and is loaded raw: the stub object is loaded once
// per prog array through libbpf as a template (StubTemplate,
// native/addon/src/prog_template.cc), and each stub is the template's final
// instructions with its .bss replaced by a fresh 1-entry array of its own (one
// BPF_MAP_CREATE + one BPF_PROG_LOAD, ~0.3 ms of CPU, against ~0.5 ms for
// a libbpf load; docs/bench-cni.md). The pool keeps a few loaded ahead (the
// array still 0: such a stub captures nothing) and makes the next ones in the
// background on a libuv worker thread; an ADD writes its pod's cookie into one
// (one map update) before linking it.
//
// Where the kernel refused the shared program, a pod gets a whole
// bpf/inbound.bpf.c (~1.6 ms of CPU to load, the cookie in its .bss). Those
// the pool keeps loaded ahead the same way, one libbpf load at a time.
//
// Neither a template nor a waiting instance is attached or pinned anywhere:
// they live on the agent's fds only, so closing the pool (agent stop, or a
// self-check reloading the datapath: the pool belongs to one EbpfBackend, one
// set of pinned maps) or the agent dying frees them.
import * as bpf from '../native/addon.js';
import path from 'node:path';
import { existsSync, statSync } from 'node:fs';
import { INBOUND_SHARED_PROGRAM, INBOUND_STUB_OBJECT, INBOUND_STUB_PROGRAM, INBOUND_TAIL_MAP, POD_INBOUND_OBJECT, POD_INBOUND_PROGRAM, objectPath, pinLayout } from '../loader/manifest.js';
import type { SizedMap } from '../loader/map-sizes.js';
import { adoptPinnedSizes, pinnedSizes } from '../loader/pinned-map-sizes.js';
import { MAP } from '../maps/layout.js';

/** The variable in the .bss of inbound.bpf.c that holds the pod's netns cookie. */
const NETNS_VAR = 'mc_netns';
/** The stub's license (its LICENSE[]): a raw load passes it itself. */
const STUB_LICENSE = 'Dual BSD/GPL';

/** A loaded, unattached inbound program. */
export interface InboundInstance {
  /** stub: tail-calls the shared program; whole: bpf/inbound.bpf.c (the kernel refused the shared one). */
  kind: 'stub' | 'whole';
  progFd: number;
  /** The 1-entry array holding the pod's cookie (whole: the object's .bss, mc_netns; stub: its own mc_stub_netns), 0 until setInstanceNetns. */
  netnsMapFd: number;
  /** Kernel id of the map this instance depends on: mc_inbound_tail (stub) or mc_pods (whole). */
  mapId: number;
  /** Drops the agent's references (a link made from progFd keeps the program). */
  close(): void;
}

/**
 * The stub object loaded once against the maps pinned in mapsDir (the shared
 * mc_inbound_arg and mc_inbound_tail): its fds keep those maps referenced by
 * the instructions every stub is made from. Good for as long as that prog
 * array is the pinned one (current()); a load that replaces it needs a new
 * template.
 */
export class StubTemplate {
  private readonly t: bpf.ProgTemplate;
  /** Kernel id of the mc_inbound_tail the template's instructions use. */
  readonly tailId: number;
  /** Inode of that prog array's pin: a new pin (a new array) is a new inode (bpffs never reuses one while the agent runs). */
  private readonly tailIno: number;
  private readonly tailPin: string;

  constructor(readonly mapsDir: string) {
    this.tailPin = path.join(mapsDir, INBOUND_TAIL_MAP);
    const ino = statSync(this.tailPin, { throwIfNoEntry: false })?.ino;
    this.t = bpf.loadProgTemplate(objectPath(INBOUND_STUB_OBJECT), { mapPinDir: mapsDir, program: INBOUND_STUB_PROGRAM, license: STUB_LICENSE });
    try {
      const id = pinnedMapId(mapsDir, INBOUND_TAIL_MAP);
      if (id === null || ino === undefined) throw new Error(`${this.tailPin} is not pinned: load the datapath (meshcap load)`);
      this.tailId = id;
      this.tailIno = ino;
    } catch (e) {
      this.t.close();
      throw e;
    }
  }

  /** True while the prog array pinned now is the template's: one stat, no fd. */
  current(): boolean {
    return statSync(this.tailPin, { throwIfNoEntry: false })?.ino === this.tailIno;
  }

  /** Kernel id of the template's own program (loaded by libbpf, its .bss 0; never attached). */
  get progId(): number {
    return bpf.progInfo(this.t.progFd).id;
  }

  /** A stub with its own cookie array, still 0 (captures nothing until setInstanceNetns): one map create + one BPF_PROG_LOAD. */
  instance(): InboundInstance {
    return this.stub(this.t.instantiate());
  }

  /** instance() on a libuv worker thread: the pool's refills, so the verifier's ~0.3 ms is not on the event loop between ADDs. */
  async instanceAsync(): Promise<InboundInstance> {
    return this.stub(await this.t.instantiateAsync());
  }

  private stub({ progFd, mapFd }: { progFd: number; mapFd: number }): InboundInstance {
    return {
      kind: 'stub',
      progFd,
      netnsMapFd: mapFd,
      mapId: this.tailId,
      close: () => {
        bpf.closeFd(progFd);
        bpf.closeFd(mapFd);
      },
    };
  }

  close(): void {
    this.t.close();
  }
}

/** A whole bpf/inbound.bpf.c, loaded through libbpf (cookie 0 until setInstanceNetns). */
export async function loadWhole(mapsDir: string, sizes?: ReadonlyMap<SizedMap, number>): Promise<InboundInstance> {
  const file = POD_INBOUND_OBJECT;
  const obj = bpf.openObject(objectPath(file), { mapPinDir: mapsDir });
  try {
    // A whole program carries every map; the LRU maps' sizes are the node's (chosen at load).
    adoptPinnedSizes(obj, sizes ?? mapsDir);
    await obj.load();
    const prog = obj.programs().find((p) => p.name === POD_INBOUND_PROGRAM);
    if (!prog) throw new Error(`${file} has no program ${POD_INBOUND_PROGRAM}: rebuild (npm run setup)`);
    const maps = obj.maps();
    // libbpf names it "<object prefix>.bss"; mc_netns is its only variable.
    const bss = maps.find((m) => m.name.endsWith('.bss'));
    if (!bss || bss.valueSize !== 8) {
      throw new Error(`${file} has no 8-byte .bss holding ${NETNS_VAR} (an object from an older build?): rebuild (npm run setup)`);
    }
    const dep = maps.find((m) => m.name === MAP.pods);
    if (!dep) throw new Error(`${file} does not use ${MAP.pods}: rebuild (npm run setup)`);
    return { kind: 'whole', progFd: prog.fd, netnsMapFd: bss.fd, mapId: bpf.mapInfo(dep.fd).id, close: () => obj.close() };
  } catch (e) {
    obj.close();
    throw e;
  }
}

/** True when pods get stubs: the shared program is pinned (src/loader/inbound-shared.ts put it in its slot first); else each pod gets a whole mc_inbound. */
export function inboundSharedReady(pinRoot: string): boolean {
  return existsSync(pinLayout(pinRoot).prog(INBOUND_SHARED_PROGRAM));
}

/**
 * Loads the pod's instance against the maps pinned in mapsDir (not attached):
 * a stub when the shared program is in place (pinned beside mapsDir), through
 * a template made for this one load (the pool keeps one instead), else a whole
 * program with the cookie written. `sizes`: the pins' LRU sizes read once by
 * the caller (a whole program carries those maps); without, read from the pins.
 */
export async function loadInboundInstance(mapsDir: string, netns = 0n, sizes?: ReadonlyMap<SizedMap, number>): Promise<InboundInstance> {
  let inst: InboundInstance;
  if (inboundSharedReady(path.dirname(mapsDir))) {
    const t = new StubTemplate(mapsDir);
    try {
      inst = t.instance();
    } finally {
      t.close();
    }
  } else {
    inst = await loadWhole(mapsDir, sizes);
  }
  try {
    setInstanceNetns(inst, netns);
  } catch (e) {
    inst.close();
    throw e;
  }
  return inst;
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

/**
 * Gives the instance its pod (one BPF_MAP_UPDATE_ELEM): written before the
 * instance is linked into the pod's netns, so it never runs with another
 * cookie (and never with 0 there: a stub with 0 passes everything). Stub and
 * whole alike: the cookie is key 0 of a 1-entry array of 8-byte values.
 */
export function setInstanceNetns(inst: InboundInstance, netns: bigint): void {
  bpf.instanceSetU64(inst.netnsMapFd, netns);
}

export interface InboundPoolOptions {
  /** Where the maps the instances read are pinned. */
  mapsDir: string;
  /** Instances kept loaded (stubs, or whole ones where the kernel refused the shared program; 0: none, every ADD loads its own). */
  size: number;
  /** Kernel id of the mc_pods map the owner writes: a whole instance reading another one is never handed out. */
  podsMapId: number;
  /** A background load failed (the next take() tries again; ADDs load their own meanwhile). */
  onError?: (err: Error) => void;
}

export class InboundPool {
  /** Whole instances waiting. */
  private ready: InboundInstance[] = [];
  /** Stubs waiting, all made from this.template (closed with it). */
  private stubs: InboundInstance[] = [];
  private filling: Promise<void> | null = null;
  /** The stub being loaded on a worker thread (one at a time). */
  private stubLoading: Promise<void> | null = null;
  private closed = false;
  private refillQueued = false;
  /** The pins' LRU sizes, read at the first load (three pin opens less per instance). */
  private sizes: Map<SizedMap, number> | undefined;
  /** The stub template for the prog array pinned now (rebuilt when that changes). */
  private template: StubTemplate | undefined;
  /** Counters for metrics and tests (hits/misses: instances taken ready / loaded on the ADD; stubs: stubs taken). */
  readonly counts = { hits: 0, misses: 0, loaded: 0, failed: 0, discarded: 0, stubs: 0, templates: 0 };

  constructor(private readonly o: InboundPoolOptions) {}

  get size(): number {
    return this.o.size;
  }

  /** Instances loaded and waiting. */
  get available(): number {
    return this.ready.length + this.stubs.length;
  }

  /**
   * The pod's instance, its cookie not written yet (setInstanceNetns): where
   * pods get stubs, a waiting one or else one made now from the template (one
   * BPF_PROG_LOAD); else a waiting whole instance, or undefined when none is
   * ready (the caller loads one). Refilled after this turn.
   */
  take(): InboundInstance | undefined {
    let inst: InboundInstance | undefined;
    if (!this.closed && inboundSharedReady(path.dirname(this.o.mapsDir))) {
      const t = this.stubTemplate();
      if (t) {
        this.counts.stubs++;
        inst = this.stubs.pop();
        if (inst) this.counts.hits++;
        else {
          if (this.o.size > 0) this.counts.misses++;
          inst = t.instance();
        }
      }
    }
    if (!inst) {
      inst = this.ready.pop();
      if (inst) this.counts.hits++;
      else if (this.o.size > 0) this.counts.misses++;
    }
    // Not now: the ADD that is taking it answers first.
    this.queueRefill();
    return inst;
  }

  private queueRefill(): void {
    if (this.refillQueued || this.closed) return;
    this.refillQueued = true;
    setImmediate(() => {
      this.refillQueued = false;
      this.fill();
    });
  }

  /**
   * The template for the prog array pinned now; undefined when it cannot be
   * loaded (reported; the ADD then loads its own and fails with the reason).
   * A prog array replaced under its pin (a later load made a new one) gets a
   * new template, and the waiting stubs go: stubs must tail-call the array the
   * shared program is in.
   */
  private stubTemplate(): StubTemplate | undefined {
    if (this.template?.current()) return this.template;
    for (const s of this.stubs.splice(0)) s.close();
    this.template?.close();
    this.template = undefined;
    try {
      this.template = new StubTemplate(this.o.mapsDir);
      this.counts.templates++;
    } catch (e) {
      this.counts.failed++;
      this.o.onError?.(e as Error);
    }
    return this.template;
  }

  /** Kernel id of the template's own program (never attached); undefined without one. */
  templateProgId(): number | undefined {
    return this.template?.progId;
  }

  /**
   * Loads instances in the background up to size: stubs one at a time on a
   * libuv worker thread (~0.3 ms of CPU each, which on the event loop would
   * sit between a burst's ADDs), whole ones one libbpf load at a time (also
   * on a worker). Idempotent.
   */
  fill(): void {
    if (this.closed || this.filling || this.stubLoading) return;
    if (inboundSharedReady(path.dirname(this.o.mapsDir))) {
      const t = this.stubTemplate();
      if (!t || this.stubs.length >= this.o.size) return;
      this.stubLoading = t.instanceAsync().then(
        (inst) => {
          this.stubLoading = null;
          // Closed meanwhile, or the prog array was replaced (a new template):
          // a stub must tail-call the array the shared program is in.
          if (this.closed || t !== this.template) {
            if (!this.closed) this.counts.discarded++;
            inst.close();
          } else {
            this.stubs.push(inst);
            this.counts.loaded++;
          }
          this.fill();
        },
        (e: unknown) => {
          // Stop until the next take(): the ADD that makes its own reports why.
          this.stubLoading = null;
          this.counts.failed++;
          this.o.onError?.(e as Error);
        },
      );
      return;
    }
    if (this.ready.length >= this.o.size) return;
    this.filling = this.run().finally(() => {
      this.filling = null;
    });
  }

  /** Resolves when the pool is full (or a load failed, or it was closed): tests and benches. */
  async filled(): Promise<void> {
    const before = this.counts.failed;
    for (;;) {
      this.fill();
      const busy = this.stubLoading ?? this.filling;
      if (!busy) return;
      await busy;
      if (this.closed || this.counts.failed !== before) return;
    }
  }

  private async run(): Promise<void> {
    while (!this.closed && this.ready.length < this.o.size) {
      let inst: InboundInstance;
      try {
        this.sizes ??= pinnedSizes(this.o.mapsDir);
        inst = await loadWhole(this.o.mapsDir, this.sizes);
      } catch (e) {
        // Stop until the next take(): a kernel that refuses the object
        // refuses it every time, and the ADD that loads its own reports why.
        // The sizes are read again then (a reload may have re-pinned the maps).
        this.sizes = undefined;
        this.counts.failed++;
        this.o.onError?.(e as Error);
        return;
      }
      // A whole program must read the owner's mc_pods.
      if (this.closed || inst.mapId !== this.o.podsMapId) {
        // Closed meanwhile, or the maps were replaced under the pins: the
        // owner is about to be replaced too.
        if (!this.closed) this.counts.discarded++;
        inst.close();
        return;
      }
      this.counts.loaded++;
      this.ready.push(inst);
    }
  }

  /** Kernel ids of the waiting programs and the template's (tests: they must be gone after close). */
  programIds(): number[] {
    const ids = [...this.ready, ...this.stubs].map((i) => bpf.progInfo(i.progFd).id);
    if (this.template) ids.push(this.template.progId);
    return ids;
  }

  /** Frees every waiting instance and the template (nothing of them is attached or pinned). Idempotent. */
  close(): void {
    this.closed = true;
    for (const inst of this.ready.splice(0)) inst.close();
    for (const inst of this.stubs.splice(0)) inst.close();
    this.template?.close();
    this.template = undefined;
  }
}
