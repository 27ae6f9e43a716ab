// prevResult -> the result a chained plugin prints, in the requested cniVersion. 0.3.x/0.4.0
// results carry `version` in each ip and only name/mac/sandbox per interface and dst/gw per
// route; 1.0.0 dropped ips[].version; 1.1.0 added interface mtu/socketPath/pciID and route
// mtu/advmss/priority/table/scope (libcni's types040 / types100 conversions do the same).

import { CniError, CNI_ERROR } from './errors.ts';
import { isObject } from '../shared/json.ts';

export const SUPPORTED_VERSIONS = ['0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0'] as const;
export const LATEST_VERSION = '1.1.0';

export function isSupportedVersion(v: unknown): v is string {
  return typeof v === 'string' && (SUPPORTED_VERSIONS as readonly string[]).includes(v);
}

const major = (v: string): number => Number(v.split('.')[0]);

function pick(o: Record<string, unknown>, keys: readonly string[]): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const k of keys) if (o[k] !== undefined) out[k] = o[k];
  return out;
}

function ipVersion(address: unknown): '4' | '6' {
  return typeof address === 'string' && address.includes(':') ? '6' : '4';
}

/** Converts a prevResult object to `toVersion`; throws CniError(7) when it is not a result. */
export function convertResult(prev: unknown, toVersion: string): Record<string, unknown> {
  if (!isObject(prev)) throw new CniError(CNI_ERROR.INVALID_CONFIG, 'prevResult is not a JSON object');
  for (const k of ['interfaces', 'ips', 'routes'] as const) {
    if (prev[k] !== undefined && !Array.isArray(prev[k])) {
      throw new CniError(CNI_ERROR.INVALID_CONFIG, `prevResult.${k} is not a list`);
    }
  }
  const to1 = major(toVersion) >= 1;
  const to11 = toVersion === '1.1.0';
  const out: Record<string, unknown> = { ...prev, cniVersion: toVersion };
  if (Array.isArray(prev.interfaces)) {
    out.interfaces = prev.interfaces.map((i) => (!isObject(i) ? i : to11 ? i : pick(i, ['name', 'mac', 'sandbox'])));
  }
  if (Array.isArray(prev.ips)) {
    out.ips = prev.ips.map((ip) => {
      if (!isObject(ip)) return ip;
      if (to1) {
        const { version: _v, ...rest } = ip;
        return rest;
      }
      return {
        version: typeof ip.version === 'string' ? ip.version : ipVersion(ip.address),
        ...pick(ip, ['interface', 'address', 'gateway']),
      };
    });
  }
  if (Array.isArray(prev.routes)) {
    out.routes = prev.routes.map((r) => (!isObject(r) ? r : to11 ? r : pick(r, ['dst', 'gw'])));
  }
  return out;
}

/** Address families present in a result (decides whether IPv6 rules are needed). */
export function resultFamilies(result: Record<string, unknown>): Set<4 | 6> {
  const fams = new Set<4 | 6>();
  if (Array.isArray(result.ips)) {
    for (const ip of result.ips) if (isObject(ip)) fams.add(ipVersion(ip.address) === '6' ? 6 : 4);
  }
  return fams;
}
