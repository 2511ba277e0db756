// A real agent (startAgent) for privileged tests: a pods file with the given
// pods, a private state dir, socket and pin root, a silent logger; restart()
// starts a new agent on the same state (as a DaemonSet rollout does), close()
// removes everything, datapath included. Plus the CNI request a runtime would
// send, the usual pod-beside-a-server topology, and a way to lose a pod's
// capture behind the agent's back.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { V1Pod } from '@kubernetes/client-node';
import { pino } from 'pino';
import { stringify } from 'yaml';
import { startAgent, type Agent, type AgentOptions } from '../../src/agent/agent.js';
import { configOf, cookieOf, type AttachmentRecord } from '../../src/agent/state-store.js';
import { removeCapture } from '../../src/fallback-iptables/apply.js';
import { EbpfBackend } from '../../src/pod-datapath/ebpf.js';
import type { CniRequest } from '../../src/cni/types.js';
import { FileSource } from '../../src/kube/file-source.js';
import { uninstallDatapath } from '../../src/loader/datapath.js';
import type { TestMode } from './datapaths.js';
import { testPinRoot, type Lab, type NsAgent } from './lab.js';

export class AgentFixture {
  readonly tmp = mkdtempSync(path.join(os.tmpdir(), 'meshcap-agent-fixture-'));
  readonly podsFile = path.join(this.tmp, 'pods.yaml');
  readonly socket = path.join(this.tmp, 'run', 'cni.sock');
  readonly pinRoot = testPinRoot();
  opts: AgentOptions;
  private current: Agent | undefined;

  constructor(mode: TestMode, pods: V1Pod[], over: Partial<AgentOptions> = {}) {
    writeFileSync(this.podsFile, pods.map((p) => stringify(p)).join('---\n'));
    const logger = pino({ level: 'silent' });
    this.opts = {
      socketPath: this.socket,
      pinRoot: this.pinRoot,
      mode,
      stateDir: path.join(this.tmp, 'state'),
      podSource: this.podSource(logger),
      excludeNamespaces: ['kube-system'],
      logger,
      podWaitMs: 2000,
      selfCheckMs: 0,
      ...over,
    };
  }

  private podSource(logger: AgentOptions['logger']): FileSource {
    return new FileSource({ path: this.podsFile, logger, debounceMs: 20, pollIntervalMs: 200 });
  }

  get agent(): Agent {
    if (!this.current) throw new Error('no agent running (start() it)');
    return this.current;
  }

  async start(): Promise<Agent> {
    this.current = await startAgent(this.opts);
    return this.current;
  }

  /** Stops the agent (the datapath stays, as on SIGTERM). */
  async stop(): Promise<void> {
    const a = this.current;
    this.current = undefined;
    await a?.close();
  }

  /** A new agent on the same state dir; a stopped pod source cannot restart, so it gets a new one. */
  async restart(over: Partial<AgentOptions> = {}): Promise<Agent> {
    await this.stop();
    this.opts = { ...this.opts, podSource: this.podSource(this.opts.logger), ...over };
    return this.start();
  }

  async close(): Promise<void> {
    await this.stop();
    uninstallDatapath(this.pinRoot);
    rmSync(this.tmp, { recursive: true, force: true });
  }
}

/** The request a runtime's CNI call becomes inside the agent. */
export function cniRequest(command: CniRequest['command'], o: { containerId: string; netns: string; pod: string; ips?: string[]; ifname?: string; namespace?: string }): CniRequest {
  return {
    command,
    containerId: o.containerId,
    netns: o.netns,
    ifname: o.ifname ?? 'eth0',
    args: {},
    podNamespace: o.namespace ?? 'default',
    podName: o.pod,
    cniVersion: '1.1.0',
    config: {
      cniVersion: '1.1.0', name: 'test', type: 'meshcap-cni',
      ...(o.ips ? { prevResult: { cniVersion: '1.1.0', ips: o.ips.map((address) => ({ address })) } } : {}),
    },
  };
}

/**
 * Removes a recorded pod's capture behind the agent's back, as an upgrade
 * that recreates a map or a flush in the pod netns would. Returns how many
 * eBPF entries went (0 in iptables mode) for the caller to assert on.
 */
export async function loseCapture(rec: AttachmentRecord, pinRoot: string): Promise<number> {
  if (rec.mode === 'iptables') {
    await removeCapture(rec.netns, configOf(rec));
    return 0;
  }
  const other = new EbpfBackend(pinRoot);
  try {
    return other.remove(cookieOf(rec)!);
  } finally {
    other.close();
  }
}

/**
 * A pod netns linked to a server netns (addresses from 198.18.0.0/15 or
 * 2001:db8::/32 only), the server listening on `serve`, and an app agent in
 * the pod: the topology every agent test starts from.
 */
export async function podBesideServer(lab: Lab, short: string, addrs: Parameters<Lab['link']>[2], serve: string[], port = 80): Promise<{ pod: { name: string; path: string }; app: NsAgent; server: NsAgent }> {
  const pod = await lab.netns(short);
  const srv = await lab.netns(`${short}srv`);
  await lab.link(pod.name, srv.name, addrs);
  const server = await lab.agent(srv.name);
  for (const host of serve) await server.listen(host, port);
  const app = await lab.agent(pod.name);
  return { pod, app, server };
}
