// ProgTemplate (native/addon/src/prog_template.cc) against the real kernel:
// the stub object loaded once, instances loaded raw, each with a fresh
// 1-entry array of its own in place of the object's .bss (the pod's cookie
// goes there), and an object without exactly one .bss reference refused.
import os from 'node:os';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import * as bpf from '../../../src/native/addon.js';
import { kernelAtLeast, parseKernelRelease } from '../../../src/loader/kernel.js';
import { INBOUND_SHARED_OBJECT, INBOUND_SHARED_PROGRAM, INBOUND_STUB_OBJECT, INBOUND_STUB_PROGRAM, objectPath } from '../../../src/loader/manifest.js';
import { signalStorm } from '../../helpers/signal-storm.js';
import { removeDir, tempPinDir } from './kernel-env.js';

let pins: string;
beforeAll(() => {
  pins = tempPinDir();
});
afterAll(() => removeDir(pins));

const opts = () => ({ mapPinDir: pins, program: INBOUND_STUB_PROGRAM, license: 'Dual BSD/GPL' });
const KEY0 = Buffer.alloc(4);

describe('ProgTemplate', () => {
  it('loads instances raw, each reading its own fresh array, using the template\'s pinned maps', () => {
    // The stub claims its hand with BPF_CMPXCHG (Linux 5.12+); an older
    // verifier refuses it, and such a kernel never gets eBPF mode (5.15+).
    if (!kernelAtLeast(parseKernelRelease(os.release()), 5, 12)) {
      expect(() => bpf.loadProgTemplate(objectPath(INBOUND_STUB_OBJECT), opts())).toThrow(/BPF_STX uses reserved fields/);
      return;
    }
    const t = bpf.loadProgTemplate(objectPath(INBOUND_STUB_OBJECT), opts());
    const inst: { progFd: number; mapFd: number }[] = [];
    try {
      expect(t.insnCount).toBeGreaterThan(10);
      inst.push(t.instantiate(), t.instantiate());
      const [a, b] = inst.map((i) => bpf.progInfo(i.progFd));
      expect(a!.name).toBe(INBOUND_STUB_PROGRAM);
      expect(a!.type).toBe(bpf.progInfo(t.progFd).type);
      const own = inst.map((i) => bpf.mapInfo(i.mapFd));
      expect(own[0]!.id).not.toBe(own[1]!.id);
      expect(own[0]).toMatchObject({ name: 'mc_stub_netns', keySize: 4, valueSize: 8, maxEntries: 1 });
      // zeroed (a stub with 0 captures nothing), and each array its own
      expect(bpf.mapLookup(inst[0]!.mapFd, KEY0, 8)!.readBigUInt64LE()).toBe(0n);
      const v = Buffer.alloc(8);
      v.writeBigUInt64LE(0x1234_5678_9abcn);
      bpf.mapUpdate(inst[0]!.mapFd, KEY0, v);
      expect(bpf.mapLookup(inst[1]!.mapFd, KEY0, 8)!.readBigUInt64LE()).toBe(0n);
      // the instance uses the template's pinned maps (mc_inbound_arg, mc_inbound_tail) and its own array, not the template's .bss
      const tmpl = bpf.progMapIds(t.progFd);
      const ids = inst.map((i) => bpf.progMapIds(i.progFd));
      expect(ids[0]).toHaveLength(3);
      expect(ids[0]).toContain(own[0]!.id);
      expect(ids[1]).toContain(own[1]!.id);
      expect(ids[0]!.filter((id) => tmpl.includes(id))).toHaveLength(2);
      expect(a!.tag, 'the instructions are the same but for the map fd').toBe(b!.tag);
    } finally {
      for (const i of inst) {
        bpf.closeFd(i.progFd);
        bpf.closeFd(i.mapFd);
      }
      t.close();
    }
    expect(() => t.instantiate()).toThrow(/after close/);
  });

  it('loads instances on a worker thread too; close() during those loads waits for them, and refuses new ones', async () => {
    if (!kernelAtLeast(parseKernelRelease(os.release()), 5, 12)) {
      // the stub needs 5.12+ (above): no template, so nothing to load either way
      expect(() => bpf.loadProgTemplate(objectPath(INBOUND_STUB_OBJECT), opts())).toThrow(/BPF_STX uses reserved fields/);
      return;
    }
    const t = bpf.loadProgTemplate(objectPath(INBOUND_STUB_OBJECT), opts());
    const tmpl = bpf.progMapIds(t.progFd);
    const sync = t.instantiate();
    const inst: { progFd: number; mapFd: number }[] = [sync];
    try {
      // Eight in flight, then close() before any has finished: the template's
      // object (whose map fds the instructions embed) must outlive them.
      const pending = Array.from({ length: 8 }, () => t.instantiateAsync());
      t.close();
      expect(t.progFd, 'closed for the caller at once').toBe(-1);
      expect(() => t.instantiate()).toThrow(/after close/);
      expect(() => t.instantiateAsync()).toThrow(/after close/);
      inst.push(...(await Promise.all(pending)));
      const own = new Set<number>();
      for (const i of inst.slice(1)) {
        const p = bpf.progInfo(i.progFd);
        expect(p.name).toBe(INBOUND_STUB_PROGRAM);
        expect(p.tag, 'the same instructions as a synchronous instance').toBe(bpf.progInfo(sync.progFd).tag);
        const m = bpf.mapInfo(i.mapFd);
        expect(m).toMatchObject({ name: 'mc_stub_netns', keySize: 4, valueSize: 8, maxEntries: 1 });
        own.add(m.id);
        expect(bpf.mapLookup(i.mapFd, KEY0, 8)!.readBigUInt64LE()).toBe(0n);
        // the template's pinned maps (the fds embedded while it was open) and its own array
        const ids = bpf.progMapIds(i.progFd);
        expect(ids).toHaveLength(3);
        expect(ids).toContain(m.id);
        expect(ids.filter((id) => tmpl.includes(id))).toHaveLength(2);
      }
      expect(own.size, 'each its own array').toBe(8);
    } finally {
      for (const i of inst) {
        bpf.closeFd(i.progFd);
        bpf.closeFd(i.mapFd);
      }
    }
  });

  it('loads the template and its instances through a storm of signals (the verifier gives up on a pending one)', async () => {
    if (!kernelAtLeast(parseKernelRelease(os.release()), 5, 12)) return; // no template there (above)
    // Before the addon held signals for its loads, the template's own load
    // failed here at once (bpf_object__load: EAGAIN), and under a profiler's
    // SIGPROF a pod's stub load failed its ADD the same way.
    const storm = await signalStorm();
    const inst: { progFd: number; mapFd: number }[] = [];
    let t: ReturnType<typeof bpf.loadProgTemplate> | undefined;
    let sent = 0;
    try {
      t = bpf.loadProgTemplate(objectPath(INBOUND_STUB_OBJECT), opts());
      for (let i = 0; i < 300; i++) {
        inst.push(t.instantiate());
        // a few at a time, as the pool holds them: no fd pile-up
        if (inst.length > 16) {
          for (const x of inst.splice(0, 8)) {
            bpf.closeFd(x.progFd);
            bpf.closeFd(x.mapFd);
          }
        }
      }
      for (let i = 0; i < 20; i++) inst.push(await t.instantiateAsync());
    } finally {
      sent = await storm.stop();
      for (const i of inst) {
        bpf.closeFd(i.progFd);
        bpf.closeFd(i.mapFd);
      }
      t?.close();
    }
    expect(sent, 'the storm ran through the loads').toBeGreaterThan(10_000);
  });

  it('refuses an object whose program does not read its .bss exactly once, and a missing program', () => {
    const shared = tempPinDir();
    try {
      expect(() => bpf.loadProgTemplate(objectPath(INBOUND_SHARED_OBJECT), { ...opts(), mapPinDir: shared, program: INBOUND_SHARED_PROGRAM }))
        .toThrow(/program mc_inbound_main has 0 ld_imm64 of its object's \.bss, expected exactly one/);
    } finally {
      removeDir(shared);
    }
    expect(() => bpf.loadProgTemplate(objectPath(INBOUND_STUB_OBJECT), { ...opts(), program: 'nope' })).toThrow(/program nope/);
  });
});
