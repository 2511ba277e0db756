// Port of istio-iptables' builder/iptables_builder_impl.go: collects rules per
// IP family and renders them as iptables-restore input exactly as
// BuildV4Restore/BuildV6Restore do (tables sorted, "-N" lines for every
// non-built-in chain used or jumped to, then the rules in order, "COMMIT").

export interface Rule {
  chain: string;
  table: string;
  /** "-A chain ..." or "-I chain pos ..." */
  params: string[];
}

/** constants.BuiltInChainsAndTargetsMap */
const BUILT_IN_CHAINS_AND_TARGETS = new Set(['INPUT', 'OUTPUT', 'FORWARD', 'PREROUTING', 'POSTROUTING', 'ACCEPT', 'RETURN', 'DROP']);

/** constants.IPVersionSpecific: replaced by a v4/v6 value in versioned rules. */
export const IP_VERSION_SPECIFIC = 'PLACEHOLDER_IP_VERSION_SPECIFIC';

export class IptablesRuleBuilder {
  readonly rulesV4: Rule[] = [];
  readonly rulesV6: Rule[] = [];

  constructor(private readonly enableIPv6: boolean) {}

  appendRuleV4(chain: string, table: string, ...params: string[]): this {
    this.rulesV4.push({ chain, table, params: ['-A', chain, ...params] });
    return this;
  }

  appendRuleV6(chain: string, table: string, ...params: string[]): this {
    if (this.enableIPv6) this.rulesV6.push({ chain, table, params: ['-A', chain, ...params] });
    return this;
  }

  appendRule(chain: string, table: string, ...params: string[]): this {
    return this.appendRuleV4(chain, table, ...params).appendRuleV6(chain, table, ...params);
  }

  insertRuleV4(chain: string, table: string, position: number, ...params: string[]): this {
    this.rulesV4.push({ chain, table, params: ['-I', chain, String(position), ...params] });
    return this;
  }

  insertRuleV6(chain: string, table: string, position: number, ...params: string[]): this {
    if (this.enableIPv6) this.rulesV6.push({ chain, table, params: ['-I', chain, String(position), ...params] });
    return this;
  }

  insertRule(chain: string, table: string, position: number, ...params: string[]): this {
    return this.insertRuleV4(chain, table, position, ...params).insertRuleV6(chain, table, position, ...params);
  }

  /** AppendVersionedRule: IP_VERSION_SPECIFIC becomes ipv4 / ipv6. */
  appendVersionedRule(ipv4: string, ipv6: string, chain: string, table: string, ...params: string[]): this {
    const sub = (v: string) => params.map((p) => (p === IP_VERSION_SPECIFIC ? v : p));
    this.appendRuleV4(chain, table, ...sub(ipv4));
    this.appendRuleV6(chain, table, ...sub(ipv6));
    return this;
  }

  buildV4Restore(): string {
    return buildRestore(this.rulesV4);
  }

  buildV6Restore(): string {
    return buildRestore(this.rulesV6);
  }
}

/** Chains (per table) that a rule set creates: what "-N" lines it emits. */
export function createdChains(rules: readonly Rule[]): Array<{ table: string; chain: string }> {
  const seen = new Set<string>();
  const out: Array<{ table: string; chain: string }> = [];
  const visit = (chain: string, table: string) => {
    const key = `${chain}:${table}`;
    if (seen.has(key)) return;
    seen.add(key);
    if (!BUILT_IN_CHAINS_AND_TARGETS.has(chain)) out.push({ table, chain });
  };
  for (const r of rules) visit(r.chain, r.table);
  // Also chains only jumped to, even when they hold no rules.
  for (const r of rules) {
    if (r.params.length >= 2 && r.params[r.params.length - 2] === '-j') visit(r.params[r.params.length - 1] as string, r.table);
  }
  return out;
}

export function buildRestore(rules: readonly Rule[]): string {
  const tables = new Map<string, string[]>([['filter', []], ['nat', []], ['mangle', []]]);
  const lines = (t: string) => {
    let l = tables.get(t);
    if (!l) tables.set(t, (l = []));
    return l;
  };
  for (const { table, chain } of createdChains(rules)) lines(table).push(`-N ${chain}`);
  for (const r of rules) lines(r.table).push(r.params.join(' '));
  let out = '';
  for (const table of [...tables.keys()].sort()) {
    const l = tables.get(table) as string[];
    if (l.length === 0) continue;
    out += `* ${table}\n${l.map((x) => `${x}\n`).join('')}COMMIT\n`;
  }
  return out;
}
