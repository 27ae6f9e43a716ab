// The orchconfig install-cni writes: a kubeconfig in strict JSON (so no YAML parser is bundled).
// Only what a bearer-token client needs is read: server, CA or skip-verify, token, all inline:
// no file it names is read (see parseOrchconfig).

import { CniError, CNI_ERROR } from '../cni/errors.ts';
import { isObject } from '../shared/json.ts';
import { parseErrorDetail } from '../shared/parseerror.ts';
import { readRegularFile, UnsafeFileError } from '../regularfile.ts';

/** An orchconfig is a few KiB; a bound keeps a planted huge file from filling the plugin's memory. */
const ORCHCONFIG_MAX_BYTES = 1024 * 1024;

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
  const hit =
    (list as Named<Record<string, unknown>>[]).find((e) => isObject(e) && e.name === name) ??
    (name === undefined ? list[0] : undefined);
  if (!isObject(hit)) throw new OrchconfigError(`${file}: no ${what} named ${JSON.stringify(name)}`);
  return hit;
}

export function parseOrchconfig(text: string, file: string): OrchAccess {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    throw new OrchconfigError(`${file} is not JSON (install-cni writes it as JSON): ${parseErrorDetail(e, text)}`);
  }
  if (!isObject(doc)) throw new OrchconfigError(`${file}: expected a JSON object`);
  const ctx = byName(doc.contexts, doc['current-context'], 'context', file).context;
  if (!isObject(ctx)) throw new OrchconfigError(`${file}: the current context has no context`);
  const cluster = byName(doc.clusters, ctx.cluster, 'cluster', file).cluster;
  const user = byName(doc.users, ctx.user, 'user', file).user;
  if (!isObject(cluster) || typeof cluster.server !== 'string')
    throw new OrchconfigError(`${file}: the cluster has no server`);
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
  } else if (cluster['certificate-authority'] !== undefined) {
    // A path to another file: the orchconfig is in a dir others may write, and the root plugin
    // must read no host file it names. install-cni writes the CA inline.
    throw new OrchconfigError(
      `${file}: the cluster names a certificate-authority file; the plugin reads no file an orchconfig names, only certificate-authority-data (as install-cni writes it). Let install-cni write this file`,
    );
  }
  if (!insecure && caPem === null)
    throw new OrchconfigError(
      `${file}: the cluster has neither certificate-authority-data nor insecure-skip-tls-verify`,
    );
  if (!isObject(user)) throw new OrchconfigError(`${file}: the user has no user`);
  // A tokenFile would have the root plugin send any host file it names as a Bearer token to the
  // server this same file names. install-cni writes the token inline.
  if (user.tokenFile !== undefined)
    throw new OrchconfigError(
      `${file}: the user names a tokenFile; the plugin reads no file an orchconfig names, only an inline token (as install-cni writes it). Let install-cni write this file`,
    );
  const token = typeof user.token === 'string' ? user.token : '';
  if (token === '') throw new OrchconfigError(`${file}: the user has no token`);
  return { server, caPem, insecure, token };
}

export function readOrchconfig(file: string): OrchAccess {
  let text: string;
  try {
    text = readRegularFile(file, ORCHCONFIG_MAX_BYTES);
  } catch (e) {
    if (e instanceof UnsafeFileError)
      throw new OrchconfigError(
        `orchconfig refused: ${e.message}; install-cni writes it as a regular file of at most 1 MiB: let it write this one`,
      );
    throw new OrchconfigError(
      `cannot read orchconfig ${file}: ${(e as Error).message}; is install-cni running on this node?`,
    );
  }
  return parseOrchconfig(text, file);
}

/** For a pod's API read: the orchconfig's access, or CNI error 11 (try again later) saying why it is unusable. */
export function orchAccessForPod(file: string): OrchAccess {
  try {
    return readOrchconfig(file);
  } catch (e) {
    if (e instanceof OrchconfigError)
      throw new CniError(CNI_ERROR.TRY_AGAIN_LATER, 'cannot reach the API server: orchconfig unusable', e.message);
    throw e;
  }
}
