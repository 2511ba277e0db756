import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { buildCaptureConfig } from '../../../src/redirect/config.js';
import { configOf, cookieOf, internSettings, readRecords, recordSettings, recordText, sameNetns, settingsOf, sharedConfig, StateStore, STATE_VERSION, type AttachmentRecord } from '../../../src/agent/state-store.js';
import { istioCapture } from '../../helpers/pods.js';

let dir: string;
beforeEach(() => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'meshcap-state-'));
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

function rec(containerId: string, over: Partial<AttachmentRecord> = {}): AttachmentRecord {
  const cfg = istioCapture({ annotations: { 'traffic.sidecar.istio.io/excludeOutboundPorts': '5555' } });
  return {
    version: STATE_VERSION, containerId, ifname: 'eth0', podNamespace: 'default', podName: `p-${containerId}`,
    netns: `/var/run/netns/${containerId}`, netnsCookie: '4097', mode: 'ebpf', profile: 'istio',
    settings: settingsOf(cfg), podIPs: ['198.18.0.5'], createdAt: new Date(0).toISOString(), ...over,
  };
}

describe('StateStore', () => {
  it('writes one JSON file per attachment, reloads it, and rebuilds the capture config', async () => {
    const s = new StateStore(path.join(dir, 'state'));
    expect(s.open()).toEqual([]);
    await s.put(rec('c1'));
    await s.put(rec('c1', { ifname: 'net1' }));
    await s.put(rec('c2', { netnsCookie: null, mode: 'iptables' }));
    expect(readdirSync(s.dir).sort()).toEqual(['c1@eth0.json', 'c1@net1.json', 'c2@eth0.json']);

    const again = new StateStore(s.dir);
    expect(again.open()).toEqual([]);
    expect(again.list()).toHaveLength(3);
    const r = again.get('c1', 'eth0')!;
    expect(cookieOf(r)).toBe(4097n);
    expect(cookieOf(again.get('c2', 'eth0')!)).toBeNull();
    expect(configOf(r).parsed.outboundExcludePorts).toContain(5555);
    expect(configOf(r)).toEqual(istioCapture({ annotations: { 'traffic.sidecar.istio.io/excludeOutboundPorts': '5555' } }));
  });

  it('writes a record as JSON.stringify(rec, null, 1), byte for byte, shared settings spliced from their cached text', async () => {
    const shared = internSettings(settingsOf(istioCapture()));
    const cases: AttachmentRecord[] = [
      rec('c1'), // the caller's own settings: stringified whole
      { ...rec('c2'), settings: shared },
      { ...rec('c3', { modeReason: 'x\n "settings": 0,\n' }), settings: shared }, // a value that looks like the slot
      (() => { const { settings: _s, ...r } = { ...rec('c4') }; return { ...r, settings: shared } as AttachmentRecord; })(), // settings last: no slot
    ];
    for (const r of cases) expect(recordText(r)).toBe(JSON.stringify(r, null, 1) + '\n');
    expect(recordText(cases[1]!)).toBe(recordText({ ...cases[1]! })); // from the cache the second time
    const s = new StateStore(dir);
    s.open();
    for (const r of cases) await s.put(r);
    for (const r of cases) {
      expect(readFileSync(s.fileOf(r.containerId, r.ifname), 'utf8')).toBe(JSON.stringify(r, null, 1) + '\n');
      expect(statSync(s.fileOf(r.containerId, r.ifname)).mode & 0o777).toBe(0o600);
    }
  });

  it('replaces a record atomically and leaves no temporary files', async () => {
    const s = new StateStore(dir);
    s.open();
    await s.put(rec('c1'));
    await Promise.all(Array.from({ length: 20 }, (_, i) => s.put(rec('c1', { podIPs: [`198.18.0.${i}`] }))));
    expect(readdirSync(dir)).toEqual(['c1@eth0.json']);
    const onDisk = JSON.parse(readFileSync(s.fileOf('c1', 'eth0'), 'utf8')) as AttachmentRecord;
    expect(onDisk.podIPs).toEqual(s.get('c1', 'eth0')!.podIPs);
  });

  it('shares one frozen settings object per distinct settings and rewrites records byte-identically', async () => {
    const s = new StateStore(dir);
    s.open();
    const mine = rec('c1');
    await s.put(mine);
    await s.put(rec('c2'));
    await s.put(rec('c3', { settings: settingsOf(istioCapture()) }));
    const bytes = readFileSync(s.fileOf('c1', 'eth0'), 'utf8');
    // the caller's record keeps its own, unfrozen settings
    expect(Object.isFrozen(mine.settings)).toBe(false);
    expect(s.get('c1', 'eth0')!.settings).toBe(s.get('c2', 'eth0')!.settings);
    expect(s.get('c3', 'eth0')!.settings).not.toBe(s.get('c1', 'eth0')!.settings);
    expect(Object.isFrozen(s.get('c1', 'eth0')!.settings)).toBe(true);

    const again = new StateStore(dir);
    expect(again.open()).toEqual([]);
    const r1 = again.get('c1', 'eth0')!;
    expect(r1.settings).toBe(again.get('c2', 'eth0')!.settings);
    expect(r1.settings).toBe(s.get('c1', 'eth0')!.settings);
    expect(r1.settings).toEqual(mine.settings);
    expect(() => {
      (r1.settings as { outboundIPRangesInclude: string }).outboundIPRangesInclude = '198.18.0.0/15';
    }).toThrow(TypeError);
    // a record rewritten from the shared settings is the same bytes
    await again.put(r1);
    expect(readFileSync(s.fileOf('c1', 'eth0'), 'utf8')).toBe(bytes);
  });

  it('sharedConfig gives one config object per distinct settings, the one configOf gives for records with them', () => {
    const ann = { 'traffic.sidecar.istio.io/excludeOutboundPorts': '7171' };
    const first = istioCapture({ annotations: ann });
    // podToCaptureConfig hands back one object per distinct settings; another
    // object with the same settings, as a record read back builds
    expect(istioCapture({ annotations: ann })).toBe(first);
    const again = buildCaptureConfig(settingsOf(first));
    expect(again).not.toBe(first);
    const shared = sharedConfig(first);
    expect(sharedConfig(again)).toBe(shared);
    expect(shared).toEqual(again);
    expect(configOf(rec('c9', { settings: settingsOf(again) }))).toBe(shared);
    // its record settings: the interned (frozen, shared) object, equal to settingsOf
    const settings = recordSettings(shared);
    expect(settings).toEqual(settingsOf(first));
    expect(Object.isFrozen(settings)).toBe(true);
    expect(internSettings(settings)).toBe(settings);
    expect(internSettings(settingsOf(again))).toBe(settings);
    // records holding the interned settings (as the store's do) get the same
    // config by identity, asked again and again; a copy still by its JSON
    const interned = rec('c10', { settings });
    expect(configOf(interned)).toBe(shared);
    expect(configOf({ ...interned, containerId: 'c11' })).toBe(shared);
    expect(configOf(rec('c12', { settings: structuredClone(settings) }))).toBe(shared);
    // other settings: another object, built from them
    const other = sharedConfig(istioCapture({ annotations: { 'traffic.sidecar.istio.io/excludeOutboundPorts': '7172' } }));
    expect(other).not.toBe(shared);
    expect(other.parsed.outboundExcludePorts).toContain(7172);
    expect(other.parsed.outboundExcludePorts).not.toContain(7171);
  });

  it('siblingOf finds another attachment of the same netns (by cookie where both have one, else by path), where the walk over every record did', async () => {
    const s = new StateStore(path.join(dir, 'state'));
    s.open();
    const a = rec('a', { netnsCookie: '11', netns: '/var/run/netns/x' });
    await s.put(a);
    expect(s.siblingOf(a)).toBeUndefined(); // not itself
    await s.put(rec('a', { ifname: 'net1', netnsCookie: '11', netns: '/proc/77/ns/net' })); // same cookie, another path
    expect(s.siblingOf(a)?.ifname).toBe('net1');
    await s.remove('a', 'net1');
    expect(s.siblingOf(a)).toBeUndefined();
    await s.put(rec('b', { netnsCookie: '12', netns: '/var/run/netns/x' })); // same path, another cookie: another netns
    expect(s.siblingOf(a)).toBeUndefined();
    await s.put(rec('c', { netnsCookie: null, netns: '/var/run/netns/x' })); // no cookie: by path
    expect(s.siblingOf(a)?.containerId).toBe('c');
    // a record replaced with another netns leaves its old keys
    await s.put(rec('c', { netnsCookie: null, netns: '/var/run/netns/y' }));
    expect(s.siblingOf(a)).toBeUndefined();
    expect(s.siblingOf(rec('z', { netnsCookie: null, netns: '/var/run/netns/y' }))?.containerId).toBe('c');
    expect(s.siblingOf(rec('z', { netnsCookie: null, netns: '' }))).toBeUndefined(); // an empty path is nobody's
    // the same answers as a walk over every record, after a reload too
    const again = new StateStore(s.dir);
    again.open();
    const walk = (r: AttachmentRecord) => again.list().find((o) => !(o.containerId === r.containerId && o.ifname === r.ifname) && sameNetns(o, r));
    for (const probe of [a, ...again.list(), rec('q', { netnsCookie: '12', netns: '' }), rec('q', { netnsCookie: null, netns: '/var/run/netns/x' })]) {
      const found = again.siblingOf(probe);
      expect(found !== undefined).toBe(walk(probe) !== undefined);
      if (found) expect(sameNetns(found, probe) && !(found.containerId === probe.containerId && found.ifname === probe.ifname)).toBe(true);
    }
  });

  it('removes records, also ones that are already gone', async () => {
    const s = new StateStore(dir);
    s.open();
    await s.put(rec('c1'));
    await s.remove('c1', 'eth0');
    await s.remove('c1', 'eth0');
    expect(s.list()).toEqual([]);
    expect(readdirSync(dir)).toEqual([]);
  });

  it('reads records sharing settings as they were written: one shared settings object, every other member its own, any layout', () => {
    const settings = settingsOf(istioCapture({ annotations: { 'traffic.sidecar.istio.io/excludeOutboundPorts': '7777' } }));
    const written: AttachmentRecord[] = [
      { ...rec('a1'), settings },
      { ...rec('a2', { podIPs: ['198.18.0.6', '2001:db8::6'], modeReason: 'x\n "settings": {\n }' }), settings },
      { ...rec('a3', { netnsCookie: null, mode: 'iptables' }), settings },
    ];
    for (const r of written) writeFileSync(path.join(dir, `${r.containerId}@eth0.json`), JSON.stringify(r, null, 1) + '\n');
    // the same settings in other layouts: compact, and settings last with a member after them in another file
    const compact = { ...rec('a4'), settings };
    writeFileSync(path.join(dir, 'a4@eth0.json'), JSON.stringify(compact));
    const { settings: _s, ...rest } = rec('a5');
    const last = { ...rest, settings, podIPs: ['198.18.0.9'] } as AttachmentRecord;
    writeFileSync(path.join(dir, 'a5@eth0.json'), JSON.stringify(last, null, 1));
    // empty settings (one line) before an object member: not taken for the settings' text
    const odd = { ...rec('a6'), settings: {} as AttachmentRecord['settings'], extra: { k: 1 } } as AttachmentRecord;
    writeFileSync(path.join(dir, 'a6@eth0.json'), JSON.stringify(odd, null, 1));
    for (let round = 0; round < 2; round++) {
      const r = readRecords(dir);
      expect(r.problems).toEqual([]);
      expect(r.records).toEqual([...written, compact, last, odd]);
      const shared = r.records.slice(0, 5).map((x) => x.settings);
      expect(new Set(shared).size, 'one shared object').toBe(1);
      expect(Object.isFrozen(shared[0])).toBe(true);
    }
  });

  it('reports unreadable files by name and keeps the good ones', async () => {
    const s = new StateStore(dir);
    s.open();
    await s.put(rec('c1'));
    writeFileSync(path.join(dir, 'broken@eth0.json'), '{"version":1');
    writeFileSync(path.join(dir, 'old@eth0.json'), '{"version":0}');
    writeFileSync(path.join(dir, 'notes.txt'), 'ignored');
    const r = readRecords(dir);
    expect(r.records.map((x) => x.containerId)).toEqual(['c1']);
    expect(r.problems).toHaveLength(2);
    expect(r.problems[0]).toContain('broken@eth0.json');
    expect(r.problems[1]).toMatch(/old@eth0.json: not a version 1/);
    expect(readRecords(path.join(dir, 'missing'))).toEqual({ records: [], problems: [] });
  });
});
