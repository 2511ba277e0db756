// What 4-tuples the pod's established sockets really have (from `ss -Htn
// state established` in the pod netns): the app's sockets (local address the
// pod's, local port not the proxy's) grouped by the remote address they are
// connected to, and the proxy's accepted sockets (local port the proxy's)
// grouped by their local address. In eBPF mode the app's remote address is
// where connect4 sent it (the kernel's view, not the app's getpeername()).
export interface TupleSummary {
  /** app sockets */
  app: number;
  /** [remote addr:port, sockets], most first */
  appByRemote: [string, number][];
  /** distinct local ports of the app sockets */
  appLocalPorts: number;
  /** proxy sockets */
  proxy: number;
  /** [local addr, sockets], most first */
  proxyByLocal: [string, number][];
  /** proxy sockets whose peer port is outside the app sockets' local ports (conntrack remapped it) */
  proxyPeerPortRemapped: number;
}

const split = (ep: string): [string, number] => {
  const i = ep.lastIndexOf(':');
  return [ep.slice(0, i).replace(/^\[|\]$/g, '').replace(/^::ffff:/, ''), Number(ep.slice(i + 1))];
};

export function summarizeTuples(ss: string, podIP: string, proxyPort: number): TupleSummary {
  const byRemote = new Map<string, number>();
  const byLocal = new Map<string, number>();
  const appPorts = new Set<number>();
  const proxyPeerPorts: number[] = [];
  let app = 0;
  let proxy = 0;
  for (const line of ss.split('\n')) {
    const f = line.trim().split(/\s+/);
    if (f.length < 4) continue;
    const [laddr, lport] = split(f[2]!);
    const remote = f[3]!;
    if (lport === proxyPort) {
      proxy++;
      byLocal.set(laddr, (byLocal.get(laddr) ?? 0) + 1);
      proxyPeerPorts.push(split(remote)[1]);
    } else if (laddr === podIP) {
      app++;
      appPorts.add(lport);
      const r = split(remote);
      const key = `${r[0]}:${r[1]}`;
      byRemote.set(key, (byRemote.get(key) ?? 0) + 1);
    }
  }
  const sorted = (m: Map<string, number>) => [...m.entries()].sort((a, b) => b[1] - a[1]);
  return {
    app, appByRemote: sorted(byRemote), appLocalPorts: appPorts.size,
    proxy, proxyByLocal: sorted(byLocal), proxyPeerPortRemapped: proxyPeerPorts.filter((p) => !appPorts.has(p)).length,
  };
}
