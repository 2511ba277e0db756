// @ts-check
// The VM's initramfs: static busybox, guest/init.sh as /init, the few modules
// needed to reach the host's root over 9p (decompressed, in load order), and
// the job (/job/env, /job/run.sh). Built per run into a temp dir; it is a few
// MB and takes well under a second.
import { execa } from 'execa';
import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadOrder, parseModulesBuiltin, parseModulesDep } from './modules.mjs';
import { shExports } from './shell.mjs';

const INIT = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'guest', 'init.sh');
const BUSYBOX = '/bin/busybox'; // Debian busybox-static: must be static, it runs before any library exists

/** Modules needed before the host root is mounted; everything else loads from the host's cache. */
export const EARLY_MODULES = ['virtio_pci', 'virtio_rng', '9pnet_virtio', '9p'];

/**
 * @param {{ modulesDir: string }} kernel
 * @returns {string[]} paths relative to modulesDir, in insmod order
 */
export function earlyModules(kernel) {
  const dep = parseModulesDep(readFileSync(path.join(kernel.modulesDir, 'modules.dep'), 'utf8'));
  const builtin = parseModulesBuiltin(readFileSync(path.join(kernel.modulesDir, 'modules.builtin'), 'utf8'));
  return loadOrder(dep, builtin, EARLY_MODULES);
}

/**
 * @param {object} o
 * @param {{ modulesDir: string }} o.kernel
 * @param {string} o.workDir   empty scratch dir owned by this run
 * @param {Record<string, string>} o.env  written to /job/env (sourced by /init)
 * @param {string} o.runScript  /job/run.sh, run by /bin/sh inside the chroot
 * @returns {Promise<string>} path of the cpio archive
 */
export async function buildInitramfs({ kernel, workDir, env, runScript }) {
  const root = path.join(workDir, 'initramfs');
  for (const d of ['bin', 'dev', 'lib/modules/early', 'job']) mkdirSync(path.join(root, d), { recursive: true });
  copyFileSync(BUSYBOX, path.join(root, 'bin/busybox'));
  copyFileSync(INIT, path.join(root, 'init'));
  await execa('chmod', ['0755', path.join(root, 'bin/busybox'), path.join(root, 'init')]);
  // The kernel opens /dev/console for /init before anything is mounted.
  await execa('mknod', ['-m', '0600', path.join(root, 'dev/console'), 'c', '5', '1']);

  const order = earlyModules(kernel);
  const names = order.map((rel) => {
    const base = path.basename(rel);
    copyFileSync(path.join(kernel.modulesDir, rel), path.join(root, 'lib/modules/early', base));
    return base;
  });
  writeFileSync(path.join(root, 'lib/modules/early/order'), names.join('\n') + '\n');
  writeFileSync(path.join(root, 'job/env'), shExports(env) + '\n');
  writeFileSync(path.join(root, 'job/run.sh'), runScript);

  const out = path.join(workDir, 'initramfs.cpio');
  await execa('sh', ['-c', `find . -print0 | cpio --null -o -H newc -R 0:0 --quiet > ${JSON.stringify(out)}`], { cwd: root });
  return out;
}
