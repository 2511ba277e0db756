// The loader on this kernel, with bpftool as an independent observer: pins
// under the pin root, adoption on a second load, in-place replacement by a
// newer build, refusal to overwrite foreign pins, and a complete uninstall.
import { afterAll, afterEach, beforeAll, expect, it } from 'vitest';
import { describeEbpf } from '../../helpers/datapaths.js';
import { execa } from 'execa';
import { cpSync, existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ForeignPinError, loadDatapath, uninstallDatapath } from '../../../src/loader/datapath.js';
import { NODE_OBJECTS } from '../../../src/loader/manifest.js';
import { findCgroup2 } from '../../../src/loader/mounts.js';
import { bpfObjectDir, projectRoot } from '../../../src/paths.js';
import * as bpf from '../../../src/native/addon.js';
import { testPinRoot } from '../../helpers/lab.js';

const cgroup = findCgroup2()!;
const roots: string[] = [];
const newRoot = () => {
  const r = testPinRoot();
  roots.push(r);
  return r;
};
afterEach(() => {
  for (const r of roots.splice(0)) if (existsSync(r)) uninstallDatapath(r);
});

async function bpftoolJson<T>(...args: string[]): Promise<T> {
  const out = (await execa('bpftool', ['-j', ...args])).stdout.trim();
  return JSON.parse(out || '[]') as T; // bpftool prints nothing for an empty list
}
const cgroupProgs = async () =>
  (await bpftoolJson<{ id: number; name: string; attach_type: string }[]>('cgroup', 'show', cgroup)).filter((p) => p.name.startsWith('mc_'));
const links = async () => bpftoolJson<{ id: number; prog_id: number; type: string }[]>('link', 'show');

const EXPECTED = NODE_OBJECTS.flatMap((o) => o.cgroup.map((c) => c.name)).sort();

let variantDir: string;
beforeAll(async () => {
  // A "newer build": the same sources compiled at -O1 give different
  // instructions (a different program tag) with identical maps.
  variantDir = mkdtempSync(path.join(os.tmpdir(), 'meshcap-variant-'));
  cpSync(bpfObjectDir, variantDir, { recursive: true });
  await execa('clang', ['-target', 'bpf', '-O1', '-g', '-D__TARGET_ARCH_x86', '-I', path.join(projectRoot, 'bpf/include'), '-I', bpfObjectDir,
    '-idirafter', '/usr/include/x86_64-linux-gnu', '-c', path.join(projectRoot, 'bpf/outbound.bpf.c'), '-o', path.join(variantDir, 'outbound.bpf.o')]);
});
afterAll(() => rmSync(variantDir, { recursive: true, force: true }));

