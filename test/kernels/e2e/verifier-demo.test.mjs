// End to end through run.mjs: boots 5.10 and 6.1, runs the guest smoke check
// and loads a program that needs a 5.11 helper. 5.10's verifier rejects it,
// and that must come out as 5.10's failure carrying the verifier's message,
// while 6.1 passes and the run exits 1. Needs root and qemu-system-x86
// (fails, never skips, without them).
import { execa } from 'execa';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const runner = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'run.mjs');

describe('kernel matrix runner in real VMs', () => {
  it('reports a verifier rejection as that kernel\'s failure, with the verifier message', async () => {
    const r = await execa('node', [runner, '--kernels', '5.10,6.1', '--smoke', '--verifier-demo', '--accel', 'tcg'],
      { reject: false, timeout: 850_000 });
    const lines = r.stdout.split('\n');
    const line510 = lines.find((l) => l.startsWith('kernel 5.10'));
    const line61 = lines.find((l) => l.startsWith('kernel 6.1 '));
    expect(line510, r.stdout + r.stderr).toMatch(/release 5\.10\.\d+-\d+-amd64 .*\| FAIL$/);
    expect(line61, r.stdout + r.stderr).toMatch(/release 6\.1\.\d+-\d+-amd64 .*\| PASS$/);
    // The 5.10 failure block holds the verifier's own words, and only 5.10's does.
    const block510 = lines.slice(lines.indexOf(line510), lines.indexOf(line61)).join('\n');
    expect(block510).toContain('verifier-demo: exit');
    expect(block510).toMatch(/invalid func unknown#160/);
    expect(lines.slice(lines.indexOf(line61)).join('\n')).not.toMatch(/unknown#160/);
    expect(lines).toContain('kernels: 1 passed, 1 failed');
    expect(r.exitCode).toBe(1);
  }, 900_000);
});
