// The images scripts/build-images.sh writes (docs/images.md), checked the way a
// node gets them: each OCI archive is loaded into a fresh private podman store
// (nothing from the build store is reused) and run with no network and a
// read-only root filesystem. The build is cached: with nothing changed the
// script returns at once; the first build takes minutes (docs/images.md).
import { execa } from 'execa';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const images = path.join(root, 'build/images');
const pkg = JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8')) as {
  version: string;
};
const REF = {
  meshcap: 'localhost/meshcap:dev',
  app: 'localhost/meshcap-app:dev',
  sidecar: 'localhost/meshcap-sidecar:dev',
  pause: 'localhost/pause:3.10.2',
} as const;

let dir = '';
const pm = (args: string[], opts: { timeout?: number } = {}) =>
  execa('podman', ['--root', path.join(dir, 'root'), '--runroot', path.join(dir, 'runroot'), '--storage-driver', 'overlay', ...args], {
    env: { CONTAINERS_CONF: path.join(dir, 'containers.conf'), TMPDIR: path.join(dir, 'tmp') },
    reject: false,
    timeout: opts.timeout ?? 60_000,
  });
/** one container: no network, read-only root, removed afterwards */
const run = (image: string, entrypoint: string, args: string[] = [], extra: string[] = []) =>
  pm(['run', '--rm', '--network', 'none', '--read-only', '--pull=never', ...extra, '--entrypoint', entrypoint, image, ...args]);

beforeAll(async () => {
  const b = await execa('bash', [path.join(root, 'scripts/build-images.sh')], { cwd: root, reject: false, all: true });
  if (b.exitCode !== 0) throw new Error(`scripts/build-images.sh failed (exit ${b.exitCode}):\n${b.all}`);
  dir = mkdtempSync(path.join(tmpdir(), 'meshcap-images-test-'));
  await execa('mkdir', ['-p', ...['root', 'runroot', 'tmp'].map((d) => path.join(dir, d))]);
  writeFileSync(path.join(dir, 'containers.conf'), [
    // podman's default nofile (the host's hard limit) is refused by runc here
    '[containers]', 'default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]',
    '[engine]', 'runtime = "runc"', 'cgroup_manager = "cgroupfs"', 'events_logger = "file"',
    `events_logfile_path = "${dir}/tmp/events.log"`, `tmp_dir = "${dir}/tmp"`, 'lock_type = "file"', '',
  ].join('\n'));
  for (const name of Object.keys(REF) as (keyof typeof REF)[]) {
    const l = await pm(['load', '-i', path.join(images, `${name}.tar`)], { timeout: 300_000 });
    if (l.exitCode !== 0) throw new Error(`podman load -i build/images/${name}.tar: ${l.stderr}`);
    const e = await pm(['image', 'exists', REF[name]]);
    if (e.exitCode !== 0) throw new Error(`build/images/${name}.tar loaded, but it does not name ${REF[name]}: ${(await pm(['images'])).stdout}`);
  }
}, 60 * 60_000);

afterAll(async () => {
  if (!dir) return;
  await pm(['rm', '-a', '-f']);
  await pm(['rmi', '-a', '-f']);
  // overlay mounts of the private store, if podman left any
  const mounts = (await execa('findmnt', ['-rn', '-o', 'TARGET'], { reject: false })).stdout.split('\n').filter((m) => m.startsWith(dir + '/'));
  for (const m of mounts.reverse()) await execa('umount', ['-l', m], { reject: false });
  rmSync(dir, { recursive: true, force: true });
}, 120_000);

