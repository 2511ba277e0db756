// iptables-save / iptables-restore text helpers: parse a save dump into
// tables -> chains -> rules, and split restore input into per-table lines.

export interface SavedTable {
  /** chain name -> policy ("-" for user chains) */
  chains: Map<string, string>;
  /** rules in order; `spec` is the line after "-A <chain> " */
  rules: Array<{ chain: string; spec: string }>;
}

export type SavedState = Map<string, SavedTable>;

export const BUILTIN_CHAINS = new Set(['PREROUTING', 'INPUT', 'FORWARD', 'OUTPUT', 'POSTROUTING']);
export const MESHCAP_CHAIN_PREFIX = 'ISTIO_';

export function parseSave(text: string): SavedState {
  const state: SavedState = new Map();
  let cur: SavedTable | undefined;
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#') || line === 'COMMIT') continue;
    if (line.startsWith('*')) {
      const name = line.slice(1).trim();
      cur = state.get(name) ?? { chains: new Map(), rules: [] };
      state.set(name, cur);
      continue;
    }
    if (!cur) continue;
    if (line.startsWith(':')) {
      const [name, policy] = line.slice(1).split(' ');
      cur.chains.set(name as string, policy ?? '-');
      continue;
    }
    const m = /^-A (\S+)(?: (.*))?$/.exec(line);
    if (m) cur.rules.push({ chain: m[1] as string, spec: m[2] ?? '' });
  }
  return state;
}

/** The chain a rule jumps/goes to, if any. */
export function ruleTarget(spec: string): string | undefined {
  const m = /(?:^| )-[jg] (\S+)/.exec(spec);
  return m?.[1];
}

/** Splits restore input into table -> body lines (without "*table"/"COMMIT"). */
export function splitRestore(text: string): Map<string, string[]> {
  const out = new Map<string, string[]>();
  let cur: string[] | undefined;
  for (const line of text.split('\n')) {
    if (line.startsWith('* ') || line.startsWith('*')) {
      const t = line.replace(/^\*\s*/, '');
      cur = out.get(t) ?? [];
      out.set(t, cur);
    } else if (line === 'COMMIT') cur = undefined;
    else if (line !== '' && cur) cur.push(line);
  }
  return out;
}

export function joinRestore(tables: Map<string, string[]>): string {
  let out = '';
  for (const t of [...tables.keys()].sort()) {
    const l = tables.get(t) as string[];
    if (l.length === 0) continue;
    out += `*${t}\n${l.map((x) => `${x}\n`).join('')}COMMIT\n`;
  }
  return out;
}
