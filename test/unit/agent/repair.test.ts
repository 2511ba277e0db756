// Repair's pure parts: which pods run without capture, and how a pod's
// processes are recognised in /proc.
import { describe, expect, it } from 'vitest';
import type { V1Pod } from '@kubernetes/client-node';
import { cgroupNamesPod, containerIdOf, fibTrieHasLocal } from '../../../src/agent/pod-netns-finder.js';
import { uncapturedPods } from '../../../src/agent/repair.js';
import type { AttachmentRecord } from '../../../src/agent/state-store.js';
import { istioPod } from '../../helpers/pods.js';

const UID = '0b5a1c7e-3f2d-4c44-9a0e-5d1f2e3a4b5c';
const running = (o: Parameters<typeof istioPod>[0] & { uid?: string; phase?: string } = {}): V1Pod => {
  const p = istioPod({ ips: ['10.244.1.7'], ...o });
  p.metadata!.uid = o.uid ?? UID;
  p.status!.phase = o.phase ?? 'Running';
  return p;
};
const rec = (name: string, podUid?: string): AttachmentRecord => ({
  version: 1, containerId: 'c', ifname: 'eth0', podNamespace: 'default', podName: name, ...(podUid ? { podUid } : {}),
  netns: '/x', netnsCookie: null, mode: 'ebpf', profile: 'istio', settings: {} as AttachmentRecord['settings'], podIPs: [], createdAt: '',
});

describe('uncapturedPods', () => {
  it('is a meshed, running pod with an IP and no record', () => {
    expect(uncapturedPods([running()], [], ['kube-system']).map((p) => p.metadata!.name)).toEqual(['app']);
  });
  it('skips pods with a record (same name and UID, or no UID on one side)', () => {
    expect(uncapturedPods([running()], [rec('app', UID)], [])).toEqual([]);
    expect(uncapturedPods([running()], [rec('app')], [])).toEqual([]);
  });
  it('counts a record of an earlier pod with the same name (other UID) as no record', () => {
    expect(uncapturedPods([running()], [rec('app', 'another-uid')], [])).toHaveLength(1);
  });
  it('looks at every record of a name (an earlier pod\'s and this one\'s), and only in the pod\'s namespace', () => {
    expect(uncapturedPods([running()], [rec('app', 'another-uid'), rec('app', UID)], [])).toEqual([]);
    expect(uncapturedPods([running()], [rec('app', 'another-uid'), rec('app', 'a-third-uid')], [])).toHaveLength(1);
    expect(uncapturedPods([running()], [rec('app', 'another-uid'), rec('app')], [])).toEqual([]);
    expect(uncapturedPods([running()], [{ ...rec('app', UID), podNamespace: 'elsewhere' }], [])).toHaveLength(1);
  });
  it('skips pods without an IP (ADD not answered yet), being deleted, finished, excluded, unmeshed, hostNetwork or already labelled', () => {
    const noIp = running({ ips: [] });
    const deleting = running();
    deleting.metadata!.deletionTimestamp = new Date();
    const done = running({ phase: 'Succeeded' });
    const excluded = running({ namespace: 'kube-system' });
    const plain: V1Pod = { metadata: { name: 'p', namespace: 'default', uid: 'u' }, spec: { containers: [{ name: 'app' }] }, status: { phase: 'Running', podIP: '10.244.1.8' } };
    const host = running();
    host.spec!.hostNetwork = true;
    const labelled = running();
    labelled.metadata!.labels = { 'meshcap.io/uncaptured': 'true' };
    expect(uncapturedPods([noIp, deleting, done, excluded, plain, host, labelled], [], ['kube-system'])).toEqual([]);
  });
});

describe('the pod\'s processes in /proc', () => {
  it('recognises the pod UID in cgroupfs and systemd layouts, v1 and v2', () => {
    expect(cgroupNamesPod(`0::/kubepods/burstable/pod${UID}/abc\n`, UID)).toBe(true);
    expect(cgroupNamesPod(`0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod${UID.replace(/-/g, '_')}.slice/cri-containerd-${'a'.repeat(64)}.scope\n`, UID)).toBe(true);
    expect(cgroupNamesPod(`12:memory:/kubepods/pod${UID}/x\n0::/\n`, UID)).toBe(true);
    expect(cgroupNamesPod('0::/system.slice/containerd.service\n', UID)).toBe(false);
    expect(cgroupNamesPod(`0::/kubepods/pod${UID.slice(0, -1)}0/x\n`, UID)).toBe(false);
  });
  it('takes the 64-hex sandbox id from the cgroup leaf', () => {
    const id = 'f'.repeat(63) + '1';
    expect(containerIdOf(`0::/kubepods/pod${UID}/${id}\n`)).toBe(id);
    expect(containerIdOf(`0::/k.slice/cri-containerd-${id}.scope\n`)).toBe(id);
    expect(containerIdOf(`0::/k.slice/crio-${id}.scope\n`)).toBe(id);
    expect(containerIdOf(`0::/kubepods/pod${UID}\n`)).toBeNull();
  });
  it('finds a local address in fib_trie, not a prefix of it', () => {
    const fib = 'Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 10.244.1.7\n        /32 host LOCAL\n     |-- 10.244.1.70\n        /32 link UNICAST\n';
    expect(fibTrieHasLocal(fib, '10.244.1.7')).toBe(true);
    expect(fibTrieHasLocal(fib, '10.244.1.70')).toBe(false);
    expect(fibTrieHasLocal(fib, '10.244.1.8')).toBe(false);
  });
});
