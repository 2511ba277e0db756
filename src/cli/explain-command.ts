// `meshcap explain`: what happens to one connection of a pod and which rule
// decides it (src/explain/explain.ts): for a pod this node captures
// (NAMESPACE/NAME, checked against the kernel: src/explain/live.ts), or for a
// Pod manifest without a cluster (--pod FILE).
import { Option, type Command } from 'commander';
import { DEFAULT_STATE_DIR } from '../agent/state-store.js';
import { pinRootOption } from './datapath-commands.js';
import { checkDirOption } from './preflight.js';
import { UsageError, CliFailure } from './exit.js';
import { examples } from './help.js';

interface ExplainFlags {
  pod?: string;
  namespace?: string;
  stateDir: string;
  pinRoot: string;
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
    .description('say what happens to one connection of a pod (captured to the sidecar or direct) and which annotation, CIDR, port or uid rule decides it: for a pod on this node, checked against the kernel (eBPF maps or live iptables rules), or for a Pod manifest')
    .argument('[pod]', 'a pod this node\'s agent captures: NAME (with -n) or NAMESPACE/NAME')
    .option('--pod <file>', 'a Pod manifest instead (YAML or JSON; - reads stdin): no cluster, no kernel')
    .option('-n, --namespace <ns>', 'the pod\'s namespace', 'default')
    .addOption(new Option('--state-dir <dir>', 'the agent\'s attachment records (live pods)').default(DEFAULT_STATE_DIR))
    .addOption(pinRootOption())
    .option('--to <addr:port>', 'an outbound connection from the pod to this destination')
    .option('--from <addr>', 'an inbound connection from this peer (with --port)')
    .option('--port <n>', 'the pod port an inbound connection goes to')
    .option('--uid <n>', 'the uid of the connecting process in the pod (outbound)', '1000')
    .option('--gid <n>', 'its gid (default: the uid)')
    .option('--udp', 'a UDP flow (DNS) instead of TCP')
    .option('--pod-ip <addrs>', 'the pod\'s addresses, comma-separated (default: status.podIPs)')
    .option('--profile <istio|linkerd>', 'the mesh (default: from the pod\'s containers)')
    .option('--json', 'machine-readable output')
    .addHelpText('after', '\nExit codes: 0 explained (and, for a live pod, the kernel agrees); 1 the kernel disagrees with the pod\'s rules, no such pod on this node, or an error; 2 usage.' + examples(
      'sudo meshcap explain shop/web --to 10.96.0.10:443',
      'sudo meshcap explain web -n shop --from 10.1.2.3 --port 8080 --json',
      'meshcap explain --pod web.yaml --to 10.96.0.10:443',
      'meshcap explain --pod web.yaml --to 10.96.0.10:443 --uid 1337      # the sidecar\'s own connection',
      'kubectl get pod web -o yaml | meshcap explain --pod - --from 10.1.2.3 --port 8080',
    ))
    .action(async (podArg: string | undefined, o: ExplainFlags) => {
      if (!!podArg === !!o.pod) throw new UsageError('give either a pod on this node (NAMESPACE/NAME) or --pod FILE (a manifest)');
      if (!!o.to === !!o.from) throw new UsageError('give either --to ADDR:PORT (outbound) or --from ADDR --port N (inbound)');
      if (o.from && !o.port) throw new UsageError('--from needs --port N (the pod port the connection goes to)');
      const [peer, port] = o.to ? splitHostPort(o.to) : [o.from!, Number(o.port)];
      if (!Number.isInteger(port) || port < 1 || port > 65535) throw new UsageError(`port ${port} is not 1..65535`);
      const uid = Number(o.uid);
      const gid = o.gid === undefined ? uid : Number(o.gid);
      if (!Number.isInteger(uid) || uid < 0 || !Number.isInteger(gid) || gid < 0) throw new UsageError('--uid and --gid are numbers');
      const { parseAddr } = await import('../redirect/cidr.js');
      if (!parseAddr(peer)) throw new UsageError(`${peer} is not an IP address`);
      const base = { direction: o.to ? 'outbound' as const : 'inbound' as const, peer, port, protocol: o.udp ? 'udp' as const : 'tcp' as const, uid, gid };
      if (podArg) {
        const [namespace, name] = podArg.includes('/') ? podArg.split('/', 2) as [string, string] : [o.namespace ?? 'default', podArg];
        if (!namespace || !name) throw new UsageError(`${podArg}: expected NAME or NAMESPACE/NAME`);
        if (o.podIp || o.profile) throw new UsageError('--pod-ip and --profile are for --pod FILE: a live pod\'s come from the agent\'s record');
        if ((process.geteuid?.() ?? 0) !== 0) throw new CliFailure('explaining a live pod reads the agent\'s records and the pinned BPF maps or the pod\'s iptables rules, which are root-only: run it as root (or use --pod FILE)');
        checkDirOption('--state-dir', o.stateDir);
        const { explainLive, formatLive, NoRecordError } = await import('../explain/live.js');
        let r;
        try {
          r = await explainLive({ stateDir: o.stateDir, pinRoot: o.pinRoot, namespace, name, flow: base });
        } catch (e) {
          if (e instanceof NoRecordError) throw new CliFailure(e.message);
          throw e;
        }
        console.log(o.json ? JSON.stringify(r, null, 2) : formatLive(r));
        if (!r.agree) process.exitCode = 1;
        return;
      }
      const [{ loadPodManifest, RenderRefusedError }, { decideMeshed }, { podToCaptureConfig }, { explainFlow }] = await Promise.all([
        import('../fallback-iptables/render-request.js'), import('../decision/meshed.js'), import('../redirect/pod.js'),
        import('../explain/explain.js'),
      ]);
      let pod;
      try {
        pod = loadPodManifest(o.pod!);
      } catch (e) {
        if (e instanceof RenderRefusedError) throw new CliFailure(e.message);
        throw e;
      }
      const podIPs = o.podIp ? o.podIp.split(',').map((s) => s.trim()) : (pod.status?.podIPs ?? []).map((p) => p.ip).filter((x): x is string => !!x);
      const decision = decideMeshed(pod);
      const flow = { ...base, podIPs };
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
