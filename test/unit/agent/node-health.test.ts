// `meshcap status`'s first part: the CNI chain check and the AGENT block.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { chainStatus, formatDuration, formatNodeHealth, type NodeHealth } from '../../../src/agent/node-health.js';
import { meshcapVersion } from '../../../src/version.js';

let dir: string;
beforeEach(() => { dir = mkdtempSync(path.join(tmpdir(), 'meshcap-health-')); });
afterEach(() => rmSync(dir, { recursive: true, force: true }));

const conflist = (...types: string[]) => JSON.stringify({ cniVersion: '1.0.0', name: 'k8s', plugins: types.map((type) => ({ type })) });

describe('chainStatus: the config the runtime uses (first by name) and meshcap-cni in it', () => {
  it('ok when meshcap-cni is last in the first parsable file', () => {
    writeFileSync(path.join(dir, '05-broken.conflist'), '{not json');
    writeFileSync(path.join(dir, '06-empty.conflist'), conflist()); // no plugins: the runtime skips it too
    writeFileSync(path.join(dir, '07-list.conf'), conflist('bridge')); // a .conf without "type": skipped
    writeFileSync(path.join(dir, '10-k8s.conflist'), conflist('bridge', 'portmap', 'meshcap-cni'));
    writeFileSync(path.join(dir, '20-other.conflist'), conflist('bridge'));
    expect(chainStatus(dir)).toMatchObject({ ok: true, position: 2, file: path.join(dir, '10-k8s.conflist'), detail: `meshcap-cni is last in ${path.join(dir, '10-k8s.conflist')}` });
  });

  it('a problem when absent, when not last, and when there is no config', () => {
    writeFileSync(path.join(dir, '10-k8s.conflist'), conflist('bridge', 'portmap'));
    expect(chainStatus(dir)).toMatchObject({ ok: false, position: null });
    expect(chainStatus(dir).detail).toMatch(/meshcap-cni is not in .*10-k8s.conflist \(plugins: bridge, portmap\): new pods are not captured/);
    writeFileSync(path.join(dir, '10-k8s.conflist'), conflist('bridge', 'meshcap-cni', 'portmap'));
    expect(chainStatus(dir)).toMatchObject({ ok: false, position: 1 });
    expect(chainStatus(dir).detail).toMatch(/but not last/);
    expect(chainStatus(path.join(dir, 'none')).detail).toMatch(/does not exist/);
    rmSync(path.join(dir, '10-k8s.conflist'));
    expect(chainStatus(dir).detail).toBe(`no CNI network config in ${dir}`);
  });
});

describe('the AGENT block', () => {
  const chain = { confDir: '/etc/cni/net.d', file: '/etc/cni/net.d/10.conflist', position: 1, plugins: ['bridge', 'meshcap-cni'], ok: true, detail: 'meshcap-cni is last in /etc/cni/net.d/10.conflist' };
  const self = meshcapVersion();

  it('a healthy agent: reachable, ready, mode, version, uptime, pod source, chain, in that order', () => {
    const h: NodeHealth = {
      socket: '/run/x.sock', uptimeS: 3725, versionDiffers: false, chain,
      agent: { reachable: true, version: self.version, commit: self.commit, cniVersions: [], mode: 'ebpf', startedAt: 'x', notReady: null, podSourceSynced: true, pid: 42 },
    };
    const lines = formatNodeHealth(h).split('\n').map((l) => l.split(/\s{2,}/)[0]);
    expect(lines).toEqual(['agent', 'ready', 'mode', 'version', 'uptime', 'pod source', 'CNI chain']);
    expect(formatNodeHealth(h)).toMatch(/ready\s+yes\n/);
    expect(formatNodeHealth(h)).toMatch(/uptime\s+1h02m/);
    expect(formatNodeHealth(h)).toMatch(/pod source\s+synced/);
  });

  it('says what is wrong: not reachable (root), not ready, version drift, unsynced', () => {
    expect(formatNodeHealth({ socket: '/s', uptimeS: null, versionDiffers: false, chain, agent: { reachable: false, error: 'permission denied (the socket is root-only)', needsRoot: true } }))
      .toMatch(/^agent\s+NOT REACHABLE at \/s: permission denied \(the socket is root-only\) \(run as root\)/);
    const t = formatNodeHealth({
      socket: '/s', uptimeS: 5, versionDiffers: true, chain: { ...chain, ok: false, detail: 'meshcap-cni is not in x' },
      agent: { reachable: true, version: '0.0.9', commit: null, cniVersions: [], mode: 'iptables', notReady: 'pod source not synced yet', podSourceSynced: false },
    });
    expect(t).toMatch(/ready\s+NO: pod source not synced yet/);
    expect(t).toMatch(/version\s+0\.0\.9  \(this CLI: /);
    expect(t).toMatch(/pod source\s+NOT synced yet/);
    expect(t).toMatch(/CNI chain\s+PROBLEM: meshcap-cni is not in x/);
  });

  it('durations read like kubectl ages', () => {
    expect([formatDuration(9), formatDuration(61), formatDuration(3600), formatDuration(90000)]).toEqual(['9s', '1m01s', '1h00m', '1d01h']);
  });
});
