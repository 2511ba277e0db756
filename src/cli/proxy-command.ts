// `meshcap proxy`: the reference transparent proxy (src/proxy/) with its
// ports and switches from the command line.
import type { Command } from 'commander';
import { examples } from './help.js';

export function registerProxyCommand(program: Command): void {
  program
    .command('proxy')
    .description('run the reference transparent proxy (tests, sandbox, benchmarks); run it as the proxy uid')
    .addHelpText('after', examples(
      'setpriv --reuid=1337 --regid=1337 --clear-groups meshcap proxy',
      'meshcap proxy --echo --quiet --dns 15053',
    ))
    .option('--outbound <port>', 'outbound listener port', '15001')
    .option('--inbound <port>', 'inbound listener port', '15006')
    .option('--dns <port>', 'answer UDP datagrams on this port (DNS stand-in)')
    .option('--echo', 'echo bytes back instead of forwarding')
    .option('--no-ipv6', 'IPv4 listeners only')
    .option('--transparent', 'IP_TRANSPARENT on the inbound listeners (iptables TPROXY mode, as Envoy does)')
    .option('--quiet', 'no per-connection lines')
    .option('--events-file <path>', 'also append every event line to this file, before the connection is relayed (tests read it)')
    .action(async (o: { outbound: string; inbound: string; dns?: string; echo?: boolean; ipv6: boolean; quiet?: boolean; transparent?: boolean; eventsFile?: string }) => {
      const { runReferenceProxy } = await import('../proxy/run.js');
      await runReferenceProxy({
        outboundPort: Number(o.outbound),
        inboundPort: Number(o.inbound),
        ...(o.dns ? { dnsPort: Number(o.dns) } : {}),
        echo: o.echo ?? false,
        ipv6: o.ipv6,
        quiet: o.quiet ?? false,
        transparent: o.transparent ?? false,
        ...(o.eventsFile ? { eventsFile: o.eventsFile } : {}),
      });
    });
}
