// `meshcap version`: this CLI, libbpf, Node.js, and (unless --client) the agent.
import { readFileSync } from 'node:fs';
import { Command } from 'commander';
import { describe, expect, it, vi } from 'vitest';
import { configureExits, runCli } from '../../../src/cli/exit.js';
import { registerVersionCommand } from '../../../src/cli/version-command.js';
import { formatVersion, meshcapVersion } from '../../../src/version.js';

const pkg = JSON.parse(readFileSync(new URL('../../../package.json', import.meta.url), 'utf8')) as { version: string };

async function run(argv: string[]): Promise<{ out: string; code: number }> {
  let out = '';
  const log = vi.spyOn(console, 'log').mockImplementation((s: string) => { out += `${s}\n`; });
  try {
    const program = configureExits(new Command('meshcap'));
    registerVersionCommand(program);
    const code = await runCli(program, ['node', 'meshcap', ...argv], { err: () => {} });
    return { out, code };
  } finally {
    log.mockRestore();
  }
}

describe('meshcap version', () => {
  it('reports the package version, the build commit when known, libbpf and node', async () => {
    const r = await run(['version', '--json', '--client']);
    expect(r.code).toBe(0);
    const j = JSON.parse(r.out) as { meshcap: { version: string; commit: string | null }; libbpf: string; node: string; agent?: unknown };
    expect(j.meshcap.version).toBe(pkg.version);
    expect(j.meshcap.commit === null || /^[0-9a-f]{40}$/.test(j.meshcap.commit)).toBe(true);
    expect(j.libbpf).toMatch(/^v\d+\.\d+|unavailable/);
    expect(j.node).toBe(process.version);
    expect(j.agent).toBeUndefined();
  });

  it('says when the agent cannot be asked, and still exits 0', async () => {
    const r = await run(['version', '--socket', '/nonexistent/cni.sock']);
    expect(r.code).toBe(0);
    expect(r.out).toMatch(new RegExp(`^meshcap ${pkg.version.replace(/\./g, '\\.')}`));
    expect(r.out).toMatch(/\nnode    v\d+/);
    expect(r.out).toMatch(/\nagent   not reachable at \/nonexistent\/cni.sock: no socket there/);
  });

  it('formats a commit short, with dirty when the tree was', () => {
    expect(formatVersion({ version: '1.2.3', commit: null })).toBe('1.2.3');
    expect(formatVersion({ version: '1.2.3', commit: 'a'.repeat(40), dirty: true })).toBe(`1.2.3 (commit ${'a'.repeat(12)}, dirty)`);
    expect(meshcapVersion().version).toBe(pkg.version);
  });
});
