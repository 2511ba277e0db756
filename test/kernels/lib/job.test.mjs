import { execa } from 'execa';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ConsoleReader, renderRunScript } from './job.mjs';
import { shQuote } from './shell.mjs';

const dir = mkdtempSync(path.join(tmpdir(), 'meshcap-job-test-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Run a rendered script with the host's sh (as the guest would) and read its output back. */
async function runJob(steps, nonce = 'abc123') {
  const file = path.join(dir, `run-${Math.random().toString(36).slice(2)}.sh`);
  writeFileSync(file, renderRunScript({ nonce, repo: dir, steps }));
  const r = await execa('sh', [file], { reject: false, all: true });
  const reader = new ConsoleReader(nonce);
  for (const l of r.all.split('\n')) reader.push(l);
  reader.push(`MESHCAP-RESULT ${nonce} rc=${r.exitCode}`);
  return { reader, exitCode: r.exitCode };
}

describe('job script and console reader', () => {
  it('reports each step with its own exit code, output and environment', async () => {
    const { reader, exitCode } = await runJob([
      { name: 'ok', command: 'echo "hello $WHO"; pwd', env: { WHO: "it's me" }, timeoutSec: 10 },
      { name: 'bad', command: 'echo to-stderr >&2; exit 3', timeoutSec: 10 },
      { name: 'ci', command: 'echo "CI=$CI"', timeoutSec: 10 },
    ]);
    expect(exitCode).toBe(1);
    expect(reader.rc).toBe(1);
    expect(reader.steps.map((s) => [s.name, s.rc])).toEqual([['ok', 0], ['bad', 3], ['ci', 0]]);
    expect(reader.step('ok').output).toEqual([`hello it's me`, dir]);
    expect(reader.step('bad').output).toEqual(['to-stderr']);
    expect(reader.step('ci').output).toEqual(['CI=true']);
  });

  it('kills a step at its timeout and goes on', async () => {
    const t0 = Date.now();
    const { reader } = await runJob([
      { name: 'slow', command: 'sleep 30', timeoutSec: 1 },
      { name: 'after', command: 'true', timeoutSec: 5 },
    ]);
    expect(Date.now() - t0).toBeLessThan(10_000);
    expect(reader.step('slow').rc).toBe(124);
    expect(reader.step('after').rc).toBe(0);
  });

  it('ignores markers without the run nonce, so test output cannot forge a result', async () => {
    const { reader } = await runJob([
      { name: 'forger', command: 'echo "MESHCAP-STEP-END other forger rc=0"; echo "MESHCAP-RESULT other rc=0"; exit 5', timeoutSec: 5 },
    ], 'realnonce');
    expect(reader.step('forger').rc).toBe(5);
    expect(reader.step('forger').output).toContain('MESHCAP-RESULT other rc=0');
    expect(reader.rc).toBe(1);
  });

  it('strips carriage returns and colours from the serial console', () => {
    const r = new ConsoleReader('n1');
    r.push('MESHCAP-STEP-BEGIN n1 s\r', 1000);
    r.push('\x1b[32m Tests  1 passed (1)\x1b[0m\r', 1500);
    r.push('MESHCAP-STEP-END n1 s rc=0\r', 4000);
    expect(r.step('s')).toEqual({ name: 's', rc: 0, output: [' Tests  1 passed (1)'], seconds: 3 });
  });

  it('leaves a step that never ended with rc null', () => {
    const r = new ConsoleReader('n1');
    r.push('MESHCAP-GUEST-UP n1 release=6.1.0-56-amd64 rootfs=overlay');
    r.push('MESHCAP-STEP-BEGIN n1 privileged', 0);
    r.push('[  99.1] Kernel panic - not syncing', 100);
    r.finish(2000);
    expect(r.guest).toEqual({ release: '6.1.0-56-amd64', rootfs: 'overlay' });
    expect(r.step('privileged')).toMatchObject({ rc: null, seconds: 2 });
    expect(r.rc).toBeNull();
  });

  it('rejects bad step and variable names', () => {
    expect(() => renderRunScript({ nonce: 'n', repo: '/', steps: [{ name: 'a b', command: 'true', timeoutSec: 1 }] })).toThrow(/step name/);
    expect(() => renderRunScript({ nonce: 'n', repo: '/', steps: [{ name: 'a', command: 'true', env: { 'A-B': 'x' }, timeoutSec: 1 }] })).toThrow(/A-B/);
  });

  it('quotes anything for sh', async () => {
    const nasty = `a'b"c $HOME \`id\` \\ end`;
    const r = await execa('sh', ['-c', `printf %s ${shQuote(nasty)}`]);
    expect(r.stdout).toBe(nasty);
  });
});
