// @ts-check
// Download one Debian kernel package with a private apt configuration, unpack
// it under build/kernels/<id>/ and make its modules loadable by busybox
// (uncompressed .ko files + a modules.dep/modules.alias written by busybox
// depmod, since the package leaves depmod to its postinst). Cached: a second
// call with the kernel already unpacked touches nothing.
import { execa } from 'execa';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, renameSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';

/**
 * @typedef {object} FetchedKernel
 * @property {string} id
 * @property {string} package   Debian package name, e.g. linux-image-5.10.0-46-amd64
 * @property {string} version   Debian version, e.g. 5.10.262-1
 * @property {string} release   uname -r of the kernel
 * @property {string} dir       root of the unpacked package (absolute)
 * @property {string} vmlinuz   absolute path of the kernel image
 * @property {string} modulesDir absolute path of lib/modules/<release>
 */

// Module trees that a headless VM running network tests never loads; dropping
// them halves the cache and depmod time.
const PRUNE = ['drivers/gpu', 'drivers/media', 'drivers/net/wireless', 'drivers/infiniband', 'drivers/staging',
  'drivers/iio', 'drivers/input', 'drivers/hid', 'drivers/usb', 'drivers/bluetooth', 'drivers/scsi', 'sound',
  'net/bluetooth', 'net/wireless', 'net/mac80211'];

/** apt-get/apt-cache options that point every path at a private directory. */
function aptOptions(aptDir) {
  const o = {
    'Dir::Etc::sourcelist': path.join(aptDir, 'sources.list'),
    'Dir::Etc::sourceparts': path.join(aptDir, 'sources.list.d'),
    'Dir::Etc::preferencesparts': path.join(aptDir, 'preferences.d'),
    'Dir::State::Lists': path.join(aptDir, 'lists'),
    'Dir::Cache': path.join(aptDir, 'cache'),
    'APT::Architecture': 'amd64',
    'Acquire::Languages': 'none',
    // The downloaded .deb lands in a root-owned build dir the _apt user cannot write.
    'APT::Sandbox::User': 'root',
  };
  return Object.entries(o).flatMap(([k, v]) => ['-o', `${k}=${v}`]);
}

/**
 * Make (once) and refresh (when asked or when empty) the private apt lists for
 * a set of sources.
 * @param {string} cacheRoot  build/kernels
 * @param {string[]} sources
 * @param {boolean} refresh
 */
async function privateApt(cacheRoot, sources, refresh) {
  const key = createHash('sha256').update(sources.join('\n')).digest('hex').slice(0, 12);
  const aptDir = path.join(cacheRoot, 'apt', key);
  for (const d of ['sources.list.d', 'preferences.d', 'lists/partial', 'cache/archives/partial', 'debs']) {
    mkdirSync(path.join(aptDir, d), { recursive: true });
  }
  writeFileSync(path.join(aptDir, 'sources.list'), sources.join('\n') + '\n');
  const opts = aptOptions(aptDir);
  const listed = readdirSync(path.join(aptDir, 'lists')).some((f) => f.endsWith('_Packages'));
  if (refresh || !listed) {
    const r = await execa('apt-get', [...opts, '-qq', 'update'], { reject: false });
    if (r.exitCode !== 0) {
      throw new Error(`apt-get update for ${sources.join(' | ')} failed (exit ${r.exitCode}): ${r.stderr.trim()}`);
    }
  }
  return { aptDir, opts };
}

/**
 * The concrete linux-image package a meta package points at, with its version.
 * @param {string[]} opts
 * @param {string} meta
 */
async function resolveImagePackage(opts, meta) {
  const dep = await execa('apt-cache', [...opts, 'depends', meta], { reject: false });
  const m = /Depends:\s*(linux-image-\S+)/.exec(dep.stdout);
  if (dep.exitCode !== 0 || !m) {
    throw new Error(`apt-cache depends ${meta}: no linux-image dependency found (exit ${dep.exitCode}): ${dep.stderr.trim() || dep.stdout.trim()}`);
  }
  const pkg = m[1];
  const pol = await execa('apt-cache', [...opts, 'policy', pkg]);
  const v = /Candidate:\s*(\S+)/.exec(pol.stdout);
  if (!v || v[1] === '(none)') throw new Error(`apt-cache policy ${pkg}: no candidate version`);
  return { pkg, version: v[1] };
}

