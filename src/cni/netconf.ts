// The network config on stdin: its schema (ajv), its decoding, and the GC
// attachments it carries.
import { createRequire } from 'node:module';
import type { ErrorObject, ValidateFunction } from 'ajv';
import { isObject } from '../mesh/vocabulary.js';
import { CniError } from './errors.js';
import { AGENT_SOCKET_MAX_LENGTH, AGENT_TIMEOUT_MAX_MS, CNI_ERROR_CODES, NAME_PATTERN, type CniCommand, type CniVersion } from './rules.js';
import { negotiateVersion } from './versions.js';

/** The network config on stdin: the spec's well-known keys, meshcap's keys,
 * and whatever else the chain passes (kept, never rejected). */
export interface NetConf {
  cniVersion: CniVersion;
  name: string;
  type: string;
  args?: Record<string, unknown>;
  runtimeConfig?: Record<string, unknown>;
  capabilities?: Record<string, boolean>;
  prevResult?: Record<string, unknown>;
  /** meshcap: the agent's unix socket (read by the forwarder). */
  agentSocket?: string;
  /** meshcap: how long the forwarder waits for the agent. */
  agentTimeoutMs?: number;
  /** meshcap: namespaces passed through when the agent is unreachable. */
  excludeNamespaces?: string[];
  'cni.dev/valid-attachments'?: { containerID: string; ifname: string }[];
  [key: string]: unknown;
}

const netConfSchema = {
  type: 'object',
  required: ['cniVersion', 'name', 'type'],
  properties: {
    cniVersion: { type: 'string' },
    name: { type: 'string', pattern: NAME_PATTERN },
    type: { type: 'string', minLength: 1 },
    args: { type: 'object' },
    runtimeConfig: { type: 'object' },
    capabilities: { type: 'object', additionalProperties: { type: 'boolean' } },
    prevResult: { type: 'object' },
    agentSocket: { type: 'string', pattern: '^/', minLength: 2, maxLength: AGENT_SOCKET_MAX_LENGTH },
    agentTimeoutMs: { type: 'integer', minimum: 1, maximum: AGENT_TIMEOUT_MAX_MS },
    excludeNamespaces: { type: 'array', items: { type: 'string' } },
    'cni.dev/valid-attachments': { $ref: '#/$defs/attachments' },
    'cni.dev/attachments': { $ref: '#/$defs/attachments' },
  },
  $defs: {
    attachments: {
      type: 'array',
      items: {
        type: 'object',
        required: ['containerID', 'ifname'],
        properties: { containerID: { type: 'string' }, ifname: { type: 'string' } },
      },
    },
  },
  additionalProperties: true,
} as const;

let validator: ValidateFunction | undefined;
/**
 * The schema's validator, made on first use: loading ajv and compiling took
 * ~100-200 ms of every `meshcap agent` start (the agent makes it right after
 * ready, before the first ADD needs it).
 */
export function netConfValidator(): ValidateFunction {
  if (!validator) {
    const { Ajv } = createRequire(import.meta.url)('ajv') as typeof import('ajv');
    validator = new Ajv({ allErrors: false, strict: true }).compile(netConfSchema);
  }
  return validator;
}

function schemaMessage(errors: ErrorObject[] | null | undefined): string {
  const e = errors?.[0];
  if (!e) return 'invalid network config';
  const where = e.instancePath === '' ? 'network config' : e.instancePath.slice(1).replace(/\//g, '.');
  return `${where} ${e.message ?? 'is invalid'}`;
}

/** Decodes and validates stdin. Throws CniError 6 (not JSON), 1 (version), 7 (schema). */
export function parseNetConf(stdin: string, command: CniCommand): NetConf {
  let raw: unknown;
  try {
    raw = JSON.parse(stdin);
  } catch (err) {
    throw new CniError(CNI_ERROR_CODES.DECODE_FAILURE, `network config on stdin is not valid JSON: ${(err as Error).message}`);
  }
  if (!isObject(raw)) throw new CniError(CNI_ERROR_CODES.DECODE_FAILURE, 'network config on stdin must be a JSON object');
  negotiateVersion(raw.cniVersion, command);
  const validateNetConf = netConfValidator();
  if (!validateNetConf(raw)) {
    throw new CniError(CNI_ERROR_CODES.INVALID_NETWORK_CONFIG, schemaMessage(validateNetConf.errors));
  }
  return raw as NetConf;
}

export interface Attachment {
  containerId: string;
  ifname: string;
}

/** GC's `cni.dev/valid-attachments` (libcni also sets the older
 * `cni.dev/attachments`; either is accepted, the spec's name wins). */
export function validAttachments(conf: NetConf): Attachment[] {
  const list = (conf['cni.dev/valid-attachments'] ?? conf['cni.dev/attachments'] ?? []) as { containerID: string; ifname: string }[];
  return list.map((a) => ({ containerId: a.containerID, ifname: a.ifname }));
}
