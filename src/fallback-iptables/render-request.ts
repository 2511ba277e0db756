// What `meshcap iptables render` renders: its argv split into meshcap's own
// options and istio-iptables' flags (-p, -z, -u, ... in pflag syntax: -p15001,
// -p=15001, which are not commander options), the CaptureConfig they or a Pod
// manifest (--pod) describe, and the rendered text. The command itself is
// registered in src/cli/iptables-command.ts.
import { readFileSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import type { V1Pod } from '@kubernetes/client-node';
import { splitList, type CaptureConfig } from '../redirect/config.js';
import { parseIstioIptablesArgs } from '../redirect/flags.js';
import { podToCaptureConfig } from '../redirect/pod.js';
import { isMeshProfile, MESH_PROFILES, type MeshProfile } from '../mesh/vocabulary.js';
import { renderIptables } from './render.js';

export class RenderUsageError extends Error {}

export interface RenderRequest {
  family: 4 | 6;
  pod?: string;
  profile: MeshProfile;
  dnsServersV4: string[];
  dnsServersV6: string[];
  istioArgs: string[];
}

const OWN_FLAGS = ['--pod', '--family', '--dns-servers-v4', '--dns-servers-v6', '--profile'] as const;

/** Splits meshcap's own flags from istio-iptables' flags. */
export function parseRenderArgs(argv: readonly string[]): RenderRequest {
  const req: RenderRequest = { family: 4, profile: 'istio', dnsServersV4: [], dnsServersV6: [], istioArgs: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    const eq = a.indexOf('=');
    const name = a.startsWith('--') ? a.slice(0, eq < 0 ? undefined : eq) : '';
    if (!(OWN_FLAGS as readonly string[]).includes(name)) {
      req.istioArgs.push(a);
      continue;
    }
    let value: string;
    if (eq >= 0) value = a.slice(eq + 1);
    else {
      if (i + 1 >= argv.length) throw new RenderUsageError(`${name} needs a value`);
      value = argv[++i] as string;
    }
    switch (name) {
      case '--pod':
        req.pod = value;
        break;
      case '--family':
        if (value !== '4' && value !== '6') throw new RenderUsageError(`--family must be 4 or 6, got "${value}"`);
        req.family = Number(value) as 4 | 6;
        break;
      case '--profile':
        if (!isMeshProfile(value)) throw new RenderUsageError(`--profile must be ${MESH_PROFILES.join(' or ')}, got "${value}"`);
        req.profile = value;
        break;
      case '--dns-servers-v4':
        req.dnsServersV4 = splitList(value);
        break;
      case '--dns-servers-v6':
        req.dnsServersV6 = splitList(value);
        break;
    }
  }
  if (req.pod !== undefined && req.istioArgs.length > 0) {
    throw new RenderUsageError(`--pod cannot be combined with istio-iptables flags (${req.istioArgs.join(' ')})`);
  }
  return req;
}

export function loadPodManifest(path: string): V1Pod {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    throw new RenderUsageError(`cannot read pod manifest ${path}: ${(e as Error).message}`);
  }
  const doc = parseYaml(text) as unknown; // YAML is a superset of JSON
  if (!doc || typeof doc !== 'object' || (doc as { kind?: unknown }).kind !== undefined && (doc as { kind?: unknown }).kind !== 'Pod') {
    throw new RenderUsageError(`${path} is not a Pod manifest`);
  }
  return doc as V1Pod;
}

/** The CaptureConfig a render request describes. */
export function captureConfigForRender(req: RenderRequest, env: Record<string, string | undefined>): CaptureConfig {
  const enableIPv6 = req.family === 6;
  if (req.pod !== undefined) return podToCaptureConfig(loadPodManifest(req.pod), req.profile, { enableIPv6 });
  const { config, runtime } = parseIstioIptablesArgs(req.istioArgs, {
    env, enableIPv6, dnsServersV4: req.dnsServersV4, dnsServersV6: req.dnsServersV6,
  });
  if (runtime.nativeNftables) throw new RenderUsageError('--native-nftables: meshcap renders iptables rules only');
  return config;
}

/** Rendered text for the requested family. */
export function renderForArgs(argv: readonly string[], env: Record<string, string | undefined> = process.env): string {
  const req = parseRenderArgs(argv);
  const out = renderIptables(captureConfigForRender(req, env));
  return req.family === 6 ? (out.v6 ?? '') : out.v4;
}