describe('meshcap image (deploy/Containerfile)', () => {
  it('meshcap version: the package version, the native addon (libbpf) and Node >= 20', async () => {
    const r = await run(REF.meshcap, '/opt/meshcap/bin/meshcap', ['version', '--client', '--json']);
    expect(r.exitCode, r.stderr).toBe(0);
    const v = JSON.parse(r.stdout) as { meshcap: { version: string }; libbpf: string; node: string };
    expect(v.meshcap.version).toBe(pkg.version);
    expect(v.libbpf).toMatch(/^v1\.\d+$/); // "unavailable (...)" when the addon does not load
    expect(Number(/^v(\d+)\./.exec(v.node)?.[1])).toBeGreaterThanOrEqual(20);
  });

  it('`meshcap` is on PATH and is the entrypoint', async () => {
    const r = await pm(['run', '--rm', '--network', 'none', '--read-only', '--pull=never', REF.meshcap, 'version', '--client']);
    expect(r.exitCode, r.stderr).toBe(0);
    expect(r.stdout).toContain(`meshcap ${pkg.version}`);
    const p = await run(REF.meshcap, 'meshcap', ['--help']);
    expect(p.exitCode, p.stderr).toBe(0);
  });

  it('the native addon loads and answers (netns cookie of its own namespace)', async () => {
    const r = await run(REF.meshcap, 'node', ['--input-type=module', '-e',
      "const a = await import('/opt/meshcap/dist/native/addon.js'); console.log(JSON.stringify({ path: a.addonPath, libbpf: a.libbpfVersion() }))"]);
    expect(r.exitCode, r.stderr).toBe(0);
    const o = JSON.parse(r.stdout) as { path: string; libbpf: string };
    expect(o.path).toBe('/opt/meshcap/build/native/Release/meshcap_native.node');
    expect(o.libbpf).toMatch(/^v1\./);
  });

  it('the agent\'s Kubernetes client loads from its bundle (build/kube/client-node.mjs)', async () => {
    const r = await run(REF.meshcap, 'node', ['--input-type=module', '-e',
      "const k = await import('/opt/meshcap/dist/kube/api-source.js'); const { CLIENT_NODE_BUNDLE } = await import('/opt/meshcap/dist/kube/client-node.js'); console.log(JSON.stringify({ bundle: CLIENT_NODE_BUNDLE, source: typeof k.ApiSource }))"]);
    expect(r.exitCode, r.stderr).toBe(0);
    expect(JSON.parse(r.stdout)).toEqual({ bundle: '/opt/meshcap/build/kube/client-node.mjs', source: 'function' });
  });

  it('every BPF object of bpf/ is in build/bpf', async () => {
    const want = readdirSync(path.join(root, 'bpf')).filter((f) => f.endsWith('.bpf.c')).map((f) => f.replace(/\.c$/, '.o')).sort();
    const r = await run(REF.meshcap, 'ls', ['/opt/meshcap/build/bpf']);
    expect(r.exitCode, r.stderr).toBe(0);
    expect(r.stdout.split('\n').filter(Boolean).sort()).toEqual(want);
    // real ELF BPF objects, not empty files
    const h = await run(REF.meshcap, 'node', ['-e',
      "const fs=require('fs');for(const f of fs.readdirSync('/opt/meshcap/build/bpf')){const b=fs.readFileSync('/opt/meshcap/build/bpf/'+f);if(b.readUInt32BE(0)!==0x7f454c46||b.readUInt16LE(18)!==247)throw new Error(f+' is not an eBPF ELF object')}"]);
    expect(h.exitCode, h.stderr).toBe(0);
  });

  it('its BPF objects, compiled by the image\'s own clang (not the host\'s), pass this kernel\'s verifier', async () => {
    // The image compiles bpf/ with its suite's clang (trixie: 19), the host's
    // suite with the host's (bookworm: 14); clang 19 once turned a branch's
    // ctx stores into a pointer into the ctx the verifier refuses, and only
    // the DaemonSet on a real node saw it (it fell back to iptables mode).
    const out = mkdtempSync(path.join(tmpdir(), 'meshcap-image-bpf-'));
    const pins = `/sys/fs/bpf/meshcap-test-image-${process.pid}`;
    try {
      const c = await run(REF.meshcap, 'sh', ['-c', 'cp /opt/meshcap/build/bpf/*.bpf.o /out/'], ['-v', `${out}:/out`]);
      expect(c.exitCode, c.stderr).toBe(0);
      const objects = readdirSync(out).filter((f) => f.endsWith('.bpf.o')).sort();
      expect(objects.length).toBeGreaterThan(5);
      for (const f of objects) {
        rmSync(pins, { recursive: true, force: true });
        await execa('mkdir', ['-p', pins]);
        const l = await execa('bpftool', ['prog', 'loadall', path.join(out, f), pins], { reject: false });
        expect(l.exitCode, `${f}: ${l.stderr.split('\n').slice(-8).join('\n')}`).toBe(0);
      }
    } finally {
      rmSync(pins, { recursive: true, force: true });
      rmSync(out, { recursive: true, force: true });
    }
  }, 120_000);

  it('meshcap-cni runs: its version without CNI_COMMAND, a CNI error JSON for a bad request', async () => {
    // the version goes to stderr, as the reference plugins print theirs
    const v = await run(REF.meshcap, '/opt/meshcap/build/bin/meshcap-cni');
    expect(v.exitCode, v.stderr).toBe(0);
    expect(v.stderr).toMatch(new RegExp(`^meshcap-cni v${pkg.version.replace(/\./g, '\\.')} `));
    const e = await run(REF.meshcap, '/opt/meshcap/build/bin/meshcap-cni', [], ['-e', 'CNI_COMMAND=ADD']);
    expect(e.exitCode).not.toBe(0);
    const err = JSON.parse(e.stdout) as { code: number; msg: string };
    expect(err.code).toBeGreaterThan(0);
    expect(err.msg).toBeTruthy();
  });

  it('has no compiler and no build tools', async () => {
    const tools = ['cc', 'gcc', 'clang', 'c++', 'g++', 'ld', 'make', 'cmake', 'npm', 'bpftool', 'llvm-strip'];
    const r = await run(REF.meshcap, 'sh', ['-c', `for t in ${tools.join(' ')}; do command -v $t; done; true`]);
    expect(r.exitCode, r.stderr).toBe(0);
    expect(r.stdout.trim(), 'tools found in the runtime image').toBe('');
  });

  it('has no devDependencies (vitest, typescript, cmake-js, ...) and every production package', async () => {
    // the lockfile marks what only devDependencies need (dev: true); @types/node,
    // for one, is also a dependency of @kubernetes/client-node and stays
    const lock = JSON.parse(readFileSync(path.join(root, 'package-lock.json'), 'utf8')) as {
      packages: Record<string, { dev?: boolean; optional?: boolean; devOptional?: boolean }>;
    };
    const entries = Object.entries(lock.packages).filter(([k]) => k.startsWith('node_modules/'));
    const dev = entries.filter(([, v]) => v.dev).map(([k]) => k);
    const prod = entries.filter(([, v]) => !v.dev && !v.optional && !v.devOptional).map(([k]) => k);
    expect(dev).toContain('node_modules/vitest');
    expect(dev).toContain('node_modules/typescript');
    const r = await run(REF.meshcap, 'node', ['-e',
      "const fs=require('fs');const l=JSON.parse(process.argv[1]);console.log(JSON.stringify(l.filter(p=>fs.existsSync('/opt/meshcap/'+p))))",
      JSON.stringify([...dev, ...prod])]);
    expect(r.exitCode, r.stderr).toBe(0);
    const present = new Set(JSON.parse(r.stdout) as string[]);
    expect(dev.filter((p) => present.has(p)), 'devDependency packages in the image').toEqual([]);
    expect(prod.filter((p) => !present.has(p)), 'production packages missing from the image').toEqual([]);
  });

  it('has iptables and ip for the fallback datapath', async () => {
    const r = await run(REF.meshcap, 'sh', ['-c', 'iptables-restore --version && ip -V']);
    expect(r.exitCode, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/iptables-restore v1\.8/);
  });
});

