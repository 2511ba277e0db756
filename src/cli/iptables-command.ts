// `meshcap iptables render`: prints the iptables-restore input istio-iptables
// (flags) or istio-cni (--pod) would program. commander only collects the
// words (allowUnknownOption + a variadic argument): istio-iptables' own flag
// syntax is parsed by src/fallback-iptables/render-request.ts.
import type { Command } from 'commander';
import { renderForArgs } from '../fallback-iptables/render-request.js';

export function registerIptablesCommand(program: Command, io: { write: (s: string) => void } = { write: (s) => process.stdout.write(s) }): Command {
  const iptables = program.command('iptables').description('iptables fallback (istio-iptables compatible)');
  iptables
    .command('render')
    .description(
      'print the iptables-restore input istio-iptables would program.\n' +
      '  render [istio-iptables flags] [--family 4|6] [--dns-servers-v4 LIST] [--dns-servers-v6 LIST]\n' +
      '  render --pod FILE [--family 4|6] [--profile istio|linkerd]   (YAML or JSON Pod, istio-cni defaults)',
    )
    .argument('[args...]', 'istio-iptables flags (-p, -z, -u, ..., --redirect-dns, ...) and the options above')
    .allowUnknownOption()
    .allowExcessArguments()
    .action((args: string[], _opts: unknown, cmd: Command) => {
      try {
        io.write(renderForArgs(args));
      } catch (e) {
        cmd.error(`meshcap iptables render: ${(e as Error).message}`, { exitCode: 2 });
      }
    });
  return iptables;
}
