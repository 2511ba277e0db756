// The same traffic tests run against both datapaths: a tiny per-mode driver
// with the operations the tests need (register, unregister, check, leftovers).
import os from 'node:os';
import { execa } from 'execa';
import { describe, expect, it } from 'vitest';
import { EbpfBackend } from '../../src/pod-datapath/ebpf.js';
import { netnsCookie } from '../../src/pod-netns.js';
import { loadDatapath, uninstallDatapath } from '../../src/loader/datapath.js';
import { decideMode, ModeRefusedError } from '../../src/loader/mode.js';
import { probeKernel } from '../../src/loader/probe.js';
import { applyCapture, checkCapture, configureRoutes, removeCapture } from '../../src/fallback-iptables/apply.js';
import type { MapSizes } from '../../src/loader/map-sizes.js';
import type { CaptureConfig } from '../../src/redirect/config.js';
import { scaled, testPinRoot } from './lab.js';

export type TestMode = 'ebpf' | 'iptables';
const ALL: TestMode[] = ['ebpf', 'iptables'];

function oneMode(name: string, v: string | undefined): TestMode | undefined {
  if (v === undefined || v === '') return undefined;
  if (v === 'ebpf' || v === 'iptables') return v;
  throw new Error(`${name}='${v}': use ebpf or iptables (or leave it unset)`);
}

/**
 * The datapaths this run tests: both, unless MESHCAP_MODE=ebpf|iptables forces
 * one (the kernel matrix forces iptables on a kernel where the probe picks eBPF).
 */
export function requestedModes(env: NodeJS.ProcessEnv = process.env): TestMode[] {
  const forced = oneMode('MESHCAP_MODE', env.MESHCAP_MODE);
  return forced ? [forced] : [...ALL];
}

/**
 * The mode `meshcap probe` must choose on this kernel. test/kernels/run.mjs sets
 * MESHCAP_EXPECT_MODE from its matrix table; unset means eBPF (the host, and
 * any kernel meshcap claims eBPF mode for). A stated expectation rather than
 * the probe's own answer, so a probe that wrongly refuses eBPF fails the eBPF
 * tests instead of quietly swapping them for the refusal check.
 */
export function expectedMode(env: NodeJS.ProcessEnv = process.env): TestMode {
  return oneMode('MESHCAP_EXPECT_MODE', env.MESHCAP_EXPECT_MODE) ?? 'ebpf';
}

export const MODES: TestMode[] = requestedModes();

/**
 * describe.each over MODES, honouring the kernel: where eBPF mode is expected
 * to be refused, its block holds one test asserting that the probe does refuse
 * it (and why) instead of traffic tests that cannot work there. Nothing is
 * skipped: every requested mode yields tests that can fail.
 */
export function describeModes(title: string, body: (mode: TestMode) => void): void {
  for (const mode of MODES) {
    const name = title.replace('%s', mode);
    if (mode === 'ebpf') describeEbpf(name, () => body(mode));
    else describe(name, () => body(mode));
  }
}

/**
 * describe() for tests of eBPF mode alone (loader, netns cookies): where this
 * kernel is expected to refuse eBPF mode, one test asserting the refusal
 * stands in for them. Not affected by MESHCAP_MODE.
 */
export function describeEbpf(name: string, body: () => void): void {
  if (expectedMode() === 'iptables') {
    describe(name, () => {
      it(`is refused by the probe on this kernel (${os.release()}), with the missing hooks named`, expectEbpfRefused, scaled(120_000));
    });
  } else {
    describe(name, body);
  }
}

/** The probe picks iptables on this kernel and `--mode ebpf` is refused naming what is missing. */
export async function expectEbpfRefused(): Promise<void> {
  const report = await probeKernel('auto');
  const missing = Object.entries(report.features).filter(([, f]) => !f.ok).map(([n]) => n);
  expect(report.mode, `probe on ${report.kernel}: ${report.reasons.join('; ')}`).toBe('iptables');
  expect(missing.length, 'the probe refused eBPF without naming a missing feature').toBeGreaterThan(0);
  let refused: unknown;
  try {
    decideMode({ kernel: report.kernel, features: report.features, requested: 'ebpf' });
  } catch (e) {
    refused = e;
  }
  expect(refused).toBeInstanceOf(ModeRefusedError);
  for (const n of missing) expect((refused as Error).message).toContain(n);
}

export interface Driver {
  mode: TestMode;
  register(netnsPath: string, cfg: CaptureConfig, podIPs: string[]): Promise<void>;
  unregister(netnsPath: string): Promise<void>;
  check(netnsPath: string, cfg: CaptureConfig, podIPs: string[]): Promise<string[]>;
  /** state the pod still has in the datapath (0 after unregister) */
  leftovers(netnsPath: string): Promise<number>;
  /** eBPF counters; null in iptables mode */
  ebpf: EbpfBackend | null;
  close(): Promise<void>;
}

/** opts.mapSizes: eBPF mode's sized maps (src/loader/map-sizes.ts), defaults otherwise. */
export async function makeDriver(mode: TestMode, opts: { mapSizes?: Partial<MapSizes>; objectDir?: string } = {}): Promise<Driver> {
  if (mode === 'ebpf') {
    const pinRoot = testPinRoot();
    await loadDatapath({ pinRoot, mapSizes: opts.mapSizes, objectDir: opts.objectDir });
    const pods = new EbpfBackend(pinRoot);
    const cookies = new Map<string, bigint>();
    const cookie = async (p: string) => cookies.get(p) ?? (await netnsCookie(p));
    return {
      mode,
      ebpf: pods,
      async register(p, cfg, ips) {
        cookies.set(p, await pods.register({ netns: p, config: cfg, podIPs: ips }));
      },
      async unregister(p) {
        pods.remove(await cookie(p));
      },
      async check(p, cfg, ips) {
        return pods.checkEntries(await cookie(p), cfg, ips);
      },
      async leftovers(p) {
        return pods.leftovers(await cookie(p));
      },
      async close() {
        pods.close();
        uninstallDatapath(pinRoot);
      },
    };
  }
  const configs = new Map<string, CaptureConfig>();
  return {
    mode,
    ebpf: null,
    async register(p, cfg) {
      await applyCapture(p, cfg);
      if (cfg.parsed.tproxy) await configureRoutes(p, cfg);
      configs.set(p, cfg);
    },
    async unregister(p) {
      await removeCapture(p, configs.get(p));
      configs.delete(p);
    },
    async check(p, cfg) {
      return (await checkCapture(p, cfg)).differences;
    },
    async leftovers(p) {
      let n = 0;
      for (const bin of ['iptables-save', 'ip6tables-save']) {
        const { stdout } = await execa('nsenter', [`--net=${p}`, bin]);
        n += stdout.split('\n').filter((l) => l.includes('ISTIO_')).length;
      }
      return n;
    },
    async close() {},
  };
}
