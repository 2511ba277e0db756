// The sized maps (--origdst-entries, --sockorig-entries, --dnsorig-entries,
// --dstslot-entries, --listen-entries) through the real CLI, with bpftool as the observer: a
// load creates the maps at the size asked for; a later load with another size
// adopts the pinned maps as they are and says when the new size applies; after
// uninstall a load creates them at the new size. A pod inbound program loads
// against pins of a non-default size. Prints bytes_memlock summed over the
// pinned maps at both sizes (docs/datapath.md, "Map sizes and memory"), and
// checks the addon's setMaxEntries and its errors.
import { afterEach, expect, it } from 'vitest';
import { execa } from 'execa';
import { existsSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { describeEbpf } from '../../helpers/datapaths.js';
import { scaled, testPinRoot } from '../../helpers/lab.js';
import { uninstallDatapath } from '../../../src/loader/datapath.js';
import { pinLayout } from '../../../src/loader/manifest.js';
import { DEFAULT_MAP_SIZES, SIZED_MAPS, type MapSizes } from '../../../src/loader/map-sizes.js';
import { loadInboundInstance } from '../../../src/pod-datapath/inbound-pool.js';
import { pinnedSizes } from '../../../src/loader/pinned-map-sizes.js';
import { objectPath } from '../../../src/loader/manifest.js';
import { projectRoot } from '../../../src/paths.js';
import * as bpf from '../../../src/native/addon.js';

const roots: string[] = [];
afterEach(() => {
  for (const r of roots.splice(0)) if (existsSync(r)) uninstallDatapath(r);
});

const meshcap = (...args: string[]) => execa(process.execPath, [path.join(projectRoot, 'bin/meshcap'), ...args], { reject: false });
const sizeArgs = (s: MapSizes) => ['--origdst-entries', String(s.mc_origdst), '--sockorig-entries', String(s.mc_sockorig), '--dnsorig-entries', String(s.mc_dnsorig), '--dstslot-entries', String(s.mc_dstslot), '--listen-entries', String(s.mc_listen)];

interface BpftoolMap { id: number; name: string; type: string; max_entries: number; bytes_memlock: number }
async function pinnedMaps(root: string): Promise<Map<string, BpftoolMap>> {
  const dir = pinLayout(root).maps;
  const out = new Map<string, BpftoolMap>();
  for (const name of readdirSync(dir)) {
    const m = JSON.parse((await execa('bpftool', ['-j', 'map', 'show', 'pinned', path.join(dir, name)])).stdout) as BpftoolMap;
    out.set(name, m);
  }
  return out;
}
const sizesOf = (maps: Map<string, BpftoolMap>) => Object.fromEntries(SIZED_MAPS.map((n) => [n, maps.get(n)?.max_entries]));
const memlock = (maps: Map<string, BpftoolMap>) => [...maps.values()].reduce((a, m) => a + m.bytes_memlock, 0);
const report = (label: string, maps: Map<string, BpftoolMap>) =>
  console.log(`[map-sizes] ${label}: ${maps.size} maps, bytes_memlock ${memlock(maps)} (${(memlock(maps) / 2 ** 20).toFixed(1)} MiB); ` +
    [...maps.values()].map((m) => `${m.name} ${m.max_entries} ${m.bytes_memlock}`).join(', '));

// The sizes before issue 19 (every LRU map 262,144 entries) and some other
// size that is not a power of two.
// A: the LRU sizes before issue 19, and mc_listen's compiled size before --listen-entries (32,768)
const A: MapSizes = { mc_origdst: 262_144, mc_sockorig: 262_144, mc_dnsorig: 262_144, mc_dstslot: 65_536, mc_listen: 32_768 };
const B: MapSizes = { mc_origdst: 50_000, mc_sockorig: 3_000, mc_dnsorig: 20_000, mc_dstslot: 4_096, mc_listen: 2_000 };

describeEbpf('LRU map sizes', () => {
  it('size A, then B: adopted A with the message; uninstall, then B: B (bpftool)', async () => {
    const root = testPinRoot();
    roots.push(root);
    const state = ['--pin-root', root, '--state-dir', path.join(root, 'no-state')];

    const first = await meshcap('load', ...state, ...sizeArgs(A));
    expect(first.exitCode, first.stderr).toBe(0);
    expect(first.stdout).toMatch(/map +mc_origdst +262144 entries\n/);
    expect(first.stdout).toMatch(/map +mc_dstslot +65536 entries\n/);
    expect(first.stdout).toMatch(/map +mc_listen +32768 entries\n/);
    const mapsA = await pinnedMaps(root);
    expect(sizesOf(mapsA)).toEqual(A);
    report('262,144 each (the sizes before issue 19)', mapsA);

    // a pod's inbound program carries the maps too: it must take the pinned sizes
    const inst = await loadInboundInstance(pinLayout(root).maps, 0n);
    inst.close();
    // the agent's pool reads the pins' sizes once and hands them to each load
    const sizes = pinnedSizes(pinLayout(root).maps);
    expect(Object.fromEntries(sizes)).toEqual(A);
    const pooled = await loadInboundInstance(pinLayout(root).maps, 0n, sizes);
    pooled.close();

    const second = await meshcap('load', ...state, ...sizeArgs(B));
    expect(second.exitCode, second.stderr).toBe(0);
    for (const n of SIZED_MAPS) {
      expect(second.stdout).toContain(
        `warning: ${n} is pinned with ${A[n]} entries and keeps them (${B[n]} asked for): the new size applies once the datapath is recreated (meshcap uninstall, then meshcap load; or a reboot)`);
    }
    expect(second.stdout).toMatch(/^adopted +mc_connect4 /m);
    const mapsAgain = await pinnedMaps(root);
    expect(sizesOf(mapsAgain)).toEqual(A);
    expect(SIZED_MAPS.map((n) => mapsAgain.get(n)!.id)).toEqual(SIZED_MAPS.map((n) => mapsA.get(n)!.id)); // the same maps

    const un = await meshcap('uninstall', ...state);
    expect(un.exitCode, un.stderr).toBe(0);
    const third = await meshcap('load', ...state, ...sizeArgs(B));
    expect(third.exitCode, third.stderr).toBe(0);
    expect(third.stdout).not.toMatch(/warning/);
    expect(sizesOf(await pinnedMaps(root))).toEqual(B);
  }, scaled(60_000));

  it('defaults: the sizes of DEFAULT_MAP_SIZES, and the node total at most 32 MB of bytes_memlock', async () => {
    const root = testPinRoot();
    roots.push(root);
    const r = await meshcap('load', '--pin-root', root, '--state-dir', path.join(root, 'no-state'));
    expect(r.exitCode, r.stderr).toBe(0);
    const maps = await pinnedMaps(root);
    expect(sizesOf(maps)).toEqual(DEFAULT_MAP_SIZES);
    report('defaults', maps);
    expect(memlock(maps)).toBeLessThanOrEqual(32_000_000);
  }, scaled(60_000));

  it('setMaxEntries: sizes the map before load; errors name the map, the object and errno', async () => {
    const obj = bpf.openObject(objectPath('sockops.bpf.o'));
    try {
      obj.setMaxEntries('mc_origdst', 5000);
      expect(obj.maps().find((m) => m.name === 'mc_origdst')?.maxEntries).toBe(5000);
      let err: unknown;
      try {
        obj.setMaxEntries('mc_nope', 5000);
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(bpf.NativeError);
      expect(err).toMatchObject({ code: 'ENOENT', syscall: 'bpf_object__find_map_by_name' });
      expect((err as Error).message).toMatch(/sockops\.bpf\.o: map mc_nope/);
      expect(() => obj.setMaxEntries('mc_origdst', 0)).toThrow(/at least 1/);
      await obj.load();
      expect(() => obj.setMaxEntries('mc_origdst', 6000)).toThrow(/setMaxEntries\(\) is not allowed when the object is loaded/);
    } finally {
      obj.close();
    }
  });
});
