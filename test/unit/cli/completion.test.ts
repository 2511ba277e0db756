// `meshcap completion bash|zsh|fish`: generated from the commander tree; the
// bash script is run in a real bash to complete words.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { Command, Option } from 'commander';
import { describe, expect, it } from 'vitest';
import { bashCompletion, fishCompletion, zshCompletion } from '../../../src/cli/completion.js';

function program(): Command {
  const p = new Command('meshcap');
  p.command('status').option('--json').option('--state-dir <dir>').addOption(new Option('-o, --output <f>').choices(['table', 'json']));
  p.command('load').addOption(new Option('--mode <m>').choices(['auto', 'ebpf', 'iptables']));
  const ipt = p.command('iptables');
  ipt.command('render').option('--pod <file>');
  return p;
}

function complete(words: string[]): string[] {
  const dir = mkdtempSync(path.join(tmpdir(), 'meshcap-compl-'));
  try {
    const script = path.join(dir, 'c.bash');
    writeFileSync(script, bashCompletion(program()));
    const cmd = `source ${script}; COMP_WORDS=(${words.map((w) => `'${w}'`).join(' ')}); COMP_CWORD=${words.length - 1}; _meshcap; printf '%s\\n' "\${COMPREPLY[@]}"`;
    return execFileSync('bash', ['-c', cmd], { encoding: 'utf8' }).split('\n').filter(Boolean);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

describe('shell completion', () => {
  it('bash: subcommands, nested subcommands, options, and option choices', () => {
    expect(complete(['meshcap', ''])).toEqual(['status', 'load', 'iptables', '--help', '-h']);
    expect(complete(['meshcap', 'st'])).toEqual(['status']);
    expect(complete(['meshcap', 'iptables', ''])).toEqual(['render', '--help', '-h']);
    expect(complete(['meshcap', 'iptables', 'render', '--p'])).toEqual(['--pod']);
    expect(complete(['meshcap', 'load', '--mode', ''])).toEqual(['auto', 'ebpf', 'iptables']);
    expect(complete(['meshcap', 'status', '--json', '-o', 'j'])).toEqual(['json']);
    expect(complete(['meshcap', 'status', '--'])).toEqual(['--json', '--state-dir', '--output', '--help']);
  });

  it('bash and zsh scripts parse; fish lists every command and option', () => {
    expect(() => execFileSync('bash', ['-n'], { input: bashCompletion(program()) })).not.toThrow();
    expect(() => execFileSync('bash', ['-n'], { input: zshCompletion(program()).replace(/^autoload.*$/m, '') })).not.toThrow();
    expect(zshCompletion(program())).toMatch(/^#compdef meshcap\n/);
    const fish = fishCompletion(program());
    expect(fish).toContain("complete -c meshcap -n '__fish_use_subcommand' -a 'status'");
    expect(fish).toContain("complete -c meshcap -n '__fish_seen_subcommand_from load' -l mode -x -a 'auto ebpf iptables'");
    expect(fish).toContain("complete -c meshcap -n '__fish_seen_subcommand_from iptables; and not __fish_seen_subcommand_from render' -a 'render'");
  });
});
