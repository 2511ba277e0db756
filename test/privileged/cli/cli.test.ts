// The meshcap command as a process (dist/, built by `npm run setup`): what an
// operator sees when stdout goes away, when they press Ctrl-C during a probe,
// and when they run a root-only command as another user.
import { execa } from 'execa';
import { existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { findCgroup2 } from '../../../src/loader/mounts.js';

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
    const deadline = Date.now() + 10_000;
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

  it('probe and status as non-root say that root is needed (exit 1), not EACCES', async () => {
    for (const cmd of ['probe', 'status']) {
      const r = await execa('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', process.execPath, MESHCAP, cmd], { reject: false });
      expect(r.exitCode, cmd).toBe(1);
      expect(r.stderr, cmd).toMatch(new RegExp(`^meshcap: ${cmd} needs root \\(it .*\\); you are uid 65534: run it as root`));
      expect(r.stderr, cmd).not.toMatch(/EACCES/);
    }
  });

  it('status with a file as --state-dir says so (exit 2)', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'meshcap-cli-'));
    try {
      writeFileSync(path.join(dir, 'f'), '');
      const r = await execa(process.execPath, [MESHCAP, 'status', '--state-dir', path.join(dir, 'f')], { reject: false });
      expect(r.exitCode).toBe(2);
      expect(r.stderr).toMatch(/--state-dir .*\/f is not a directory \(it is a file\)/);
      expect(r.stderr).not.toMatch(/ENOTDIR/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
