// The meshcap command line (commander: subcommands, help, choices, errors).
// Every subcommand is registered here, from src/cli/; the logic each runs
// lives in its own module.
import { Command } from 'commander';
import { registerProbeCommand } from './probe-command.js';
import { registerDatapathCommands } from './datapath-commands.js';
import { registerProxyCommand } from './proxy-command.js';
import { registerIptablesCommand } from './iptables-command.js';
import { registerAgentCommand } from './agent-command.js';
import { registerStatusCommand } from './status-command.js';
import { registerSandboxCommand } from './sandbox-command.js';

const program = new Command('meshcap')
  .description('eBPF-first service-mesh traffic redirection (CNI plugin + node agent), iptables fallback identical to istio-iptables')
  .showHelpAfterError();

registerProbeCommand(program);
registerDatapathCommands(program);
registerProxyCommand(program);
registerIptablesCommand(program);
registerAgentCommand(program);
registerStatusCommand(program);
registerSandboxCommand(program);

try {
  await program.parseAsync(process.argv);
} catch (e) {
  const err = e as Error & { code?: string; log?: string };
  console.error(`meshcap: ${err.message}`);
  if (process.env.MESHCAP_DEBUG && err.log) console.error(err.log);
  process.exitCode = 1;
}