/** Decompress every .ko.xz/.ko.zst under dir in place (busybox cannot read zstd). */
async function decompressModules(modulesDir) {
  const xz = await execa('find', [modulesDir, '-name', '*.ko.xz', '-exec', 'xz', '-d', '-T1', '{}', '+'], { reject: false });
  const zst = await execa('find', [modulesDir, '-name', '*.ko.zst', '-exec', 'zstd', '-q', '-d', '--rm', '{}', '+'], { reject: false });
  for (const r of [xz, zst]) {
    if (r.exitCode !== 0) throw new Error(`decompressing modules in ${modulesDir} failed: ${r.stderr.trim()}`);
  }
}

/**
 * @param {import('./matrix.mjs').KernelSpec} spec
 * @param {{ cacheRoot: string, refresh?: boolean, log?: (msg: string, data?: object) => void }} o
 * @returns {Promise<FetchedKernel>}
 */
export async function fetchKernel(spec, { cacheRoot, refresh = false, log = () => {} }) {
  const dir = path.join(cacheRoot, spec.id);
  const metaFile = path.join(dir, 'kernel.json');
  if (!refresh && existsSync(metaFile)) {
    /** @type {FetchedKernel} */
    const k = JSON.parse(readFileSync(metaFile, 'utf8'));
    if (existsSync(k.vmlinuz) && existsSync(path.join(k.modulesDir, 'modules.dep'))) return k;
  }

  const { aptDir, opts } = await privateApt(cacheRoot, spec.sources, refresh);
  const { pkg, version } = await resolveImagePackage(opts, spec.metaPackage);
  log('downloading kernel package', { kernel: spec.id, package: pkg, version });
  const debs = path.join(aptDir, 'debs');
  const dl = await execa('apt-get', [...opts, '-qq', 'download', `${pkg}=${version}`], { cwd: debs, reject: false });
  const debFile = readdirSync(debs).find((f) => f.startsWith(`${pkg}_`) && f.endsWith('.deb'));
  if (dl.exitCode !== 0 || !debFile) throw new Error(`apt-get download ${pkg}=${version} failed: ${dl.stderr.trim()}`);

  const tmp = `${dir}.tmp`;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { recursive: true });
  await execa('dpkg-deb', ['-x', path.join(debs, debFile), tmp]);
  const image = readdirSync(path.join(tmp, 'boot')).find((f) => f.startsWith('vmlinuz-'));
  if (!image) throw new Error(`${debFile} has no boot/vmlinuz-*`);
  const release = image.slice('vmlinuz-'.length);
  // Debian 12 packages are merged-/usr or not depending on the release.
  const modBase = existsSync(path.join(tmp, 'lib/modules', release)) ? 'lib/modules' : 'usr/lib/modules';
  const modulesTmp = path.join(tmp, modBase, release);
  for (const p of PRUNE) rmSync(path.join(modulesTmp, 'kernel', p), { recursive: true, force: true });
  rmSync(path.join(tmp, 'usr/share'), { recursive: true, force: true });
  await decompressModules(modulesTmp);
  // busybox depmod only knows <base>/lib/modules; link it when the package uses /usr/lib.
  if (modBase !== 'lib/modules') symlinkSync('usr/lib', path.join(tmp, 'lib'));
  const dm = await execa('busybox', ['depmod', '-b', tmp, release], { reject: false });
  if (dm.exitCode !== 0 || !existsSync(path.join(modulesTmp, 'modules.dep'))) {
    throw new Error(`busybox depmod -b ${tmp} ${release} failed: ${dm.stderr.trim()}`);
  }

  rmSync(dir, { recursive: true, force: true });
  renameSync(tmp, dir);
  /** @type {FetchedKernel} */
  const k = {
    id: spec.id, package: pkg, version, release, dir,
    vmlinuz: path.join(dir, 'boot', image),
    modulesDir: path.join(dir, modBase, release),
  };
  writeFileSync(metaFile, JSON.stringify(k, null, 2) + '\n');
  rmSync(path.join(debs, debFile));
  log('kernel unpacked', { kernel: spec.id, release, dir });
  return k;
}
