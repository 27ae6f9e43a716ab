// Keeps the orchconfig (orchconfig.ts) in the net dir: the plugin's own token (or, run alone, the
// service-account token), the API server address and the CA, written only when what is there
// differs, in its mode. I/O at the edge of a reconcile pass (pass.ts).

import path from 'node:path';
import type { EnvironmentFacts, InstallSettings } from '../config/settings.ts';
import type { PluginTokenSource } from './tokenrequest.ts';
import { removeFile, writeFileAtomic } from './atomicfile.ts';
import type { Write } from './apply.ts';
import { renderOrchconfig } from './orchconfig.ts';
import type { ErrorReason } from './plancontext.ts';
import { readRegularFile, readRegularFileIfExists, readRegularTextIfExists, UnsafeFileError } from './safefile.ts';
import { agentTokenMatch } from './tokencheck.ts';

type Fail = (reason: ErrorReason, message: string) => void;

/** What keeping the orchconfig reads: where it goes, in what mode, and how the plugin trusts the API server. */
export type OrchconfigSettings = Pick<
  InstallSettings,
  'mountedCniNetDir' | 'orchcfgFileName' | 'orchconfigMode' | 'serviceAccountDir' | 'orchCaFile' | 'skipTlsVerify'
>;
/** KUBERNETES_SERVICE_HOST and _PORT: the API server the orchconfig names. */
export type OrchconfigEnv = Pick<EnvironmentFacts, 'orchServiceHost' | 'orchServicePort'>;

/**
 * The orchconfig in place. `pluginToken`: the plugin's token; without one, the service-account
 * token (the installer run alone, in tests).
 */
export async function syncOrchconfig(
  s: OrchconfigSettings,
  env: OrchconfigEnv,
  pluginToken: PluginTokenSource | undefined,
  writes: Write[],
  fail: Fail,
): Promise<void> {
  const target = path.join(s.mountedCniNetDir, s.orchcfgFileName);
  if (!env.orchServiceHost) {
    fail('api_host_missing', 'KUBERNETES_SERVICE_HOST is not set, so the orchconfig cannot name the API server');
    return;
  }
  let token: string;
  if (pluginToken) {
    // The plugin's own token (minted by the agent, or --plugin-token-file), never the agent's.
    const got = await pluginToken.current();
    if ('missing' in got) {
      fail('token_missing', got.missing);
      await dropAgentTokenOrchconfig(s, target, writes);
      return;
    }
    token = got.token;
  } else {
    const t = await serviceAccountToken(s, fail);
    if (t === null) return;
    token = t;
  }
  let caPem: string | undefined;
  if (!s.skipTlsVerify) {
    const caFile = s.orchCaFile || path.join(s.serviceAccountDir, 'ca.crt');
    let ca: string | null;
    try {
      ca = await readRegularTextIfExists(caFile);
    } catch (e) {
      fail(
        e instanceof UnsafeFileError ? 'file_refused' : 'ca_missing',
        `cannot read the CA file: ${(e as Error).message}`,
      );
      return;
    }
    if (ca === null) {
      fail('ca_missing', `CA file ${caFile} is missing; give --orch-ca-file or --skip-tls-verify`);
      return;
    }
    caPem = ca;
  }
  const text = renderOrchconfig({
    host: env.orchServiceHost,
    port: env.orchServicePort,
    token: token.trim(),
    caPem,
    skipTlsVerify: s.skipTlsVerify,
  });
  try {
    // Not through a link (O_NOFOLLOW): one planted here is replaced, and the file it points
    // to neither read nor chmodded. A wrong mode is mended by writing the file again.
    const now = await readRegularFileIfExists(target, { noFollow: true }).catch(() => null);
    if (now?.text !== text || Number(now.stat.mode & 0o7777n) !== s.orchconfigMode) {
      await writeFileAtomic(target, text, { mode: s.orchconfigMode });
      writes.push({ file: target, kind: 'orchconfig', action: 'write' });
    }
  } catch (e) {
    fail('write_failed', `cannot write orchconfig ${target}: ${(e as Error).message}`);
  }
}

/**
 * No plugin token to be had (minting failing, or its token refused): an orchconfig that holds the
 * agent's own token or another of its account goes, for such a token must not stay on the node's
 * disk. That is what a version before the plugin had a token of its own leaves, and on an upgrade
 * it is the previous agent pod's token (the kubelet gives each pod its own): matched by its
 * subject, not its bytes. Only a file in our orchconfig's shape (orchconfig.ts: JSON, one user
 * named mesh-cni) is ours to remove; a file another tool wrote there stays, whatever it holds. Any
 * other orchconfig (an earlier plugin token, maybe still valid) stays. Until a token is minted, a
 * plugin ADD the agent's pod lookup cannot answer then fails closed (CNI error 11, try again later).
 */
async function dropAgentTokenOrchconfig(s: OrchconfigSettings, target: string, writes: Write[]): Promise<void> {
  const own = await readRegularFile(path.join(s.serviceAccountDir, 'token')).then(
    (r) => r.text.trim(),
    () => '',
  );
  if (own === '') return;
  const now = await readRegularFileIfExists(target, { noFollow: true }).then(
    (r) => r?.text ?? null,
    () => null,
  );
  const token = now === null ? null : orchconfigToken(now);
  if (token !== null && agentTokenMatch(token, own) !== null && (await removeFile(target)))
    writes.push({ file: target, kind: 'orchconfig', action: 'remove' });
}

/** The token of an orchconfig as we write it (renderOrchconfig); null for a file of any other shape. */
function orchconfigToken(text: string): string | null {
  let config: unknown;
  try {
    config = JSON.parse(text);
  } catch {
    return null;
  }
  if (typeof config !== 'object' || config === null) return null;
  const { kind, users } = config as { kind?: unknown; users?: unknown };
  if (kind !== 'Config' || !Array.isArray(users) || users.length !== 1) return null;
  const user = users[0] as { name?: unknown; user?: { token?: unknown } } | null;
  return user?.name === 'mesh-cni' && typeof user.user?.token === 'string' ? user.user.token : null;
}

async function serviceAccountToken(s: OrchconfigSettings, fail: Fail): Promise<string | null> {
  const tokenFile = path.join(s.serviceAccountDir, 'token');
  let token: string | null;
  try {
    token = await readRegularTextIfExists(tokenFile);
  } catch (e) {
    fail(
      e instanceof UnsafeFileError ? 'file_refused' : 'token_missing',
      `cannot read the service-account token: ` + `${(e as Error).message}`,
    );
    return null;
  }
  if (token === null || token.trim() === '') {
    fail(
      'token_missing',
      `service-account token ${tokenFile} is ${token === null ? 'missing' : 'empty'}; the ` +
        `orchconfig cannot be written until it appears`,
    );
    return null;
  }
  return token;
}
