// `meshcap install-cni --once | --uninstall` through the command line, in
// temp dirs (never the host's CNI dirs): flags become the entry, exit codes
// follow src/cli/exit.ts.
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { Command } from 'commander';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { configureExits, runCli } from '../../../src/cli/exit.js';
import { registerInstallCniCommand } from '../../../src/cli/install-cni-command.js';

let dir: string;
let conf: string;
let bin: string;
let source: string;
const list = JSON.stringify({ cniVersion: '1.0.0', name: 'k8s', plugins: [{ type: 'ptp' }] }, null, 2);

beforeEach(() => {
  dir = mkdtempSync(path.join(tmpdir(), 'meshcap-install-cni-cli-'));
  conf = path.join(dir, 'net.d');
  bin = path.join(dir, 'bin');
  mkdirSync(conf);
  mkdirSync(bin);
  source = path.join(dir, 'meshcap-cni');
  copyFileSync(execFileSync('which', ['true']).toString().trim(), source);
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

async function run(argv: string[]): Promise<{ out: string; err: string; code: number }> {
  let out = '';
  let err = '';
  const w = vi.spyOn(process.stdout, 'write').mockImplementation((s: string | Uint8Array) => { out += String(s); return true; });
  try {
    const program = configureExits(new Command('meshcap'));
    registerInstallCniCommand(program);
    const code = await runCli(program, ['node', 'meshcap', 'install-cni', ...argv], { err: (s) => { err += s; } });
    return { out, err, code };
  } finally {
    w.mockRestore();
  }
}
const base = () => ['--cni-conf-dir', conf, '--cni-bin-dir', bin, '--source', source, '--log-level', 'error'];

describe('meshcap install-cni', () => {
  it('--once chains the entry from the flags and copies the binary; a second run changes nothing', async () => {
    writeFileSync(path.join(conf, '10-k8s.conflist'), list);
    const r = await run([...base(), '--once', '--agent-socket', '/run/x/cni.sock', '--agent-timeout-ms', '3000', '--exclude-namespaces', 'a, b']);
    expect(r.code, r.err).toBe(0);
    expect(r.out).toMatch(/meshcap-cni is last in 10-k8s\.conflist \(inserted\)/);
    const plugins = JSON.parse(readFileSync(path.join(conf, '10-k8s.conflist'), 'utf8')).plugins;
    expect(plugins.at(-1)).toEqual({ type: 'meshcap-cni', agentSocket: '/run/x/cni.sock', agentTimeoutMs: 3000, excludeNamespaces: ['a', 'b'] });
    expect(readFileSync(path.join(bin, 'meshcap-cni')).equals(readFileSync(source))).toBe(true);
    const again = await run([...base(), '--once', '--agent-socket', '/run/x/cni.sock', '--agent-timeout-ms', '3000', '--exclude-namespaces', 'a,b']);
    expect(again.out).toMatch(/already there/);
  });

  it('--once with no config fails (exit 1) and says it waits for the primary CNI', async () => {
    const r = await run([...base(), '--once']);
    expect(r.code).toBe(1);
    expect(r.err).toMatch(/no loadable CNI network config yet/);
  });

  it('--uninstall removes the entry and the binary', async () => {
    writeFileSync(path.join(conf, '10-k8s.conflist'), list);
    await run([...base(), '--once']);
    const r = await run([...base(), '--uninstall']);
    expect(r.code, r.err).toBe(0);
    expect(r.out).toMatch(/removed meshcap-cni from 1 config file/);
    expect(readFileSync(path.join(conf, '10-k8s.conflist'), 'utf8')).toBe(list);
    expect(existsSync(path.join(bin, 'meshcap-cni'))).toBe(false);
  });

  it('usage errors exit 2', async () => {
    expect((await run([...base(), '--once', '--uninstall'])).code).toBe(2);
    expect((await run([...base(), '--once', '--conf-file', '../x.conflist'])).code).toBe(2);
    expect((await run([...base(), '--once', '--agent-timeout-ms', '0'])).code).toBe(2);
    expect((await run([...base(), '--daemonset', 'nope'])).code).toBe(2);
    expect((await run(['--cni-bin-dir', bin])).code).toBe(2);
  });
});
