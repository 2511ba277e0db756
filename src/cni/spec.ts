// The CNI specification as the agent serves it (spec 1.1.0, answering
// 0.3.0..1.1.0): versions, error codes and the error object, request
// validation (env + network config), CNI_ARGS, GC's valid attachments, and
// result conversion between the 0.x and 1.x result formats. Pure: no I/O.
import { Ajv, type ErrorObject } from 'ajv';
import { isObject } from '../mesh/vocabulary.js';
import type { CniCommand, CniRequest } from './types.js';

export const SUPPORTED_VERSIONS = ['0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0'] as const;
export type CniVersion = (typeof SUPPORTED_VERSIONS)[number];
export const LATEST_VERSION: CniVersion = '1.1.0';

/** The spec's well-known error codes (SPEC.md "Error"), plus 999 for the unexpected. */
export const CNI_ERROR_CODES = {
  INCOMPATIBLE_VERSION: 1,
  UNSUPPORTED_FIELD: 2,
  UNKNOWN_CONTAINER: 3,
  INVALID_ENV: 4,
  IO_FAILURE: 5,
  DECODE_FAILURE: 6,
  INVALID_NETWORK_CONFIG: 7,
  INVALID_NETNS: 8,
  TRY_AGAIN_LATER: 11,
  PLUGIN_NOT_AVAILABLE: 50,
  LIMITED_CONNECTIVITY: 51,
  INTERNAL: 999,
} as const;
export type CniErrorCode = (typeof CNI_ERROR_CODES)[keyof typeof CNI_ERROR_CODES] | number;

export interface CniErrorResult {
  cniVersion: string;
  code: number;
  msg: string;
  details?: string;
}

/** A CNI error: what handlers throw, what the runtime reads on stdout. */
export class CniError extends Error {
  override readonly name = 'CniError';
  constructor(
    readonly code: CniErrorCode,
    msg: string,
    readonly details?: string,
  ) {
    super(msg);
  }

  get msg(): string {
    return this.message;
  }

  toJSON(): Omit<CniErrorResult, 'cniVersion'> {
    return this.details === undefined
      ? { code: this.code, msg: this.message }
      : { code: this.code, msg: this.message, details: this.details };
  }

  /** The error object as printed for a config of `cniVersion`. */
  toResult(cniVersion: string | undefined): CniErrorResult {
    return { cniVersion: errorVersion(cniVersion), ...this.toJSON() };
  }
}

// ---------------------------------------------------------------- versions

export function isSupportedVersion(v: unknown): v is CniVersion {
  return typeof v === 'string' && (SUPPORTED_VERSIONS as readonly string[]).includes(v);
}

const VERSION_RE = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/;

/** Semver order of two x.y.z versions; throws on anything else. */
export function compareVersions(a: string, b: string): number {
  const pa = VERSION_RE.exec(a);
  const pb = VERSION_RE.exec(b);
  if (!pa || !pb) throw new CniError(CNI_ERROR_CODES.DECODE_FAILURE, `cannot compare versions ${JSON.stringify(a)} and ${JSON.stringify(b)}`);
  for (let i = 1; i <= 3; i++) {
    const d = Number(pa[i]) - Number(pb[i]);
    if (d !== 0) return Math.sign(d);
  }
  return 0;
}

/** The cniVersion an error carries: the config's ("same as provided") when it
 * looks like a version, else the latest this plugin speaks. Same rule as the C forwarder. */
export function errorVersion(requested: unknown): string {
  return typeof requested === 'string' && VERSION_RE.test(requested) ? requested : LATEST_VERSION;
}

export interface VersionInfo {
  cniVersion: string;
  supportedVersions: CniVersion[];
}

/** VERSION's answer: echoes the requested version when supported. */
export function versionInfo(requested?: unknown): VersionInfo {
  return {
    cniVersion: isSupportedVersion(requested) ? requested : LATEST_VERSION,
    supportedVersions: [...SUPPORTED_VERSIONS],
  };
}

