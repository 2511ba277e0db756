// The kernel probe that picks the node's mode, through a storm of signals.
// The verifier gives up with EAGAIN on a pending signal and libbpf's probes
// read that as "no", so before the addon held signals for its loads
// (native/addon/src/common.h, SignalsHeld) a signal at the wrong moment could
// send an eBPF-capable node to iptables mode.
import { describe, expect, it } from 'vitest';
import { probeKernel } from '../../../src/loader/probe.js';
import { signalStorm } from '../../helpers/signal-storm.js';

describe('probeKernel through a storm of signals', () => {
  it('finds what it finds without one, and picks the same mode', async () => {
    const calm = await probeKernel('auto');
    // Ten probes: with the loads unheld, 2 of 5 picked iptables mode here
    // (prog_type.cgroup_sock_addr, link.cgroup_udp4_recvmsg "missing") and
    // about 1 trial load in 10 failed.
    const storm = await signalStorm();
    const stormy: Awaited<ReturnType<typeof probeKernel>>[] = [];
    let sent = 0;
    try {
      for (let i = 0; i < 10; i++) stormy.push(await probeKernel('auto'));
    } finally {
      sent = await storm.stop();
    }
    const missing = (r: Awaited<ReturnType<typeof probeKernel>>) => Object.entries(r.features).filter(([, f]) => !f.ok).map(([n]) => n);
    for (const r of stormy) {
      expect(missing(r)).toEqual(missing(calm));
      expect(r.features).toEqual(calm.features);
      expect(r.mode).toBe(calm.mode);
    }
    expect(sent, 'the storm ran through the probes').toBeGreaterThan(10_000);
  });
});
