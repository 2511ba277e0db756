// install-cni's effectful half against real directories (temp dirs, never the
// host's /etc/cni/net.d or /opt/cni/bin): inotify re-insertion after the
// primary CNI rewrites or replaces its file, atomic binary placement while the
// old binary runs, restore of a removed binary, readiness, uninstall.
import { spawn, execFileSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, unlinkSync, writeFileSync, openSync, closeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { pino } from 'pino';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { checkChain, type MeshcapEntry } from '../../../src/install-cni/config.js';
import { placeBinary, readConfDir } from '../../../src/install-cni/files.js';
import { CniInstaller, uninstallCni } from '../../../src/install-cni/installer.js';
import { runInstallCni } from '../../../src/install-cni/run.js';

const entry: MeshcapEntry = { type: 'meshcap-cni', agentSocket: '/var/run/meshcap/cni.sock', agentTimeoutMs: 10000, excludeNamespaces: ['kube-system'] };
const bridgeList = JSON.stringify({ cniVersion: '1.0.0', name: 'k8s-pod-network', plugins: [{ type: 'bridge', bridge: 'cni0', ipam: { type: 'host-local' } }, { type: 'portmap', capabilities: { portMappings: true } }] }, null, 2) + '\n';
const logger = pino({ level: 'silent' });
// two different executables from coreutils (not shell builtins)
const SLEEP = execFileSync('which', ['sleep']).toString().trim();
const TRUE = execFileSync('which', ['true']).toString().trim();

let dir: string;
let conf: string;
let bin: string;
let source: string;
const stops: (() => void)[] = [];

beforeEach(() => {
  dir = mkdtempSync(path.join(tmpdir(), 'meshcap-install-cni-'));
  conf = path.join(dir, 'net.d');
  bin = path.join(dir, 'bin');
  mkdirSync(conf);
  mkdirSync(bin);
  source = path.join(dir, 'src-meshcap-cni');
  copyFileSync(SLEEP, source); // any executable: the bytes are what is compared
});
afterEach(() => {
  for (const s of stops.splice(0)) s();
  rmSync(dir, { recursive: true, force: true });
});

const chainOk = () => checkChain(readConfDir(conf), entry).ok;
async function until(cond: () => boolean, ms = 3000): Promise<number> {
  const t0 = performance.now();
  while (!cond()) {
    if (performance.now() - t0 > ms) throw new Error(`not within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 5));
  }
  return performance.now() - t0;
}
function installer(extra: Partial<ConstructorParameters<typeof CniInstaller>[0]> = {}) {
  const counts = { reinsert: 0, restore: 0 };
  const i = new CniInstaller({
    confDir: conf, binDirs: [bin], entry, source, logger,
    onReinsert: () => counts.reinsert++, onBinaryRestore: () => counts.restore++, ...extra,
  });
  stops.push(() => i.stop());
  return { i, counts };
}

describe('CniInstaller in temp dirs', () => {
  it('waits for a primary config, then chains itself in as soon as one appears (watch, not the resync)', async () => {
    const { i } = installer({ resyncMs: 60_000 });
    const first = i.start();
    expect(first.chain.ok).toBe(false);
    expect(i.notReady()).toMatch(/no loadable CNI network config/);
    expect(readFileSync(path.join(bin, 'meshcap-cni'))).toEqual(readFileSync(source));
    writeFileSync(path.join(conf, '10-bridge.conflist'), bridgeList);
    const ms = await until(chainOk, 1000);
    expect(ms).toBeLessThan(1000);
    await until(() => i.notReady() === undefined, 1000);
  });

  it('re-inserts within 1 s after the primary CNI rewrites its file in place or replaces it by rename, and counts it', async () => {
    writeFileSync(path.join(conf, '10-bridge.conflist'), bridgeList);
    const { i, counts } = installer({ resyncMs: 60_000 });
    expect(i.start().chain.ok).toBe(true);
    expect(counts.reinsert).toBe(0);
    const times: number[] = [];
    // in place (truncate + write, as a naive primary CNI does)
    writeFileSync(path.join(conf, '10-bridge.conflist'), bridgeList);
    times.push(await until(chainOk, 1000));
    // temp file + rename over it (flannel, calico, cilium)
    writeFileSync(path.join(conf, '.tmp-write'), bridgeList);
    renameSync(path.join(conf, '.tmp-write'), path.join(conf, '10-bridge.conflist'));
    times.push(await until(chainOk, 1000));
    // removed, then written again later
    unlinkSync(path.join(conf, '10-bridge.conflist'));
    await new Promise((r) => setTimeout(r, 100));
    writeFileSync(path.join(conf, '10-bridge.conflist'), bridgeList);
    times.push(await until(chainOk, 1000));
    await until(() => counts.reinsert === 3, 1000);
    for (const t of times) expect(t).toBeLessThan(1000);
    console.log(`re-insert after rewrite / rename / remove+write: ${times.map((t) => t.toFixed(0)).join(' / ')} ms`);
    // a new file sorting first takes over: meshcap follows it
    writeFileSync(path.join(conf, '05-other.conflist'), bridgeList.replace('k8s-pod-network', 'other'));
    await until(chainOk, 1000);
    expect(JSON.parse(readFileSync(path.join(conf, '05-other.conflist'), 'utf8')).plugins.at(-1)).toEqual(entry);
  });

  it('converts a .conf primary into a .conflist and keeps it chained when the .conf comes back', async () => {
    const c = JSON.stringify({ cniVersion: '0.4.0', name: 'mynet', type: 'bridge', bridge: 'cni0' });
    writeFileSync(path.join(conf, '10-mynet.conf'), c);
    const { i } = installer({ resyncMs: 60_000 });
    expect(i.start().wrote).toBe('converted');
    expect(readdir()).toEqual(['10-mynet.conflist']);
    writeFileSync(path.join(conf, '10-mynet.conf'), c);
    await until(() => chainOk() && readdir().length === 1, 1000);
    expect(readdir()).toEqual(['10-mynet.conflist']);
  });

  it('with --conf-file naming a .conf, follows it to the .conflist it becomes', () => {
    writeFileSync(path.join(conf, '05-first.conflist'), bridgeList);
    writeFileSync(path.join(conf, '50-mine.conf'), JSON.stringify({ cniVersion: '0.4.0', name: 'mine', type: 'ptp' }));
    const { i } = installer({ confFile: '50-mine.conf' });
    expect(i.sync()).toMatchObject({ wrote: 'converted', chain: { ok: true, file: '50-mine.conflist' } });
    expect(i.sync()).toMatchObject({ chain: { ok: true } });
    expect(i.sync().wrote).toBeUndefined();
    // the runtime's own first file is untouched
    expect(readFileSync(path.join(conf, '05-first.conflist'), 'utf8')).toBe(bridgeList);
  });

  it('restores the binary within 1 s when it is removed or overwritten', async () => {
    writeFileSync(path.join(conf, '10-bridge.conflist'), bridgeList);
    const { i, counts } = installer({ resyncMs: 60_000 });
    i.start();
    const target = path.join(bin, 'meshcap-cni');
    unlinkSync(target);
    expect(await until(() => existsSync(target), 1000)).toBeLessThan(1000);
    copyFileSync(TRUE, target);
    await until(() => readFileSync(target).equals(readFileSync(source)), 1000);
    await until(() => counts.restore === 2, 1000);
  });

  it('replaces the binary while the old one runs (rename: no ETXTBSY); writing into it in place would fail', async () => {
    const target = path.join(bin, 'meshcap-cni');
    // the "runtime" executes the installed binary (a long-running one here)
    copyFileSync(SLEEP, target);
    const child = spawn(target, ['5'], { stdio: 'ignore' });
    stops.push(() => child.kill('SIGKILL'));
    await new Promise((r) => child.once('spawn', r));
    // the naive way: open for writing -> ETXTBSY
    expect(() => closeSync(openSync(target, 'r+'))).toThrow(/ETXTBSY/);
    const newer = path.join(dir, 'newer');
    copyFileSync(TRUE, newer);
    expect(placeBinary(newer, target)).toBe(true);
    expect(readFileSync(target).equals(readFileSync(TRUE))).toBe(true);
    expect(child.exitCode).toBeNull(); // still running, on the old inode
    expect(placeBinary(newer, target)).toBe(false); // same bytes: nothing written
    // no temp file left behind
    expect(readdirBin()).toEqual(['meshcap-cni']);
  });

  it('uninstall removes the entry (the rest of the file as the primary CNI wrote it) and the binary', () => {
    writeFileSync(path.join(conf, '10-bridge.conflist'), bridgeList);
    const { i } = installer();
    i.sync();
    i.stop();
    const r = uninstallCni({ confDir: conf, binDirs: [bin], logger });
    expect(r.files).toEqual([path.join(conf, '10-bridge.conflist')]);
    expect(readFileSync(path.join(conf, '10-bridge.conflist'), 'utf8')).toBe(bridgeList);
    expect(existsSync(path.join(bin, 'meshcap-cni'))).toBe(false);
    expect(uninstallCni({ confDir: conf, binDirs: [bin], logger })).toEqual({ files: [], binaries: [] });
  });
});

describe('runInstallCni: /readyz and SIGTERM', () => {
  it('is ready only while the entry is in the active config; without a DaemonSet check it leaves everything on SIGTERM', async () => {
    let term!: (s: string) => void;
    const signal = new Promise<string>((r) => (term = r));
    const done = runInstallCni({ confDir: conf, binDirs: [bin], entry, source, logger, metricsAddr: '127.0.0.1:0' }, signal);
    // find the port: the endpoint logs nothing, so poll the file system and ask the OS
    await until(() => existsSync(path.join(bin, 'meshcap-cni')));
    const port = await listeningPort();
    const get = async (p: string) => {
      const r = await fetch(`http://127.0.0.1:${port}${p}`);
      return { code: r.status, body: await r.text() };
    };
    expect((await get('/readyz')).code).toBe(503);
    writeFileSync(path.join(conf, '10-bridge.conflist'), bridgeList);
    await until(chainOk);
    for (let n = 0; (await get('/readyz')).code !== 200; n++) {
      if (n > 100) throw new Error('never ready');
      await new Promise((r) => setTimeout(r, 10));
    }
    writeFileSync(path.join(conf, '10-bridge.conflist'), bridgeList);
    await until(chainOk);
    const metrics = (await get('/metrics')).body;
    expect(metrics).toMatch(/meshcap_cni_config_reinsertions_total\{action="inserted"\} 1/);
    expect(metrics).toMatch(/meshcap_cni_config_installed 1/);
    term('SIGTERM');
    const r = await done;
    expect(r.removed).toBe(false);
    expect(chainOk()).toBe(true);
    expect(existsSync(path.join(bin, 'meshcap-cni'))).toBe(true);
  });
});

function readdir(): string[] {
  return readConfDir(conf).map((f) => f.name).sort();
}
function readdirBin(): string[] {
  return execFileSync('ls', ['-A', bin]).toString().trim().split('\n').filter(Boolean);
}
/** The one TCP port this process listens on at 127.0.0.1 (from /proc/net/tcp and our own socket inodes). */
async function listeningPort(): Promise<number> {
  const { readdirSync, readlinkSync } = await import('node:fs');
  const inodes = new Set<string>();
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/self/fd/${fd}`));
      if (m) inodes.add(m[1]!);
    } catch { /* closed meanwhile */ }
  }
  for (const line of readFileSync('/proc/net/tcp', 'utf8').split('\n').slice(1)) {
    const f = line.trim().split(/\s+/);
    if (f[3] === '0A' && f[1]?.startsWith('0100007F:') && inodes.has(f[9]!)) return parseInt(f[1].split(':')[1]!, 16);
  }
  throw new Error('no listening socket found');
}
