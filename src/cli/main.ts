// The meshcap command line (commander: subcommands, help, choices, errors).
// Every subcommand is registered here, from src/cli/; the logic each runs
// lives in its own module. Exit codes and where usage goes: src/cli/exit.ts.
import { Command } from 'commander';
import { configureExits, guardStdio, runCli } from './exit.js';

guardStdio();

const program = configureExits(new Command('meshcap'))
  .description('eBPF-first service-mesh traffic redirection (CNI plugin + node agent), iptables fallback identical to istio-iptables');

type Register = (program: Command) => void;
/** Each command's module, in the order `meshcap --help` lists them. */
const COMMANDS: [names: string[], load: () => Promise<Register>][] = [
  [['probe'], async () => (await import('./probe-command.js')).registerProbeCommand],
  [['load', 'uninstall'], async () => (await import('./datapath-commands.js')).registerDatapathCommands],
  [['proxy'], async () => (await import('./proxy-command.js')).registerProxyCommand],
  [['iptables'], async () => (await import('./iptables-command.js')).registerIptablesCommand],
  [['agent'], async () => (await import('./agent-command.js')).registerAgentCommand],
  [['install-cni'], async () => (await import('./install-cni-command.js')).registerInstallCniCommand],
  [['status'], async () => (await import('./status-command.js')).registerStatusCommand],
  [['sandbox'], async () => (await import('./sandbox-command.js')).registerSandboxCommand],
  [['version'], async () => (await import('./version-command.js')).registerVersionCommand],
  [['explain'], async () => (await import('./explain-command.js')).registerExplainCommand],
  [['completion'], async () => (await import('./completion.js')).registerCompletionCommand],
];
// `meshcap agent ...` loads the agent command's module only (every command's
// imports, e.g. yaml for iptables render, cost the agent's and status's start
// ~100s of ms); help, completion, a typo or no command load them all.
const named = COMMANDS.find(([names]) => names.includes(process.argv[2] ?? '') && process.argv[2] !== 'completion');
for (const register of await Promise.all((named ? [named] : COMMANDS).map(([, load]) => load()))) register(program);

process.exitCode = await runCli(program, process.argv, {
  err: (s) => process.stderr.write(s),
  debug: Boolean(process.env.MESHCAP_DEBUG),
});
