// `meshcap iptables render`: prints the iptables-restore input istio-iptables
// (flags) or istio-cni (--pod) would program. commander only collects the
// words (allowUnknownOption + a variadic argument): istio-iptables' own flag
// syntax is parsed by src/fallback-iptables/render-request.ts.
import type { Command } from 'commander';
import { RenderRefusedError, RenderUsageError, renderForArgs } from '../fallback-iptables/render-request.js';
import { CaptureConfigError } from '../redirect/config.js';
import { FlagParseError } from '../redirect/flags.js';
import { CliFailure, UsageError } from './exit.js';
import { examples } from './help.js';

export interface RenderIo {
  write: (s: string) => void;
  /** Istio's warnings (stderr). */
  warn?: (s: string) => void;
  readStdin?: () => string;
}

export function registerIptablesCommand(program: Command, io: RenderIo = { write: (s) => process.stdout.write(s) }): Command {
  const iptables = program.command('iptables').description('iptables fallback (istio-iptables compatible)');
  iptables
    .command('render')
    .description(
      'print the iptables-restore input istio-iptables would program.\n' +
      '  render [istio-iptables flags] [--family 4|6] [--dns-servers-v4 LIST] [--dns-servers-v6 LIST]\n' +
      '  render --pod FILE|- [--family 4|6] [--profile istio|linkerd] [--force]   (YAML or JSON Pod, istio-cni defaults; - reads stdin)\n' +
      'A pod istio-cni would skip (no sidecar, istio-init present, injection disabled, ...) is refused with the reason\n' +
      '(exit 1) unless --force. Exit codes: 0 rendered, 1 input not renderable, 2 usage.',
    )
    .addHelpText('after', examples(
      'meshcap iptables render -p 15001 -z 15006 -u 1337 -m REDIRECT -i \'*\' -b \'*\' -d 15090,15021',
      'meshcap iptables render --pod pod.yaml --family 6',
      'kubectl get pod web -o yaml | meshcap iptables render --pod -',
    ))
    .argument('[args...]', 'istio-iptables flags (-p, -z, -u, ..., --redirect-dns, ...) and the options above')
    .allowUnknownOption()
    .allowExcessArguments()
    .action((args: string[]) => {
      const warn = io.warn ?? ((s: string) => process.stderr.write(s));
      let text: string;
      try {
        text = renderForArgs(args, process.env, {
          warn: (m) => warn(`meshcap iptables render: warning: ${m}\n`),
          ...(io.readStdin ? { readStdin: io.readStdin } : {}),
        });
      } catch (e) {
        const msg = `iptables render: ${(e as Error).message}`;
        if (e instanceof RenderRefusedError) throw new CliFailure(msg);
        if (e instanceof RenderUsageError || e instanceof FlagParseError || e instanceof CaptureConfigError) throw new UsageError(msg);
        throw e;
      }
      io.write(text);
    });
  return iptables;
}
