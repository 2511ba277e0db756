#!/usr/bin/env node
// Build everything meshcap ships, incrementally: vmlinux.h (bpftool), the BPF
// objects (make + clang), the N-API addon and the static CNI forwarder
// (cmake-js), the TypeScript (tsc --incremental). Each step is a no-op when
// its inputs did not change, so a second `npm run setup` takes seconds.
import { execa } from 'execa';
import { existsSync, mkdirSync, statSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import path from 'node:path';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const build = path.join(root, 'build');
mkdirSync(build, { recursive: true });
const run = (cmd, args, opts = {}) => execa(cmd, args, { cwd: root, stdio: 'inherit', ...opts });

// 1. vmlinux.h: the CO-RE type source. Generated from this machine's kernel
//    BTF once; CO-RE relocations adapt the objects to the kernel they load on.
const vmlinux = path.join(build, 'vmlinux.h');
if (!existsSync(vmlinux)) {
  const btf = '/sys/kernel/btf/vmlinux';
  if (!existsSync(btf)) throw new Error(`build: ${btf} is missing: this kernel has no BTF, cannot generate vmlinux.h`);
  const { stdout } = await execa('bpftool', ['btf', 'dump', 'file', btf, 'format', 'c'], { maxBuffer: 256 << 20 });
  const { writeFileSync } = await import('node:fs');
  writeFileSync(vmlinux + '.tmp', stdout);
  await execa('mv', [vmlinux + '.tmp', vmlinux]);
  console.log(`build: generated ${path.relative(root, vmlinux)} (${(statSync(vmlinux).size >> 10)} KiB)`);
}

// 2. BPF objects.
await run('make', ['-s', '-C', 'bpf', `OUT=${path.join(build, 'bpf')}`, `VMLINUX=${vmlinux}`]);

// 2a. What `meshcap version` and `meshcap-cni` report: the package version and
//     the commit this tree is at (none without git), in build/build-info.json.
const { readFileSync, writeFileSync } = await import('node:fs');
const pkgVersion = JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8')).version;
// An image build has no .git in its context: scripts/build-images.sh passes
// the commit and dirty flag as MESHCAP_BUILD_COMMIT / MESHCAP_BUILD_DIRTY=1.
const given = /^[0-9a-f]{40}$/.test(process.env.MESHCAP_BUILD_COMMIT ?? '') ? process.env.MESHCAP_BUILD_COMMIT : null;
const head = given ? { exitCode: 0, stdout: given } : await execa('git', ['rev-parse', 'HEAD'], { cwd: root, reject: false });
const commit = head.exitCode === 0 ? head.stdout.trim() : null;
const dirty = commit !== null && (given ? process.env.MESHCAP_BUILD_DIRTY === '1' :
  (await execa('git', ['status', '--porcelain', '--untracked-files=no'], { cwd: root, reject: false })).stdout.trim() !== '');
const buildInfo = JSON.stringify({ version: pkgVersion, commit, dirty }) + '\n';
const writeIfChanged = (file, text) => {
  if (!existsSync(file) || readFileSync(file, 'utf8') !== text) {
    mkdirSync(path.dirname(file), { recursive: true });
    writeFileSync(file, text);
  }
};
writeIfChanged(path.join(build, 'build-info.json'), buildInfo);
// the same for the C forwarder (native/cni/src/main.c includes it when present)
writeIfChanged(path.join(build, 'include', 'meshcap_build_info.h'),
  `#define MESHCAP_VERSION ${JSON.stringify(pkgVersion)}\n#define MESHCAP_COMMIT ${JSON.stringify(commit ? commit.slice(0, 12) + (dirty ? '-dirty' : '') : 'unknown')}\n`);

// 3. Native: addon + CNI forwarder. cmake-js uses node-api-headers (package.json
//    "binary.napi_versions"), so nothing is downloaded.
await run(path.join(root, 'node_modules/.bin/cmake-js'), ['compile', '--log-level', 'error',
  '-d', 'native', '-O', path.join(build, 'native')], { stdio: ['ignore', 'ignore', 'inherit'] });

// 4. Test tools: mc-order-check, the byte-order checker of the splice
//    regression test (test/privileged/datapath/byte-order.test.ts).
for (const t of ['mc-order-check']) {
  const src = path.join(root, 'bench/datapath', `${t}.c`);
  const out = path.join(build, 'bin', t);
  if (existsSync(out) && statSync(out).mtimeMs >= statSync(src).mtimeMs) continue;
  mkdirSync(path.dirname(out), { recursive: true });
  await run('cc', ['-O2', '-Wall', '-Wextra', '-Werror', '-pthread', '-o', out, src]);
}

// 5. client-node's KubeConfig and Watch without its generated API: the agent
//    and install-cni load this bundle (src/kube/client-node-entry.mjs says why).
//    The generated modules (dist/gen/) only declare classes, so any the bundle
//    does not use are dropped; without that rolldown keeps every model class.
//    whatwg-url is replaced by src/kube/whatwg-url-shim.mjs.
const kubeBundle = path.join(build, 'kube', 'client-node.mjs');
const kubeEntry = path.join(root, 'src/kube/client-node-entry.mjs');
const urlShim = path.join(root, 'src/kube/whatwg-url-shim.mjs');
const kubeInputs = [kubeEntry, urlShim, path.join(root, 'package-lock.json'), fileURLToPath(import.meta.url)];
if (!existsSync(kubeBundle) || kubeInputs.some((f) => statSync(f).mtimeMs > statSync(kubeBundle).mtimeMs)) {
  const { build: bundle } = await import('rolldown');
  const generated = /[\\/]@kubernetes[\\/]client-node[\\/]dist[\\/]gen[\\/]/;
  await bundle({
    input: kubeEntry,
    platform: 'node',
    logLevel: 'warn',
    treeshake: { moduleSideEffects: (id) => !generated.test(id) },
    // node-fetch's fallback URL implementation, never used on Node (the shim says why)
    resolve: { alias: { 'whatwg-url': urlShim } },
    output: { file: kubeBundle + '.tmp', format: 'esm' },
  });
  await execa('mv', [kubeBundle + '.tmp', kubeBundle]);
  console.log(`build: bundled ${path.relative(root, kubeBundle)} (${statSync(kubeBundle).size >> 10} KiB)`);
}

// 6. TypeScript.
await run(path.join(root, 'node_modules/.bin/tsc'), ['-p', 'tsconfig.json']);
console.log('build: ok');