/** First spec version that has each verb (CHECK came in 0.4.0, STATUS/GC in 1.1.0). */
export const VERB_MIN_VERSION: Record<CniCommand | 'VERSION', CniVersion> = {
  ADD: '0.3.0',
  DEL: '0.3.0',
  CHECK: '0.4.0',
  STATUS: '1.1.0',
  GC: '1.1.0',
  VERSION: '0.3.0',
};

/** Picks the version to speak for a config: its cniVersion, which must be
 * supported and must have the verb. Throws CniError(1) otherwise. */
export function negotiateVersion(cniVersion: unknown, command: CniCommand): CniVersion {
  if (!isSupportedVersion(cniVersion)) {
    const shown = typeof cniVersion === 'string' ? cniVersion : '(missing)';
    throw new CniError(
      CNI_ERROR_CODES.INCOMPATIBLE_VERSION,
      `cniVersion ${shown} is not supported (supported: ${SUPPORTED_VERSIONS.join(', ')})`,
    );
  }
  const min = VERB_MIN_VERSION[command];
  if (compareVersions(cniVersion, min) < 0) {
    throw new CniError(
      CNI_ERROR_CODES.INCOMPATIBLE_VERSION,
      `config version ${cniVersion} does not allow ${command} (needs ${min} or later)`,
    );
  }
  return cniVersion;
}

// ---------------------------------------------------------------- results

export interface Interface {
  name: string;
  mac?: string;
  sandbox?: string;
  /** 1.1.0 */
  mtu?: number;
  socketPath?: string;
  pciID?: string;
}

export interface IPConfig040 {
  version: '4' | '6';
  address: string;
  gateway?: string;
  interface?: number;
}

export interface IPConfig100 {
  address: string;
  gateway?: string;
  interface?: number;
}

export interface Route {
  dst: string;
  gw?: string;
  /** 1.1.0 */
  mtu?: number;
  advmss?: number;
  priority?: number;
  table?: number;
  scope?: number;
}

export interface DNS {
  nameservers?: string[];
  domain?: string;
  search?: string[];
  options?: string[];
}

/** Result for 0.3.0, 0.3.1 and 0.4.0 (same format). */
export interface Result040 {
  cniVersion: string;
  interfaces?: Interface[];
  ips?: IPConfig040[];
  routes?: Route[];
  dns?: DNS;
}

/** Result for 1.0.0 and 1.1.0 (1.1.0 adds optional interface/route fields). */
export interface Result100 {
  cniVersion: string;
  interfaces?: Interface[];
  ips?: IPConfig100[];
  routes?: Route[];
  dns?: DNS;
}

export type CniResult = Result040 | Result100;

const ROUTE_11_FIELDS = ['mtu', 'advmss', 'priority', 'table', 'scope'] as const;
const INTERFACE_11_FIELDS = ['mtu', 'socketPath', 'pciID'] as const;

function badResult(what: string): CniError {
  return new CniError(CNI_ERROR_CODES.INVALID_NETWORK_CONFIG, `prevResult: ${what}`);
}

function objectArray(result: Record<string, unknown>, key: string): Record<string, unknown>[] | undefined {
  const v = result[key];
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v) || !v.every(isObject)) throw badResult(`${key} must be an array of objects`);
  return v.map((e) => ({ ...e }));
}

/**
 * Converts a result (typically prevResult) to the format of `toVersion`,
 * as libcni's convertTo040/convertTo100 do: 0.3.x/0.4.0 ips carry
 * `version` ("4"/"6", derived from the address when absent), 1.x dropped it;
 * 1.1.0-only interface and route fields are dropped below 1.0.0. `null` or
 * `undefined` gives a result with just cniVersion. Throws CniError(7) when the
 * input is not a result (e.g. a 0.2.0 ip4/ip6 result, or ips without address).
 */
