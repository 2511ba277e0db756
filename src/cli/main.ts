// The meshcap command line (commander: subcommands, help, choices, errors).
// Every subcommand is registered here, from src/cli/; the logic each runs
// lives in its own module. Exit codes and where usage goes: src/cli/exit.ts.
import { Command } from 'commander';
import { configureExits, guardStdio, runCli } from './exit.js';
import { registerProbeCommand } from './probe-command.js';
import { registerDatapathCommands } from './datapath-commands.js';
import { registerProxyCommand } from './proxy-command.js';
import { registerIptablesCommand } from './iptables-command.js';
import { registerAgentCommand } from './agent-command.js';
import { registerStatusCommand } from './status-command.js';
import { registerSandboxCommand } from './sandbox-command.js';
import { registerVersionCommand } from './version-command.js';
import { registerCompletionCommand } from './completion.js';
import { registerExplainCommand } from './explain-command.js';
import { registerInstallCniCommand } from './install-cni-command.js';

guardStdio();

const program = configureExits(new Command('meshcap'))
  .description('eBPF-first service-mesh traffic redirection (CNI plugin + node agent), iptables fallback identical to istio-iptables');

registerProbeCommand(program);
registerDatapathCommands(program);
registerProxyCommand(program);
registerIptablesCommand(program);
registerAgentCommand(program);
registerInstallCniCommand(program);
registerStatusCommand(program);
registerSandboxCommand(program);
registerVersionCommand(program);
registerExplainCommand(program);
registerCompletionCommand(program);

process.exitCode = await runCli(program, process.argv, {
  err: (s) => process.stderr.write(s),
  debug: Boolean(process.env.MESHCAP_DEBUG),
});
