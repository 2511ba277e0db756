// What the datapath bench measures: the tests (mc-bench-load's operations),
// the modes (how the app's connection reaches the proxy) and the legs
// (which path the proxy sits on). Shared by every part of the driver.
export const TESTS = {
  rr1: { test: 'rr', size: 1, label: 'rr 1 B' },
  rr100: { test: 'rr', size: 100, label: 'rr 100 B' },
  crr: { test: 'crr', size: 1, label: 'crr' },
  stream: { test: 'stream', size: 1, label: 'stream' },
} as const;
export type TestName = keyof typeof TESTS;

/**
 * noproxy: straight to the service; direct: to the proxy's own address (the
 * floor); podsrc: the same from the pod's address, the shape every redirect
 * that keeps the pod's address gives (REDIRECT, meshcap's bind), whose
 * replies the kernel routes without its route cache; iptables: Istio's rules;
 * ebpf: meshcap's datapath.
 */
export const MODES = ['noproxy', 'direct', 'podsrc', 'iptables', 'ebpf'] as const;
export type Mode = (typeof MODES)[number];

export const LEGS = {
  echo: 'app-to-proxy leg (the proxy echoes)',
  full: 'whole path (HAProxy forwards to a server in another netns)',
} as const;
export type Leg = keyof typeof LEGS;
