// The TypeScript codecs must match the structs in the compiled BPF objects:
// read the BTF of every object with bpftool and compare size and every
// member's offset with src/maps/layout.ts.
import { describe, expect, it } from 'vitest';
import { execa } from 'execa';
import { existsSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { bpfObjectDir } from '../../../src/paths.js';
import { ALL_LAYOUTS } from '../../../src/maps/layout.js';

interface BtfType { id: number; kind: string; name?: string; size?: number; members?: { name: string; bits_offset: number }[] }

async function btfStructs(obj: string): Promise<Map<string, BtfType>> {
  const { stdout } = await execa('bpftool', ['-j', 'btf', 'dump', 'file', obj]);
  const types = (JSON.parse(stdout) as { types: BtfType[] }).types;
  return new Map(types.filter((t) => t.kind === 'STRUCT' && t.name?.startsWith('mc_')).map((t) => [t.name!, t]));
}

describe('map layouts vs BTF', () => {
  const objects = existsSync(bpfObjectDir) ? readdirSync(bpfObjectDir).filter((f) => f.endsWith('.bpf.o')) : [];
  it('the BPF objects are built', () => {
    expect(objects.length, `no objects in ${bpfObjectDir}: run npm run setup`).toBeGreaterThanOrEqual(5);
  });

  it('every layout matches the struct of the same name in every object that has it', async () => {
    const seen = new Set<string>();
    for (const o of objects) {
      const structs = await btfStructs(path.join(bpfObjectDir, o));
      for (const l of ALL_LAYOUTS) {
        const s = structs.get(l.name);
        if (!s) continue;
        seen.add(l.name);
        expect(s.size, `${o}: sizeof(struct ${l.name})`).toBe(l.size);
        const btfOffsets = Object.fromEntries(s.members!.map((m) => [m.name, m.bits_offset / 8]));
        const tsOffsets = Object.fromEntries(l.fields.map((f) => [f.name, f.offset]));
        expect(tsOffsets, `${o}: members of struct ${l.name}`).toEqual(btfOffsets);
      }
    }
    // every layout was checked against at least one object
    expect([...seen].sort()).toEqual(ALL_LAYOUTS.map((l) => l.name).sort());
  });
});
