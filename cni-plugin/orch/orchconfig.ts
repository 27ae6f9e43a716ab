// The orchconfig install-cni writes: a kubeconfig in strict JSON (so no YAML parser is bundled).
// Only what a bearer-token client needs is read: server, CA or skip-verify, token.

import { readFileSync } from 'node:fs';
import { isObject } from '../json.ts';
import { describeJsonError } from '../parseerror.ts';

export interface OrchAccess {
  /** `https://host:port` (IPv6 hosts in brackets). */
  readonly server: URL;
  readonly caPem: string | null;
  readonly insecure: boolean;
  readonly token: string;
}

export class OrchconfigError extends Error {}

type Named<T> = { name?: unknown } & T;

function byName(list: unknown, name: unknown, what: string, file: string): Record<string, unknown> {
  if (!Array.isArray(list)) throw new OrchconfigError(`${file}: ${what}s is not a list`);
  const hit = (list as Named<Record<string, unknown>>[]).find((e) => isObject(e) && e.name === name) ?? (name === undefined ? list[0] : undefined);
  if (!isObject(hit)) throw new OrchconfigError(`${file}: no ${what} named ${JSON.stringify(name)}`);
  return hit;
}

export function parseOrchconfig(text: string, file: string): OrchAccess {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    throw new OrchconfigError(`${file} is not JSON (install-cni writes it as JSON): ${describeJsonError(e, text)}`);
  }
  if (!isObject(doc)) throw new OrchconfigError(`${file}: expected a JSON object`);
  const ctx = byName(doc.contexts, doc['current-context'], 'context', file).context;
  if (!isObject(ctx)) throw new OrchconfigError(`${file}: the current context has no context`);
  const cluster = byName(doc.clusters, ctx.cluster, 'cluster', file).cluster;
  const user = byName(doc.users, ctx.user, 'user', file).user;
  if (!isObject(cluster) || typeof cluster.server !== 'string') throw new OrchconfigError(`${file}: the cluster has no server`);
  let server: URL;
  try {
    server = new URL(cluster.server);
  } catch {
    throw new OrchconfigError(`${file}: server ${JSON.stringify(cluster.server)} is not a URL`);
  }
  if (server.protocol !== 'https:') throw new OrchconfigError(`${file}: server ${cluster.server} is not https`);
  const insecure = cluster['insecure-skip-tls-verify'] === true;
  let caPem: string | null = null;
  if (typeof cluster['certificate-authority-data'] === 'string') {
    caPem = Buffer.from(cluster['certificate-authority-data'], 'base64').toString('utf8');
  } else if (typeof cluster['certificate-authority'] === 'string') {
    caPem = readFileSync(cluster['certificate-authority'], 'utf8');
  }
  if (!insecure && caPem === null) throw new OrchconfigError(`${file}: the cluster has neither certificate-authority-data nor insecure-skip-tls-verify`);
  if (!isObject(user)) throw new OrchconfigError(`${file}: the user has no user`);
  let token = typeof user.token === 'string' ? user.token : '';
  if (token === '' && typeof user.tokenFile === 'string') token = readFileSync(user.tokenFile, 'utf8').trim();
  if (token === '') throw new OrchconfigError(`${file}: the user has no token`);
  return { server, caPem, insecure, token };
}

export function readOrchconfig(file: string): OrchAccess {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (e) {
    throw new OrchconfigError(`cannot read orchconfig ${file}: ${(e as Error).message}; is install-cni running on this node?`);
  }
  return parseOrchconfig(text, file);
}
