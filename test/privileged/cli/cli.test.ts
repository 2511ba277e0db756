// The meshcap command as a process (dist/, built by `npm run setup`): what an
// operator sees when stdout goes away, when they press Ctrl-C during a probe,
// and when they run a root-only command as another user.
import { execa } from 'execa';
import { existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import pino from 'pino';
import { findCgroup2 } from '../../../src/loader/mounts.js';
import { startCniServer } from '../../../src/cni/server.js';
import { meshcapVersion } from '../../../src/version.js';
import { scaled } from '../../helpers/lab.js';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const MESHCAP = path.join(root, 'bin/meshcap');
const manyPorts = Array.from({ length: 10_000 }, (_, i) => 1000 + i).join(',');

describe('meshcap as a process', () => {
  it('| head -1: the first line, exit 0, no stack trace', async () => {
    const r = await execa('bash', ['-c', `set -o pipefail; "${process.execPath}" "${MESHCAP}" iptables render -b ${manyPorts} | head -1`], { reject: false });
    expect(r.stdout).toBe('* nat');
    expect(r.stderr).toBe('');
    expect(r.exitCode).toBe(0);
  });

  it('stdout on /dev/full: one line naming ENOSPC, exit 1', async () => {
    const r = await execa('bash', ['-c', `"${process.execPath}" "${MESHCAP}" iptables render -b ${manyPorts} > /dev/full`], { reject: false });
    expect(r.exitCode).toBe(1);
    expect(r.stderr).toBe('meshcap: cannot write the output to stdout: no space left on device (ENOSPC)');
  });

  it('Ctrl-C during probe removes its netns and cgroup, exit 130', async () => {
    const child = execa(process.execPath, [MESHCAP, 'probe'], { reject: false });
    const name = `meshcap-probe-${child.pid}`;
    const netns = `/var/run/netns/${name}`;
    const deadline = Date.now() + scaled(10_000);
    while (!existsSync(netns) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 2));
    expect(existsSync(netns), 'the probe made its netns').toBe(true);
    child.kill('SIGINT');
    const r = await child;
    expect(r.exitCode).toBe(130);
    expect(r.stderr).toMatch(/SIGINT: removing the probe's netns and cgroup/);
    expect(readdirSync('/var/run/netns').filter((n) => n === name)).toEqual([]);
    const cg = findCgroup2();
    if (cg) expect(existsSync(path.join(cg, name))).toBe(false);
  });

  it('probe as non-root says that root is needed (exit 1), not EACCES', async () => {
    const r = await execa('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', process.execPath, MESHCAP, 'probe'], { reject: false });
    expect(r.exitCode).toBe(1);
    expect(r.stderr).toMatch(/^meshcap: probe needs root \(it .*\); you are uid 65534: run it as root/);
    expect(r.stderr).not.toMatch(/EACCES/);
  });

  it('status as non-root shows what it can and says where root is needed (exit 1), not EACCES or "no pods"', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'meshcap-cli-'));
    try {
      const sockDir = path.join(dir, 'run');
      const server = await startCniServer({ socketPath: path.join(sockDir, 'cni.sock'), handlers: { add: async () => {}, del: async () => {}, check: async () => {}, status: async () => {}, gc: async () => {} }, logger: pino({ level: 'silent' }) });
      try {
        const r = await execa('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', process.execPath, MESHCAP, 'status', '--socket', path.join(sockDir, 'cni.sock')], { reject: false });
        expect(r.exitCode).toBe(1);
        expect(r.stdout).toMatch(/^agent\s+NOT REACHABLE at .*: permission denied \(the socket is root-only\) \(run as root\)/);
        expect(r.stdout).toMatch(/\npods: reading the pods needs root .*run it as root/);
        expect(r.stdout).not.toMatch(/no pods in the datapath|not loaded/);
        expect(r.stderr).toBe('');
      } finally {
        await server.close();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('status shows the agent first: reachable, ready, mode, version, uptime, pod source, then the CNI chain and the pods', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'meshcap-cli-'));
    const socketPath = path.join(dir, 'cni.sock');
    const startedAt = new Date(Date.now() - 125_000).toISOString();
    const server = await startCniServer({
      socketPath, handlers: { add: async () => {}, del: async () => {}, check: async () => {}, status: async () => {}, gc: async () => {} }, logger: pino({ level: 'silent' }),
      identity: () => ({ mode: 'ebpf', startedAt, notReady: null, podSourceSynced: true, pid: 4242 }),
    });
    try {
      const netd = path.join(dir, 'net.d');
      await execa('mkdir', [netd]);
      writeFileSync(path.join(netd, '10-k8s.conflist'), JSON.stringify({ cniVersion: '1.0.0', name: 'k8s', plugins: [{ type: 'bridge' }, { type: 'meshcap-cni' }] }));
      const args = ['status', '--socket', socketPath, '--cni-conf-dir', netd, '--state-dir', path.join(dir, 'state'), '--pin-root', path.join(dir, 'pins')];
      const t0 = Date.now();
      const t = await execa(process.execPath, [MESHCAP, ...args], { reject: false });
      // the agent started 125 s before t0; the command itself may take seconds on a slow guest
      const took = Math.ceil((Date.now() - t0) / 1000);
      expect(t.exitCode, t.stderr).toBe(0);
      const { version } = meshcapVersion();
      expect(t.stdout.split('\n').slice(0, 7).map((l) => l.split(/\s{2,}/))).toEqual([
        ['agent', `reachable at ${socketPath} (pid 4242)`],
        ['ready', 'yes'],
        ['mode', 'ebpf'],
        [expect.stringMatching(/^version/), expect.stringContaining(version)],
        ['uptime', expect.stringMatching(/^\d+m\d\ds$/)],
        ['pod source', 'synced'],
        ['CNI chain', `meshcap-cni is last in ${path.join(netd, '10-k8s.conflist')}`],
      ]);
      const [, m, sec] = /^uptime\s+(\d+)m(\d\d)s$/m.exec(t.stdout)!;
      const up = Number(m) * 60 + Number(sec);
      expect(up).toBeGreaterThanOrEqual(124);
      expect(up).toBeLessThanOrEqual(126 + took);
      expect(t.stdout).toMatch(/no pods in the datapath/);
      const j = JSON.parse((await execa(process.execPath, [MESHCAP, ...args, '-o', 'json'])).stdout) as { agent: { agent: Record<string, unknown>; chain: { ok: boolean } }; pods: unknown[] };
      expect(j.agent.agent).toMatchObject({ reachable: true, mode: 'ebpf', notReady: null, podSourceSynced: true, version });
      expect(j.agent.chain.ok).toBe(true);
      expect(j.pods).toEqual([]);
      const y = await execa(process.execPath, [MESHCAP, ...args, '-o', 'yaml']);
      expect(y.stdout).toMatch(/^agent:\n  socket: /);
      const bad = await execa(process.execPath, [MESHCAP, ...args, '-o', 'xml'], { reject: false });
      expect(bad.exitCode).toBe(2);
    } finally {
      await server.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('status, load and uninstall with a file as --state-dir say so (exit 2)', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'meshcap-cli-'));
    try {
      writeFileSync(path.join(dir, 'f'), '');
      for (const cmd of [['status'], ['load', '--mode', 'iptables'], ['uninstall', '--pin-root', path.join(dir, 'pins')]]) {
        const r = await execa(process.execPath, [MESHCAP, ...cmd, '--state-dir', path.join(dir, 'f')], { reject: false });
        expect(r.exitCode, cmd[0]).toBe(2);
        expect(r.stderr, cmd[0]).toMatch(/--state-dir .*\/f is not a directory \(it is a file\)/);
        expect(r.stderr, cmd[0]).not.toMatch(/ENOTDIR/);
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
