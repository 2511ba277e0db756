// @ts-check
// Boot one kernel + initramfs in qemu with the host's root shared read-only
// over 9p, no network device, the console on stdout. Streams console lines to
// the caller and kills the VM at a hard deadline.
import { execa } from 'execa';
import { existsSync } from 'node:fs';

/**
 * @typedef {object} BootResult
 * @property {number|undefined} exitCode  qemu's exit code (0 after the guest's poweroff)
 * @property {string|undefined} signal    set when qemu was killed (timeout) or crashed (SIGABRT)
 * @property {boolean} timedOut
 * @property {number} seconds
 * @property {string} stderr  qemu's own complaints
 */

/** Kernel command line: serial console, no reboot on panic (qemu exits), quiet unless it matters. */
export const KERNEL_CMDLINE = 'console=ttyS0 panic=-1 oops=panic loglevel=4 random.trust_cpu=on ' +
  'audit=0 mitigations=off tsc=reliable no_timer_check';

/**
 * @param {object} o
 * @param {string} o.vmlinuz
 * @param {string} o.initrd
 * @param {'tcg'|'kvm'} o.accel
 * @param {number} o.timeoutSec   hard deadline for the whole VM
 * @param {(line: string) => void} o.onLine
 * @param {string} [o.memory]
 * @param {number} [o.cpus]
 * @param {'multi'|'single'} [o.tcgThread]  qemu's TCG threading: one host thread per vCPU (multi, the default), or all vCPUs on one
 * @returns {Promise<BootResult>}
 */
export async function bootVm({ vmlinuz, initrd, accel, timeoutSec, onLine, memory = '2G', cpus = 2, tcgThread = 'multi' }) {
  const args = [
    ...(accel === 'kvm' ? ['-accel', 'kvm', '-cpu', 'host'] : ['-accel', `tcg,thread=${tcgThread}`, '-cpu', 'max']),
    '-m', memory, '-smp', String(cpus),
    '-nographic', '-no-reboot', '-nic', 'none',
    '-kernel', vmlinuz, '-initrd', initrd, '-append', KERNEL_CMDLINE,
    // multidevs=remap: / spans several host file systems; keeps inode numbers unique.
    '-fsdev', 'local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap',
    '-device', 'virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot',
    '-device', 'virtio-rng-pci',
  ];
  const t0 = Date.now();
  const vm = execa('qemu-system-x86_64', args, {
    stdin: 'ignore', reject: false, timeout: timeoutSec * 1000, forceKillAfterDelay: 2000,
    stripFinalNewline: false, buffer: { stdout: false, stderr: true }, lines: false,
  });
  // Iterate stdout only; stderr is buffered for the result.
  for await (const line of vm.iterable({ from: 'stdout' })) onLine(String(line));
  const r = await vm;
  return {
    exitCode: r.exitCode,
    signal: r.signal,
    timedOut: Boolean(r.timedOut),
    seconds: (Date.now() - t0) / 1000,
    stderr: String(r.stderr ?? '').trim(),
  };
}

/**
 * Whether KVM really works here: nested KVM exists on these machines but can
 * hang, so boot the real kernel with a job that powers off at once, and only
 * trust KVM if that finishes within the deadline.
 * @param {{ vmlinuz: string, initrd: string, isOk: () => boolean, onLine: (l: string) => void, timeoutSec?: number }} o
 */
export async function kvmWorks({ vmlinuz, initrd, isOk, onLine, timeoutSec = 3 }) {
  if (!existsSync('/dev/kvm')) return { ok: false, why: '/dev/kvm missing' };
  const r = await bootVm({ vmlinuz, initrd, accel: 'kvm', timeoutSec, onLine, memory: '512M', cpus: 1 });
  if (isOk()) return { ok: true, why: `booted in ${r.seconds.toFixed(1)} s` };
  return { ok: false, why: r.timedOut ? `no boot within ${timeoutSec} s` : `qemu ${r.signal ?? `exit ${r.exitCode}`}: ${r.stderr.split('\n')[0]}` };
}
