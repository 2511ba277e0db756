// CNI results: their types per spec version, and the conversion of a result
// (the chain's prevResult, which ADD answers) to the version a request speaks.
import { isObject } from '../mesh/vocabulary.js';
import { CniError } from './errors.js';
import { CNI_ERROR_CODES, type CniVersion } from './rules.js';
import { compareVersions, isSupportedVersion } from './versions.js';

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
 * The C forwarder's result_convert (native/cni/src/result_convert.c) makes the
 * same checks in the same order with the same messages: both run against
 * test/fixtures/cni/result-conversion.json.
 */
export function convertResult(result: unknown, toVersion: CniVersion): CniResult {
  if (result === undefined || result === null) return { cniVersion: toVersion };
  if (!isObject(result)) throw badResult('must be a JSON object');
  if ('ip4' in result || 'ip6' in result) throw badResult('0.2.0-format results (ip4/ip6) are not supported');
  const from = result.cniVersion;
  if (from !== undefined && !isSupportedVersion(from)) {
    throw badResult(typeof from === 'string' ? `cniVersion ${from.slice(0, 64)} is not supported` : 'cniVersion must be a string');
  }

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
      if (ip.version !== undefined && ip.version !== family) throw badResult(`ips[${i}].version must be "${family}" for address ${ip.address.slice(0, 64)}`);
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