describeEbpf('datapath loader', () => {
  it('attaches every program at the cgroup v2 root through pinned links that bpftool sees', async () => {
    const root = newRoot();
    const r = await loadDatapath({ pinRoot: root });
    expect(r.cgroup).toBe(cgroup);
    expect(r.links.map((l) => l.name).sort()).toEqual(EXPECTED);
    expect(r.links.every((l) => l.action === 'created')).toBe(true);
    expect(readdirSync(path.join(root, 'links')).sort()).toEqual(EXPECTED);
    expect(readdirSync(path.join(root, 'maps'))).toContain('mc_pods');
    const seen = await cgroupProgs();
    for (const l of r.links) expect(seen.some((p) => p.id === l.progId && p.name === l.name)).toBe(true);
    const all = await links();
    for (const l of r.links) expect(all.find((x) => x.id === l.linkId)?.prog_id).toBe(l.progId);
  });

  it('adopts what is pinned on a second load: same link ids, same programs', async () => {
    const root = newRoot();
    const first = await loadDatapath({ pinRoot: root });
    const second = await loadDatapath({ pinRoot: root });
    expect(second.links.every((l) => l.action === 'adopted')).toBe(true);
    expect(second.links.map((l) => [l.name, l.linkId, l.progId])).toEqual(first.links.map((l) => [l.name, l.linkId, l.progId]));
    // no duplicate attachment either
    expect((await cgroupProgs()).filter((p) => p.name === 'mc_connect4' && first.links.some((l) => l.progId === p.id))).toHaveLength(1);
  });

  it('replaces a changed program in place with bpf_link_update (same link, new program)', async () => {
    const root = newRoot();
    const first = await loadDatapath({ pinRoot: root });
    const upgraded = await loadDatapath({ pinRoot: root, objectDir: variantDir });
    const before = new Map(first.links.map((l) => [l.name, l]));
    for (const l of upgraded.links) {
      const b = before.get(l.name)!;
      expect(l.linkId).toBe(b.linkId);
      if (l.name.startsWith('mc_connect')) {
        expect(l.action).toBe('replaced');
        expect(l.progId).not.toBe(b.progId);
      } else {
        expect(l.action).toBe('adopted');
      }
    }
    const seen = await cgroupProgs();
    expect(seen.filter((p) => p.name === 'mc_connect4').map((p) => p.id)).toContain(upgraded.links.find((l) => l.name === 'mc_connect4')!.progId);
  });

  it('reports a foreign pin instead of overwriting it', async () => {
    const root = newRoot();
    await loadDatapath({ pinRoot: root });
    // put a map where a link belongs
    const linkPin = path.join(root, 'links', 'mc_connect4');
    const fd = bpf.objGet(linkPin);
    bpf.linkDetach(fd);
    bpf.closeFd(fd);
    rmSync(linkPin);
    const mapFd = bpf.objGet(path.join(root, 'maps', 'mc_stats'));
    bpf.objPin(mapFd, linkPin);
    bpf.closeFd(mapFd);
    await expect(loadDatapath({ pinRoot: root })).rejects.toThrow(ForeignPinError);
    await expect(loadDatapath({ pinRoot: root })).rejects.toThrow(/links\/mc_connect4: expected a pinned bpf_link, found a map/);
    expect(existsSync(linkPin)).toBe(true);
  });

  it('refuses an incompatible pinned map, naming it', async () => {
    const root = newRoot();
    await loadDatapath({ pinRoot: root });
    const pods = path.join(root, 'maps', 'mc_pods');
    rmSync(pods);
    const listen = bpf.objGet(path.join(root, 'maps', 'mc_listen'));
    bpf.objPin(listen, pods); // a SOCKHASH where a HASH of pods belongs
    bpf.closeFd(listen);
    await expect(loadDatapath({ pinRoot: root })).rejects.toThrow(/mc_pods/);
  });

  it('uninstall removes every pin and every meshcap program, and only those', async () => {
    const root = newRoot();
    const r = await loadDatapath({ pinRoot: root });
    const res = uninstallDatapath(root);
    expect(res.leftBehind).toEqual([]);
    expect(res.detached.length).toBe(EXPECTED.length);
    expect(existsSync(root)).toBe(false);
    const ids = new Set(r.links.map((l) => l.progId));
    expect((await cgroupProgs()).filter((p) => ids.has(p.id))).toEqual([]);
    const linkIds = new Set(r.links.map((l) => l.linkId));
    expect((await links()).filter((l) => linkIds.has(l.id))).toEqual([]);
  });

  it('a first load that fails part way takes back what it pinned and attached; a failed load over a datapath leaves it running', async () => {
    // outbound.bpf.o is loaded last: every other node object is attached by then
    const broken = mkdtempSync(path.join(os.tmpdir(), 'meshcap-broken-'));
    try {
      cpSync(bpfObjectDir, broken, { recursive: true });
      writeFileSync(path.join(broken, 'outbound.bpf.o'), 'not an ELF object');
      const before = (await cgroupProgs()).map((p) => p.id).sort();
      const root = newRoot();
      await expect(loadDatapath({ pinRoot: root, objectDir: broken })).rejects.toThrow(/outbound\.bpf\.o/);
      expect(existsSync(root), `${root} left behind`).toBe(false);
      expect((await cgroupProgs()).map((p) => p.id).sort(), 'programs left attached at the cgroup root').toEqual(before);

      // over a running datapath: nothing is taken back
      const live = newRoot();
      const r = await loadDatapath({ pinRoot: live });
      await expect(loadDatapath({ pinRoot: live, objectDir: broken })).rejects.toThrow(/outbound\.bpf\.o/);
      expect(readdirSync(path.join(live, 'links')).sort()).toEqual(EXPECTED);
      const ids = new Set((await cgroupProgs()).map((p) => p.id));
      for (const l of r.links) expect(ids.has(l.progId), l.name).toBe(true);
    } finally {
      rmSync(broken, { recursive: true, force: true });
    }
  });

  it('uninstall leaves a pin it did not make and says so', async () => {
    const root = newRoot();
    await loadDatapath({ pinRoot: root });
    const stranger = path.join(root, 'maps', 'someone_elses');
    const fd = bpf.objGet(path.join(root, 'maps', 'mc_stats'));
    bpf.objPin(fd, stranger);
    bpf.closeFd(fd);
    const res = uninstallDatapath(root);
    expect(res.leftBehind).toContain(stranger);
    expect(existsSync(stranger)).toBe(true);
    rmSync(stranger);
    uninstallDatapath(root);
    expect(existsSync(root)).toBe(false);
  });

  it('meshcap probe --json says ebpf on this machine', async () => {
    const { stdout } = await execa(process.execPath, [path.join(projectRoot, 'bin/meshcap'), 'probe', '--json']);
    const j = JSON.parse(stdout) as { kernel: string; mode: string; features: Record<string, { ok: boolean }>; reasons: string[] };
    expect(j.kernel).toBe(os.release());
    expect(j.mode).toBe('ebpf');
    expect(Object.values(j.features).every((f) => f.ok)).toBe(true);
    expect(j.reasons.length).toBeGreaterThan(0);
  });
});
