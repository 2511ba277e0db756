import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { IptablesBackend } from '../../../src/pod-datapath/iptables.js';
import { PodDatapath } from '../../../src/pod-datapath/pod-datapath.js';
import { netnsProblem, netnsState } from '../../../src/pod-netns.js';
import { istioCapture } from '../../helpers/pods.js';

const silent = pino({ level: 'silent' });

describe('PodDatapath', () => {
  it('picks the backend by mode, in one place; eBPF only where the node loaded it', async () => {
    const dp = new PodDatapath(null, silent);
    expect(dp.backend('iptables')).toBeInstanceOf(IptablesBackend);
    expect(dp.backend('iptables').mode).toBe('iptables');
    expect(() => dp.backend('ebpf')).toThrow(/eBPF datapath is not loaded on this node/);
    const t = { mode: 'ebpf' as const, netns: '/nonexistent/netns', config: istioCapture(), podIPs: [] };
    await expect(dp.register(t)).rejects.toThrow(/not loaded/);
  });

  it('reports a record whose netns is gone, in either backend, without touching it', async () => {
    const dp = new PodDatapath(null, silent);
    const t = { mode: 'iptables' as const, netns: '/nonexistent/netns', config: istioCapture(), podIPs: [] };
    expect(await dp.check(t, 1n)).toEqual(['network namespace /nonexistent/netns does not exist']);
    expect(await dp.unregister(t, 1n)).toBe('netns-gone');
  });
});

describe('pod-netns', () => {
  it('calls a missing or empty path gone', async () => {
    expect(await netnsState('', null)).toBe('gone');
    expect(await netnsState('/nonexistent/netns', 5n)).toBe('gone');
    expect(await netnsProblem('/nonexistent/netns', null)).toBe('network namespace /nonexistent/netns does not exist');
  });
});
