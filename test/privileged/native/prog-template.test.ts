// ProgTemplate (native/addon/src/prog_template.cc) against the real kernel:
// the stub object loaded once, instances loaded raw with the magic immediate
// replaced (each carries its own value, seen in the kernel's xlated program),
// and an object or magic that does not match refused with a clear error.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { execa } from 'execa';
import * as bpf from '../../../src/native/addon.js';
import { INBOUND_STUB_OBJECT, INBOUND_STUB_PROGRAM, objectPath, POD_INBOUND_OBJECT, POD_INBOUND_PROGRAM } from '../../../src/loader/manifest.js';
import { STUB_NETNS_MAGIC } from '../../../src/pod-datapath/inbound-pool.js';
import { removeDir, tempPinDir } from './kernel-env.js';

let pins: string;
beforeAll(() => {
  pins = tempPinDir();
});
afterAll(() => removeDir(pins));

const opts = () => ({ mapPinDir: pins, program: INBOUND_STUB_PROGRAM, magic: STUB_NETNS_MAGIC, license: 'Dual BSD/GPL' });

async function xlated(fd: number): Promise<string> {
  return (await execa('bpftool', ['prog', 'dump', 'xlated', 'id', String(bpf.progInfo(fd).id)])).stdout;
}

describe('ProgTemplate', () => {
  it('loads instances raw, each with its own immediate, using the template\'s maps', async () => {
    const t = bpf.loadProgTemplate(objectPath(INBOUND_STUB_OBJECT), opts());
    const fds: number[] = [];
    try {
      expect(t.insnCount).toBeGreaterThan(10);
      fds.push(t.instantiate(0x1234_5678_9abcn), t.instantiate(0xfedc_ba98_7654n));
      const [a, b] = fds.map((fd) => bpf.progInfo(fd));
      expect(a!.name).toBe(INBOUND_STUB_PROGRAM);
      expect(a!.type).toBe(bpf.progInfo(t.progFd).type);
      expect(a!.tag, 'two cookies, two programs').not.toBe(b!.tag);
      expect(await xlated(fds[0]!)).toContain('0x123456789abc');
      expect(await xlated(fds[1]!)).toContain('0xfedcba987654');
      expect(await xlated(fds[1]!)).not.toContain('0x123456789abc');
      // the instances use the maps the template pinned (mc_inbound_arg, mc_inbound_tail)
      expect(bpf.progMapIds(fds[0]!).sort()).toEqual(bpf.progMapIds(t.progFd).sort());
      expect(bpf.progMapIds(fds[0]!)).toHaveLength(2);
    } finally {
      for (const fd of fds) bpf.closeFd(fd);
      t.close();
    }
    expect(() => t.instantiate(1n)).toThrow(/after close/);
  });

  it('refuses a magic the program does not carry, and an object without it', () => {
    expect(() => bpf.loadProgTemplate(objectPath(INBOUND_STUB_OBJECT), { ...opts(), magic: 0x1111n }))
      .toThrow(/program mc_inbound_pod has 0 ld_imm64 of the magic 0x0000000000001111, expected exactly one/);
    // the whole inbound program keeps its cookie in .bss: no magic in it
    const whole = tempPinDir();
    try {
      expect(() => bpf.loadProgTemplate(objectPath(POD_INBOUND_OBJECT), { ...opts(), mapPinDir: whole, program: POD_INBOUND_PROGRAM }))
        .toThrow(/program mc_inbound has 0 ld_imm64 of the magic 0x6d636e65746e7321, expected exactly one/);
    } finally {
      removeDir(whole);
    }
    expect(() => bpf.loadProgTemplate(objectPath(INBOUND_STUB_OBJECT), { ...opts(), program: 'nope' })).toThrow(/program nope/);
  });
});
