// `node dist/proxy/main.js` / `meshcap proxy`: run the reference proxy.
import { Command } from 'commander';
import { startReferenceProxy } from './reference-proxy.js';

export function registerProxyCommand(program: Command): void {
  program
    .command('proxy')
    .description('run the reference transparent proxy (tests, sandbox, benchmarks); run it as the proxy uid')
    .option('--outbound <port>', 'outbound listener port', '15001')
    .option('--inbound <port>', 'inbound listener port', '15006')
    .option('--dns <port>', 'answer UDP datagrams on this port (DNS stand-in)')
    .option('--echo', 'echo bytes back instead of forwarding')
    .option('--no-ipv6', 'IPv4 listeners only')
    .option('--transparent', 'IP_TRANSPARENT on the inbound listeners (iptables TPROXY mode, as Envoy does)')
    .option('--quiet', 'no per-connection lines')
    .action(async (o: { outbound: string; inbound: string; dns?: string; echo?: boolean; ipv6: boolean; quiet?: boolean; transparent?: boolean }) => {
      const p = startReferenceProxy({
        outboundPort: Number(o.outbound),
        inboundPort: Number(o.inbound),
        ...(o.dns ? { dnsPort: Number(o.dns) } : {}),
        echo: o.echo ?? false,
        ipv6: o.ipv6,
        quiet: o.quiet ?? false,
        transparent: o.transparent ?? false,
      });
      await p.ready;
      process.stdout.write(JSON.stringify({ event: 'ready', pid: process.pid, uid: process.getuid?.() }) + '\n');
      const stop = () => {
        p.close();
        process.stdout.write(JSON.stringify({ event: 'stats', ...p.stats }) + '\n');
        process.exit(0);
      };
      process.on('SIGTERM', stop);
      process.on('SIGINT', stop);
    });
}
