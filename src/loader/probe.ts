// Ask the running kernel for every feature eBPF mode needs, then decide the
// mode. Attach types are probed by a trial attach on a throwaway cgroup and
// netns; the datapath objects themselves are trial-loaded, so a verifier that
// refuses one of them is reported with its own message.
import { mkdirSync, rmdirSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import * as bpf from '../native/addon.js';
import { OPTIONAL_FEATURES, REQUIRED_FEATURES, type FeatureResult, type FeatureSpec, type OptionalFeature } from './features.js';
import { decideMode, type ModeDecision, type ModeRequest } from './mode.js';
import { NODE_OBJECTS, POD_INBOUND_OBJECT, objectPath } from './manifest.js';
import { findCgroup2 } from './mounts.js';

export interface ProbeReport {
  kernel: string;
  mode: ModeDecision['mode'];
  features: Record<string, FeatureResult>;
  /** OPTIONAL_FEATURES by probe name: they switch one behaviour each, never the mode. */
  optional: Record<string, FeatureResult>;
  reasons: string[];
}

function num(table: Record<string, number>, key: string | undefined, what: string): number {
  const v = key === undefined ? undefined : table[key];
  if (v === undefined) throw new Error(`the system bpf.h has no ${what} ${key}`);
  return v;
}

/** A load that reached the verifier leaves its walk in the log (libbpf's own lines aside). */
export function hasVerifierLog(log: string | undefined): boolean {
  return !!log && log.split('\n').some((l) => l.trim() !== '' && !l.trim().startsWith('libbpf:'));
}

/** First verifier line that says why, for a one-line reason. */
export function verifierReason(log: string | undefined, fallback: string): string {
  if (!log) return fallback;
  // The verifier's own sentence, not libbpf's summary around it.
  const lines = log.split('\n').map((l) => l.trim()).filter((l) => l && !l.startsWith('libbpf:') && !l.startsWith(';'));
  const hit = lines.find((l) => /cannot|invalid|unknown|not supported|disallowed|denied|prohibited|unreachable|R\d+ /.test(l));
  return hit ?? lines.at(-1) ?? fallback;
}

/**
 * The optional features (helper probes: no targets needed), by their key in
 * OPTIONAL_FEATURES. A probe that throws counts as absent: the behaviour it
 * guards stays as on older kernels.
 */
export function probeOptionalFeatures(): Record<OptionalFeature, boolean> {
  const c = bpf.consts;
  const out = {} as Record<OptionalFeature, boolean>;
  for (const [key, spec] of Object.entries(OPTIONAL_FEATURES) as [OptionalFeature, FeatureSpec][]) {
    try {
      out[key] = bpf.probeHelper(num(c.progType, spec.progType, 'program type'), num(c.helper, spec.helper, 'helper'));
    } catch {
      out[key] = false;
    }
  }
  return out;
}

async function trialLoadObjects(): Promise<FeatureResult & { failures: string[] }> {
  const failures: string[] = [];
  let refusedAll = true;
  // Optional objects (peername.bpf.o) cost their feature, not eBPF mode.
  for (const file of [...NODE_OBJECTS.filter((o) => !o.optional).map((o) => o.file), POD_INBOUND_OBJECT]) {
    let obj: bpf.BpfObject | null = null;
    try {
      obj = bpf.openObject(objectPath(file));
      await obj.load();
    } catch (e) {
      const err = e as bpf.NativeError;
      failures.push(`${file}: ${verifierReason(err.log, err.message)}`);
      // The verifier rejects a program with EACCES too: a load with a
      // verifier log was read and refused (the object does not fit this
      // kernel), not refused for permission. Before, such a rejection read
      // "not permitted to the agent ... give it the capabilities".
      if (!refused(err.code) || hasVerifierLog(err.log)) refusedAll = false;
    } finally {
      obj?.close();
    }
  }
  // every load refused for permission (no verifier rejection): a capability is missing, not a kernel feature
  return { ok: failures.length === 0, since: '', why: '', failures, ...(failures.length ? { detail: failures.join('; ') } : {}), ...(failures.length && refusedAll ? { denied: true } : {}) };
}

interface Targets {
  cgroup: string | null;
  netns: string | null;
  cleanup: () => Promise<void>;
}

async function makeTargets(): Promise<Targets> {
  const root = findCgroup2();
  let cgroup: string | null = null;
  if (root) {
    cgroup = path.join(root, `meshcap-probe-${process.pid}`);
    mkdirSync(cgroup, { recursive: true });
  }
  // The name src/cli/probe-command.ts removes on a second Ctrl-C.
  const ns = `meshcap-probe-${process.pid}`;
  // loaded here (execa): what imports the loader to read pins (meshcap status) needs none of it
  const { addNetns, delNetns } = await import('../lab/netns.js');
  let netns: string | null = null;
  try {
    netns = await addNetns(ns, { lo: false });
  } catch {
    netns = null;
  }
  return {
    cgroup,
    netns,
    cleanup: async () => {
      if (cgroup) rmdirSync(cgroup);
      if (netns) await delNetns(ns).catch(() => undefined);
    },
  };
}

/** EPERM/EACCES: the kernel has the feature but refused this process. */
const refused = (code: string | undefined): boolean => code === 'EPERM' || code === 'EACCES';

async function probeOne(spec: FeatureSpec, t: Targets): Promise<Omit<FeatureResult, 'since' | 'why'>> {
  const c = bpf.consts;
  switch (spec.kind) {
    case 'prog':
      return { ok: bpf.probeProgType(num(c.progType, spec.progType, 'program type')) };
    case 'map':
      return { ok: bpf.probeMapType(num(c.mapType, spec.mapType, 'map type')) };
    case 'helper':
      return { ok: bpf.probeHelper(num(c.progType, spec.progType, 'program type'), num(c.helper, spec.helper, 'helper')) };
    case 'attach': {
      const target = spec.target === 'netns' ? t.netns : t.cgroup;
      if (!target) return { ok: false, detail: spec.target === 'netns' ? 'could not create a probe netns (ip netns add)' : 'no cgroup v2 mount' };
      const r = bpf.probeAttach(num(c.progType, spec.progType, 'program type'), num(c.attachType, spec.attachType, 'attach type'), target);
      return r.ok ? { ok: true } : { ok: false, detail: `bpf_link_create: ${r.code ?? r.errno}`, ...(refused(r.code) ? { denied: true } : {}) };
    }
    case 'sockopt':
      try {
        await bpf.netnsCookie('/proc/self/ns/net');
        return { ok: true };
      } catch (e) {
        return { ok: false, detail: (e as Error).message, ...(refused((e as { code?: string }).code) ? { denied: true } : {}) };
      }
    case 'objects': {
      const r = await trialLoadObjects();
      return r.ok ? { ok: true } : { ok: false, detail: r.detail ?? 'verifier refused', ...(r.denied ? { denied: true } : {}) };
    }
  }
}

export async function probeKernel(requested: ModeRequest = 'auto', kernel = os.release()): Promise<ProbeReport> {
  const features: Record<string, FeatureResult> = {};
  const targets = await makeTargets();
  try {
    for (const spec of REQUIRED_FEATURES) {
      let r: Omit<FeatureResult, 'since' | 'why'>;
      try {
        r = await probeOne(spec, targets);
      } catch (e) {
        r = { ok: false, detail: (e as Error).message, ...(refused((e as { code?: string }).code) ? { denied: true } : {}) };
      }
      features[spec.name] = { ok: r.ok, since: spec.since, why: spec.why, ...(r.detail ? { detail: r.detail } : {}), ...(r.denied ? { denied: true } : {}) };
    }
  } finally {
    await targets.cleanup();
  }
  const present = probeOptionalFeatures();
  const optional: Record<string, FeatureResult> = {};
  for (const [key, spec] of Object.entries(OPTIONAL_FEATURES) as [OptionalFeature, FeatureSpec][]) {
    optional[spec.name] = { ok: present[key], since: spec.since, why: spec.why };
  }
  const d = decideMode({ kernel, features, requested: requested === 'ebpf' ? 'auto' : requested });
  if (requested === 'ebpf' && d.mode !== 'ebpf') decideMode({ kernel, features, requested }); // throws ModeRefusedError with the reasons
  return { kernel, mode: d.mode, features, optional, reasons: d.reasons };
}
