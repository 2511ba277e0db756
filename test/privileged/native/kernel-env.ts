// Helpers for the native addon's privileged tests: fixture compilation, a
// temporary cgroup v2 child, a temporary netns, a temporary bpffs directory,
// and a TCP connect made from inside a cgroup. Everything made here has a
// matching remove that tolerates "already gone".
import { execa } from 'execa';
import { afterEach } from 'vitest';
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync, rmdirSync, readFileSync, writeFileSync, existsSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { addNetns, delNetns } from '../../../src/lab/index.js';
import { findCgroup2 } from '../../../src/loader/mounts.js';

const fixtureDir = fileURLToPath(new URL('../../fixtures/bpf/', import.meta.url));

export const uniq = (): string => `meshcap-test-native-${process.pid}-${randomBytes(4).toString('hex')}`;

/** Compiles test/fixtures/bpf/<name>.bpf.c into outDir; returns the object path. */
export async function compileFixture(outDir: string, name: string, defines: string[] = [], outName = name): Promise<string> {
  const out = path.join(outDir, `${outName}.bpf.o`);
  await execa('clang', [
    '-target', 'bpf', '-O2', '-g', '-I/usr/include/x86_64-linux-gnu',
    ...defines.map((d) => `-D${d}`),
    '-c', path.join(fixtureDir, `${name}.bpf.c`), '-o', out,
  ]);
  return out;
}

export function tempDir(): string {
  return mkdtempSync(path.join(os.tmpdir(), 'meshcap-native-'));
}

export function removeDir(dir: string | undefined): void {
  if (dir) rmSync(dir, { recursive: true, force: true });
}

/** A fresh directory on bpffs for pins (removed with removeDir). */
export function tempPinDir(): string {
  const dir = path.join('/sys/fs/bpf', uniq());
  mkdirSync(dir);
  return dir;
}

export function cgroup2Root(): string {
  const root = findCgroup2();
  if (!root) throw new Error('no cgroup v2 mount in /proc/self/mountinfo: these tests need one');
  return root;
}

/** A child cgroup under the cgroup v2 root. */
export function makeCgroup(): string {
  const cg = path.join(cgroup2Root(), uniq());
  mkdirSync(cg);
  return cg;
}

/** Removes a test cgroup; any process still in it is moved to the root first. */
export function removeCgroup(cg: string | undefined): void {
  if (!cg || !existsSync(cg)) return;
  const procs = readFileSync(path.join(cg, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean);
  for (const pid of procs) {
    try {
      writeFileSync(path.join(cgroup2Root(), 'cgroup.procs'), pid);
    } catch {
      /* exited meanwhile */
    }
  }
  rmdirSync(cg);
}

export async function makeNetns(): Promise<{ name: string; path: string }> {
  const name = uniq();
  return { name, path: await addNetns(name, { lo: false }) };
}

export async function removeNetns(name: string | undefined): Promise<void> {
  if (name) await delNetns(name).catch(() => undefined);
}

/** A loopback TCP listener that accepts and closes; call close() when done. */
export async function loopbackListener(): Promise<{ port: number; close: () => Promise<void> }> {
  const server = net.createServer((s) => s.destroy());
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', resolve);
  });
  const port = (server.address() as net.AddressInfo).port;
  return { port, close: () => new Promise<void>((r) => server.close(() => r())) };
}

/**
 * Runs one TCP connect to 127.0.0.1:port from a child process that first
 * moves itself into cgroup cg (so cgroup BPF programs there see it).
 */
export async function connectFromCgroup(cg: string, port: number): Promise<void> {
  const script =
    "const s=require('net').connect(+process.argv[1],'127.0.0.1',()=>{s.destroy();process.exit(0)});" +
    's.on("error",(e)=>{console.error(e.message);process.exit(2)});';
  await execa('sh', ['-c', 'echo $$ > "$1/cgroup.procs" && exec "$2" -e "$3" "$4"', 'sh', cg, process.execPath, script, String(port)], {
    timeout: 10_000,
  });
}

/** u32 little-endian key (host order on x86). */
export const u32 = (n: number): Buffer => {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(n);
  return b;
};
export const u64 = (n: number | bigint): Buffer => {
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(BigInt(n));
  return b;
};

/** A list of undo steps that afterEach runs in reverse, also after a test
 * failed half-way; the first error fails the test once all have run. */
export function cleanupsAfterEach(): (() => void | Promise<void>)[] {
  const cleanups: (() => void | Promise<void>)[] = [];
  afterEach(async () => {
    const errors: unknown[] = [];
    for (const fn of cleanups.splice(0).reverse()) {
      try {
        await fn();
      } catch (e) {
        errors.push(e);
      }
    }
    if (errors.length) throw errors[0];
  });
  return cleanups;
}
