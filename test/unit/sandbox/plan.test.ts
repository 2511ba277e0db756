import { describe, expect, it } from 'vitest';
import { decideMeshed } from '../../../src/decision/meshed.js';
import { parsePodManifests } from '../../../src/kube/pod-manifests.js';
import { AGENT_TIMEOUT_MAX_MS } from '../../../src/cni/rules.js';
import { conflist, containersConf, deadlinesFor, makePlan, pinRootOf, podManifests, podsYaml, stateDirOf } from '../../../src/sandbox/plan.js';

const inBenchmarkRange = (cidr: string) => {
  const [a, b] = cidr.split('.').map(Number);
  return a === 198 && (b === 18 || b === 19);
};

describe('sandbox plan', () => {
  const plan = makePlan({ id: 'abcdef' });

  it('names everything after the run id, within the kernel and socket limits', () => {
    expect(plan.bridge).toBe('mcsbabcdef');
    expect(plan.bridge.length).toBeLessThanOrEqual(15);
    expect(plan.network).toBe('meshcap-sandbox-abcdef');
    expect(plan.runDir).toBe('/run/meshcap-sandbox/abcdef');
    expect(plan.socket.startsWith(plan.runDir + '/')).toBe(true);
    expect(Buffer.byteLength(plan.socket)).toBeLessThanOrEqual(107);
    expect(pinRootOf(plan, 'ebpf')).toBe('/sys/fs/bpf/meshcap-sandbox-abcdef-ebpf');
    expect(stateDirOf(plan, 'iptables').startsWith(plan.runDir + '/')).toBe(true);
  });

  it('takes its /24 from 198.18.0.0/15', () => {
    expect(plan.subnet).toBe('198.19.171.0/24');
    for (const id of ['000000', 'ffffff', '7f0000']) expect(inBenchmarkRange(makePlan({ id }).subnet)).toBe(true);
  });

  it('has a server, the meshed pods and one unmeshed pod', () => {
    expect(makePlan({ id: 'abcdef', meshed: 2 }).pods).toEqual([
      { name: 'server', role: 'server' },
      { name: 'meshed-1', role: 'meshed' },
      { name: 'meshed-2', role: 'meshed' },
      { name: 'unmeshed', role: 'unmeshed' },
    ]);
  });

  it('refuses out-of-range options with the flag named', () => {
    expect(() => makePlan({ id: 'xyz' })).toThrow(/6 hex digits/);
    expect(() => makePlan({ meshed: 0 })).toThrow(/--meshed/);
    expect(() => makePlan({ connections: 0 })).toThrow(/--connections/);
    expect(() => makePlan({ intervalMs: -1 })).toThrow(/--interval-ms/);
    expect(() => makePlan({ startupTimeoutMs: 10 })).toThrow(/--startup-timeout-ms/);
  });

  it('stretches the CNI, podman and connection deadlines with --startup-timeout-ms, never below the defaults', () => {
    const base = { cniAgent: 10_000, cniPlugin: 30_000, podman: 60_000, connection: 3_000 };
    expect(makePlan({ id: 'abcdef' }).deadlines).toEqual(base);
    expect(deadlinesFor(5_000)).toEqual(base);
    // the kernel matrix's TCG guests: startup 60 s x 10
    const slow = makePlan({ id: 'abcdef', startupTimeoutMs: 600_000 });
    expect(slow.deadlines).toEqual({ cniAgent: 100_000, cniPlugin: 300_000, podman: 600_000, connection: 30_000 });
    expect((conflist(slow) as { plugins: Record<string, unknown>[] }).plugins[1]).toMatchObject({ type: 'meshcap-cni', agentTimeoutMs: 100_000 });
    expect(deadlinesFor(3_600_000).cniAgent).toBe(AGENT_TIMEOUT_MAX_MS);
  });

  it('writes pods that Istio\'s meshed-pod test (the agent\'s own) decides as planned', () => {
    const { pods } = parsePodManifests(podsYaml(plan), plan.podsFile);
    expect(pods.map((p) => p.metadata?.name)).toEqual(plan.pods.map((p) => p.name));
    for (const p of podManifests(plan)) {
      const role = plan.pods.find((x) => x.name === p.metadata!.name)!.role;
      expect(decideMeshed(p).meshed, p.metadata!.name).toBe(role === 'meshed');
      expect(p.metadata!.namespace).toBe('meshcap-sandbox');
    }
  });

  it('chains meshcap-cni after bridge + host-local with no gateway, masquerade or routes', () => {
    const c = conflist(plan) as { name: string; plugins: Record<string, unknown>[] };
    expect(c.name).toBe(plan.network);
    expect(c.plugins.map((p) => p.type)).toEqual(['bridge', 'meshcap-cni']);
    const [bridge, mc] = c.plugins as [Record<string, unknown>, Record<string, unknown>];
    expect(bridge).toMatchObject({ bridge: plan.bridge, isGateway: false, ipMasq: false });
    expect(bridge.ipam).toEqual({ type: 'host-local', dataDir: `${plan.runDir}/ipam`, ranges: [[{ subnet: plan.subnet }]] });
    expect(mc.agentSocket).toBe(plan.socket);
  });

  it('keeps every podman path inside the run dir, with runc, cgroupfs, the CNI backend and file locks', () => {
    const conf = containersConf(plan, ['/usr/lib/cni']);
    for (const line of ['network_backend = "cni"', 'runtime = "runc"', 'cgroup_manager = "cgroupfs"', 'events_logger = "file"', 'lock_type = "file"',
      'default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]']) expect(conf).toContain(line);
    const paths = [...conf.matchAll(/^(?:network_config_dir|events_logfile_path|tmp_dir) = "(.+)"$/gm)].map((m) => m[1]!);
    expect(paths).toHaveLength(3);
    for (const p of paths) expect(p.startsWith(plan.runDir + '/')).toBe(true);
    expect(conf).toMatch(/^cni_plugin_dirs = \["\/usr\/lib\/cni", ".+\/build\/bin"\]$/m);
  });
});