export function convertResult(result: unknown, toVersion: CniVersion): CniResult {
  if (result === undefined || result === null) return { cniVersion: toVersion };
  if (!isObject(result)) throw badResult('must be a JSON object');
  if ('ip4' in result || 'ip6' in result) throw badResult('0.2.0-format results (ip4/ip6) are not supported');
  const from = result.cniVersion;
  if (from !== undefined && !isSupportedVersion(from)) throw badResult(`cniVersion ${String(from)} is not supported`);

  const pre100 = compareVersions(toVersion, '1.0.0') < 0;
  const out: Record<string, unknown> = { ...result, cniVersion: toVersion };

  const ips = objectArray(result, 'ips');
  if (ips) {
    out.ips = ips.map((ip, i) => {
      if (typeof ip.address !== 'string') throw badResult(`ips[${i}].address must be a string`);
      if (!pre100) {
        delete ip.version;
        return ip;
      }
      const family = ip.address.includes(':') ? '6' : '4';
      if (ip.version !== undefined && ip.version !== family) throw badResult(`ips[${i}].version ${String(ip.version)} does not match address ${ip.address}`);
      return { version: family, ...ip };
    });
  }
  const interfaces = objectArray(result, 'interfaces');
  if (interfaces) {
    out.interfaces = interfaces.map((ifc) => {
      if (pre100) for (const f of INTERFACE_11_FIELDS) delete ifc[f];
      return ifc;
    });
  }
  const routes = objectArray(result, 'routes');
  if (routes) {
    out.routes = routes.map((r, i) => {
      if (typeof r.dst !== 'string') throw badResult(`routes[${i}].dst must be a string`);
      if (pre100) for (const f of ROUTE_11_FIELDS) delete r[f];
      return r;
    });
  }
  if (out.dns !== undefined && !isObject(out.dns)) throw badResult('dns must be an object');
  return out as unknown as CniResult;
}

// ---------------------------------------------------------------- network config

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

const NAME_RE = '^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$';

const netConfSchema = {
  type: 'object',
  required: ['cniVersion', 'name', 'type'],
  properties: {
    cniVersion: { type: 'string' },
    name: { type: 'string', pattern: NAME_RE },
    type: { type: 'string', minLength: 1 },
    args: { type: 'object' },
    runtimeConfig: { type: 'object' },
    capabilities: { type: 'object', additionalProperties: { type: 'boolean' } },
    prevResult: { type: 'object' },
    agentSocket: { type: 'string', pattern: '^/', minLength: 2, maxLength: 107 },
    agentTimeoutMs: { type: 'integer', minimum: 1, maximum: 600000 },
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

const ajv = new Ajv({ allErrors: false, strict: true });
const validateNetConf = ajv.compile(netConfSchema);

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
  if (!validateNetConf(raw)) {
    throw new CniError(CNI_ERROR_CODES.INVALID_NETWORK_CONFIG, schemaMessage(validateNetConf.errors));
  }
  return raw as NetConf;
}

// ---------------------------------------------------------------- env

/** CNI_ARGS "K=V;K=V" -> object. Empty segments are skipped; a pair without
 * "=" or with an empty key is an error (code 4), as in libcni's LoadArgs. */
export function parseCniArgs(s: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const pair of s.split(';')) {
    if (pair === '') continue;
    const eq = pair.indexOf('=');
    if (eq <= 0) throw new CniError(CNI_ERROR_CODES.INVALID_ENV, `CNI_ARGS: invalid pair ${JSON.stringify(pair)} (want KEY=VALUE)`);
    out[pair.slice(0, eq)] = pair.slice(eq + 1);
  }
  return out;
}

const CONTAINER_ID_RE = new RegExp(NAME_RE);

/** The spec's container id rule: alphanumeric first, then [A-Za-z0-9_.-]. */
export function validateContainerId(id: string): void {
  if (id === '') throw new CniError(CNI_ERROR_CODES.INVALID_ENV, 'CNI_CONTAINERID is not set');
  if (!CONTAINER_ID_RE.test(id)) {
    throw new CniError(CNI_ERROR_CODES.INVALID_ENV, 'CNI_CONTAINERID has invalid characters (want [A-Za-z0-9][A-Za-z0-9_.-]*)', id);
  }
}

