// Prometheus text exposition helpers for the dashboard tests.

/** Metric families in a Prometheus text exposition: name -> type. */
export function families(text: string): Map<string, string> {
  return new Map([...text.matchAll(/^# TYPE (\S+) (\S+)$/gm)].map((m) => [m[1]!, m[2]!]));
}

/** The meshcap_* series names a dashboard's queries use, histogram suffixes mapped to their family. */
export function queriedFamilies(exprs: string[], known: Map<string, string>): string[] {
  const names = new Set<string>();
  for (const e of exprs) {
    for (const m of e.matchAll(/\b(meshcap_[a-z0-9_]+)\b/g)) {
      const n = m[1]!;
      const base = n.replace(/_(bucket|sum|count)$/, '');
      names.add(known.get(base) === 'histogram' ? base : n);
    }
  }
  return [...names].sort();
}
