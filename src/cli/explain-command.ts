// `meshcap explain --pod FILE`: what happens to one connection of a pod and
// which rule decides it (src/explain/explain.ts), without a cluster.
import type { Command } from 'commander';
import { UsageError, CliFailure } from './exit.js';
import { examples } from './help.js';

interface ExplainFlags {
  pod: string;
  to?: string;
  from?: string;
  port?: string;
  uid: string;
  gid?: string;
  udp?: boolean;
  podIp?: string;
  profile?: string;
  json?: boolean;
}

function splitHostPort(s: string): [string, number] {
  const m = /^\[([^\]]+)\]:(\d+)$/.exec(s) ?? /^([^:]+):(\d+)$/.exec(s);
  if (!m) throw new UsageError(`--to ${s}: expected ADDR:PORT ([ADDR]:PORT for IPv6)`);
  return [m[1]!, Number(m[2])];
}

export function registerExplainCommand(program: Command): void {
  program
    .command('explain')
    .description('say what happens to one connection of a pod (captured to the sidecar or direct) and which annotation, CIDR, port or uid rule decides it, from a Pod manifest')
    .requiredOption('--pod <file>', 'the Pod manifest (YAML or JSON; - reads stdin)')
    .option('--to <addr:port>', 'an outbound connection from the pod to this destination')
    .option('--from <addr>', 'an inbound connection from this peer (with --port)')
    .option('--port <n>', 'the pod port an inbound connection goes to')
    .option('--uid <n>', 'the uid of the connecting process in the pod (outbound)', '1000')
    .option('--gid <n>', 'its gid (default: the uid)')
    .option('--udp', 'a UDP flow (DNS) instead of TCP')
    .option('--pod-ip <addrs>', 'the pod\'s addresses, comma-separated (default: status.podIPs)')
    .option('--profile <istio|linkerd>', 'the mesh (default: from the pod\'s containers)')
    .option('--json', 'machine-readable output')
    .addHelpText('after', examples(
      'meshcap explain --pod web.yaml --to 10.96.0.10:443',
      'meshcap explain --pod web.yaml --to 10.96.0.10:443 --uid 1337      # the sidecar\'s own connection',
      'kubectl get pod web -o yaml | meshcap explain --pod - --from 10.1.2.3 --port 8080',
    ))
    .action(async (o: ExplainFlags) => {
      if (!!o.to === !!o.from) throw new UsageError('give either --to ADDR:PORT (outbound) or --from ADDR --port N (inbound)');
      if (o.from && !o.port) throw new UsageError('--from needs --port N (the pod port the connection goes to)');
      const [peer, port] = o.to ? splitHostPort(o.to) : [o.from!, Number(o.port)];
      if (!Number.isInteger(port) || port < 1 || port > 65535) throw new UsageError(`port ${port} is not 1..65535`);
      const uid = Number(o.uid);
      const gid = o.gid === undefined ? uid : Number(o.gid);
      if (!Number.isInteger(uid) || uid < 0 || !Number.isInteger(gid) || gid < 0) throw new UsageError('--uid and --gid are numbers');
      const [{ loadPodManifest, RenderRefusedError }, { decideMeshed }, { podToCaptureConfig }, { explainFlow }, { parseAddr }] = await Promise.all([
        import('../fallback-iptables/render-request.js'), import('../decision/meshed.js'), import('../redirect/pod.js'),
        import('../explain/explain.js'), import('../redirect/cidr.js'),
      ]);
      if (!parseAddr(peer)) throw new UsageError(`${peer} is not an IP address`);
      let pod;
      try {
        pod = loadPodManifest(o.pod);
      } catch (e) {
        if (e instanceof RenderRefusedError) throw new CliFailure(e.message);
        throw e;
      }
      const podIPs = o.podIp ? o.podIp.split(',').map((s) => s.trim()) : (pod.status?.podIPs ?? []).map((p) => p.ip).filter((x): x is string => !!x);
      const decision = decideMeshed(pod);
      const flow = { direction: o.to ? 'outbound' as const : 'inbound' as const, peer, port, protocol: o.udp ? 'udp' as const : 'tcp' as const, uid, gid, podIPs };
      if (!decision.meshed) {
        const r = { verdict: 'not captured', rule: null, path: [], trail: [], reason: `NOT captured: the pod is not redirected at all: ${decision.reason}` };
        console.log(o.json ? JSON.stringify({ flow, ...r }, null, 2) : r.reason);
        return;
      }
      const profile = o.profile === 'istio' || o.profile === 'linkerd' ? o.profile : decision.profile;
      const warnings: string[] = [];
      const config = podToCaptureConfig(pod, profile, { enableIPv6: peer.includes(':'), podIPs, onWarning: (m) => warnings.push(m) });
      const r = explainFlow(config, flow);
      for (const w of warnings) process.stderr.write(`meshcap explain: warning: ${w}\n`);
      if (o.json) {
        console.log(JSON.stringify({ flow, profile, ...r }, null, 2));
        return;
      }
      console.log([
        r.reason,
        `  chains: ${r.path.join(' -> ')}`,
        `  mode: the same in eBPF and iptables mode (the eBPF programs implement these rules; see docs/datapath.md for where they differ)`,
      ].join('\n'));
    });
}
