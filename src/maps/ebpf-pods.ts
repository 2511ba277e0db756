// TEMPORARY, for one caller: test/privileged/datapath/splice-order.test.ts
// (open in another change) still imports EbpfPods from here. A pod in eBPF
// mode is src/pod-datapath/ebpf.ts (EbpfBackend); delete this file once that
// test imports it from there. Nothing in src/ uses it.
import { EbpfBackend } from '../pod-datapath/ebpf.js';
import type { CaptureConfig } from '../redirect/config.js';

/** @deprecated use EbpfBackend (src/pod-datapath/ebpf.ts). */
export class EbpfPods {
  private readonly backend: EbpfBackend;

  constructor(pinRoot: string) {
    this.backend = new EbpfBackend(pinRoot);
  }

  async register(netnsPath: string, cfg: CaptureConfig, podIPs: string[]): Promise<{ netns: bigint }> {
    return { netns: await this.backend.register({ netns: netnsPath, config: cfg, podIPs }) };
  }

  close(): void {
    this.backend.close();
  }
}