describe('sidecar, app and pause images', () => {
  it('sidecar: meshcap proxy as uid 1337 listens (ready line), HAProxy accepts its config as uid 1337', async () => {
    const id = (await pm(['run', '-d', '--network', 'none', '--read-only', '--pull=never', REF.sidecar])).stdout.trim();
    try {
      let logs = '';
      for (let i = 0; i < 100 && !logs.includes('"event":"ready"'); i++) {
        await new Promise((res) => setTimeout(res, 100));
        logs = (await pm(['logs', id])).stdout;
      }
      expect(logs).toContain('"event":"ready"');
      expect(JSON.parse(logs.split('\n').find((l) => l.includes('"event":"ready"'))!).uid).toBe(1337);
    } finally {
      await pm(['rm', '-f', '-t', '0', id]);
    }
    const h = await run(REF.sidecar, 'sh', ['-c', 'id -u; id -g; haproxy -c -f /etc/meshcap-sidecar/haproxy.cfg']);
    expect(h.exitCode, h.stderr + h.stdout).toBe(0);
    expect(h.stdout.split('\n').slice(0, 2)).toEqual(['1337', '1337']);
  });

  it('app: serves on its port and dials out on request (inside one container, loopback)', async () => {
    const id = (await pm(['run', '-d', '--network', 'none', '--read-only', '--pull=never', REF.app, 'serve', '--port', '8080', '--port', '9090'])).stdout.trim();
    try {
      let d = await pm(['exec', id, '/meshcap-app', 'dial', '127.0.0.1:8080', 'hello']);
      for (let i = 0; i < 50 && d.exitCode !== 0; i++) {
        await new Promise((res) => setTimeout(res, 100));
        d = await pm(['exec', id, '/meshcap-app', 'dial', '127.0.0.1:8080', 'hello']);
      }
      expect(d.exitCode, d.stderr).toBe(0);
      expect(d.stdout).toMatch(/ 127\.0\.0\.1:8080 127\.0\.0\.1:\d+ hello$/);
      const via = await pm(['exec', id, '/meshcap-app', 'dial', '127.0.0.1:8080', 'DIAL 127.0.0.1:9090 onward']);
      expect(via.stdout).toMatch(/^DIALED .* 127\.0\.0\.1:9090 127\.0\.0\.1:\d+ onward$/);
      const s = await pm(['exec', id, '/meshcap-app', 'stream', '127.0.0.1:9090', '--count', '5', '--interval-ms', '0']);
      expect(s.exitCode, s.stdout).toBe(0);
      expect(s.stdout).toContain('{"event":"summary","ok":5,"failed":0}');
    } finally {
      await pm(['rm', '-f', '-t', '0', id]);
    }
  });

  it('pause: the static pause.c of Kubernetes, uid 65535, nothing else in the image', async () => {
    const v = await run(REF.pause, '/pause', ['-v']);
    expect(v.exitCode, v.stderr).toBe(0);
    expect(v.stdout.trim()).toBe('pause.c v3.10.2-v1.37.2');
    const i = await pm(['image', 'inspect', '--format', '{{.Config.User}} {{json .Config.Entrypoint}}', REF.pause]);
    expect(i.stdout.trim()).toBe('65535:65535 ["/pause"]');
  });
});
