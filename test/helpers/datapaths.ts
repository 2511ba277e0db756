// The same traffic tests run against both datapaths: a tiny per-mode driver
// with the operations the tests need (register, unregister, check, leftovers).
import { execa } from 'execa';
import { EbpfPods } from '../../src/maps/ebpf-pods.js';
import { loadDatapath, uninstallDatapath } from '../../src/loader/datapath.js';
import { applyCapture, checkCapture, configureRoutes, removeCapture } from '../../src/fallback-iptables/apply.js';
import type { CaptureConfig } from '../../src/redirect/config.js';
import { testPinRoot } from './lab.js';

export type TestMode = 'ebpf' | 'iptables';
export const MODES: TestMode[] = ['ebpf', 'iptables'];

export interface Driver {
  mode: TestMode;
  register(netnsPath: string, cfg: CaptureConfig, podIPs: string[]): Promise<void>;
  unregister(netnsPath: string): Promise<void>;
  check(netnsPath: string, cfg: CaptureConfig, podIPs: string[]): Promise<string[]>;
  /** state the pod still has in the datapath (0 after unregister) */
  leftovers(netnsPath: string): Promise<number>;
  /** eBPF counters; null in iptables mode */
  ebpf: EbpfPods | null;
  close(): Promise<void>;
}

export async function makeDriver(mode: TestMode): Promise<Driver> {
  if (mode === 'ebpf') {
    const pinRoot = testPinRoot();
    await loadDatapath({ pinRoot });
    const pods = new EbpfPods(pinRoot);
    const cookies = new Map<string, bigint>();
    const cookie = async (p: string) => cookies.get(p) ?? (await EbpfPods.netnsCookie(p));
    return {
      mode,
      ebpf: pods,
      async register(p, cfg, ips) {
        cookies.set(p, (await pods.register(p, cfg, ips)).netns);
      },
      async unregister(p) {
        pods.unregister(await cookie(p));
      },
      async check(p, cfg, ips) {
        return pods.check(await cookie(p), cfg, ips);
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
