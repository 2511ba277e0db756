// `meshcap version`: this CLI (package version, build commit), the libbpf it
// is linked against, Node.js, and the agent on this node (over its CNI
// socket), so a mismatch during an upgrade shows.
import { Option, type Command } from 'commander';
import { formatVersion, meshcapVersion } from '../version.js';
import { examples } from './help.js';

export const DEFAULT_CNI_SOCKET = '/var/run/meshcap/cni.sock';

export function registerVersionCommand(program: Command): void {
  program
    .command('version')
    .description('print the meshcap version (and build commit), libbpf and Node.js versions, and the version of the agent on this node')
    .option('--json', 'machine-readable output')
    .addOption(new Option('--socket <path>', 'the agent\'s CNI socket').default(DEFAULT_CNI_SOCKET))
    .option('--client', 'this binary only: do not ask the agent')
    .addHelpText('after', examples('meshcap version', 'meshcap version --json --client'))
    .action(async (o: { json?: boolean; socket: string; client?: boolean }) => {
      const self = meshcapVersion();
      let libbpf: string;
      try {
        // The addon is loaded here only: `meshcap --help` never loads it.
        libbpf = (await import('../native/addon.js')).libbpfVersion();
      } catch (e) {
        libbpf = `unavailable (${(e as Error).message.split('\n')[0]})`;
      }
      const agent = o.client ? undefined : await (await import('../cni/agent-query.js')).queryAgentVersion(o.socket);
      const report = {
        meshcap: self,
        libbpf,
        node: process.version,
        ...(agent ? { agent: { socket: o.socket, ...agent } } : {}),
      };
      if (o.json) {
        console.log(JSON.stringify(report, null, 2));
        return;
      }
      const lines = [
        `meshcap ${formatVersion(self)}`,
        `libbpf  ${libbpf}`,
        `node    ${process.version}`,
      ];
      if (agent) {
        if (!agent.reachable) lines.push(`agent   not reachable at ${o.socket}: ${agent.error}`);
        else if (agent.version === null) lines.push(`agent   at ${o.socket}: answers, but does not report its version (older than this CLI)`);
        else {
          const same = agent.version === self.version && (agent.commit ?? null) === (self.commit ?? null);
          lines.push(`agent   ${formatVersion({ version: agent.version, commit: agent.commit, ...(agent.dirty ? { dirty: true } : {}) })} at ${o.socket}${same ? '' : '  (differs from this CLI)'}`);
        }
      }
      console.log(lines.join('\n'));
    });
}