/** Linux interface name rules (as libcni's ValidateInterfaceName). */
export function validateIfname(name: string): void {
  const bad = (why: string) => new CniError(CNI_ERROR_CODES.INVALID_ENV, `CNI_IFNAME ${JSON.stringify(name)} ${why}`);
  if (name === '') throw new CniError(CNI_ERROR_CODES.INVALID_ENV, 'CNI_IFNAME is not set');
  if (Buffer.byteLength(name) > 15) throw bad('is longer than 15 bytes');
  if (name === '.' || name === '..') throw bad('is not a valid interface name');
  if (/[/:\s]/.test(name)) throw bad('contains "/", ":" or whitespace');
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

// ---------------------------------------------------------------- request

/** What the forwarder sends: the runtime's environment and stdin, verbatim. */
export interface RawRequest {
  command: string;
  containerId: string;
  netns: string;
  ifname: string;
  args: string;
  path: string;
  stdin: string;
}

export type ParsedRequest =
  | { command: 'VERSION'; versionInfo: VersionInfo }
  | { command: CniCommand; request: CniRequest; validAttachments: Attachment[] };

const COMMANDS: readonly CniCommand[] = ['ADD', 'DEL', 'CHECK', 'STATUS', 'GC'];

/** The spec's required variables per verb (CNI_ARGS and CNI_PATH are optional). */
const REQUIRED_ENV: Record<CniCommand, (keyof RawRequest)[]> = {
  ADD: ['containerId', 'netns', 'ifname'],
  CHECK: ['containerId', 'netns', 'ifname'],
  DEL: ['containerId', 'ifname'],
  STATUS: [],
  GC: [],
};
const ENV_NAME: Partial<Record<keyof RawRequest, string>> = {
  containerId: 'CNI_CONTAINERID',
  netns: 'CNI_NETNS',
  ifname: 'CNI_IFNAME',
};

/**
 * Validates a request the way a runtime's plugin must: command, required env
 * (code 4), stdin JSON (6), cniVersion and verb support (1), config schema
 * (7), container id / ifname format (4), CNI_ARGS (4), GC attachments (7).
 * The netns path is passed through unchecked: whether it must exist is the
 * handler's decision (DEL works when it is gone).
 */
export function parseRequest(raw: RawRequest): ParsedRequest {
  if (raw.command === 'VERSION') {
    let requested: unknown;
    if (raw.stdin.trim() !== '') {
      try {
        requested = (JSON.parse(raw.stdin) as { cniVersion?: unknown } | null)?.cniVersion;
      } catch (err) {
        throw new CniError(CNI_ERROR_CODES.DECODE_FAILURE, `VERSION input is not valid JSON: ${(err as Error).message}`);
      }
    }
    return { command: 'VERSION', versionInfo: versionInfo(requested) };
  }
  if (raw.command === '') throw new CniError(CNI_ERROR_CODES.INVALID_ENV, 'CNI_COMMAND is not set');
  const command = raw.command as CniCommand;
  if (!COMMANDS.includes(command)) {
    throw new CniError(CNI_ERROR_CODES.INVALID_ENV, `CNI_COMMAND ${raw.command.slice(0, 64)} is unknown (want ADD, DEL, CHECK, STATUS, GC or VERSION)`);
  }
  const missing = REQUIRED_ENV[command].filter((k) => raw[k] === '').map((k) => ENV_NAME[k]);
  if (missing.length > 0) {
    throw new CniError(CNI_ERROR_CODES.INVALID_ENV, `${missing.join(', ')} ${missing.length > 1 ? 'are' : 'is'} not set (required for ${command})`);
  }
  if (raw.stdin.trim() === '') throw new CniError(CNI_ERROR_CODES.DECODE_FAILURE, 'network config on stdin is empty');
  const config = parseNetConf(raw.stdin, command);
  if (raw.containerId !== '') validateContainerId(raw.containerId);
  if (raw.ifname !== '') validateIfname(raw.ifname);
  const args = parseCniArgs(raw.args);
  const request: CniRequest = {
    command,
    containerId: raw.containerId,
    netns: raw.netns,
    ifname: raw.ifname,
    args,
    cniVersion: config.cniVersion,
    config,
  };
  if (args.K8S_POD_NAMESPACE) request.podNamespace = args.K8S_POD_NAMESPACE;
  if (args.K8S_POD_NAME) request.podName = args.K8S_POD_NAME;
  return { command, request, validAttachments: command === 'GC' ? validAttachments(config) : [] };
}
