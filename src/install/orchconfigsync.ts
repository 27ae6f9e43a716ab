// Keeps the orchconfig (orchconfig.ts) in the net dir: the plugin's own token (or, run alone, the
// service-account token), the API server address and the CA, written only when what is there
// differs, in its mode. I/O at the edge of a reconcile pass (reconcile.ts).

import path from 'node:path';
import type { EnvironmentFacts, InstallSettings } from '../config/settings.ts';
import type { PluginTokenSource } from './tokenrequest.ts';
import { removeFile, writeFileAtomic } from './atomicfile.ts';
import type { Write } from './apply.ts';
import { renderOrchconfig } from './orchconfig.ts';
import type { ErrorReason } from './plancontext.ts';
import { readRegularFile, readRegularFileIfExists, readRegularTextIfExists, UnsafeFileError } from './safefile.ts';

type Fail = (reason: ErrorReason, message: string) => void;

/**
 * The orchconfig in place. `pluginToken`: the plugin's token; without one, the service-account
 * token (the installer run alone, in tests).
 */
export async function syncOrchconfig(
  s: InstallSettings,
  env: EnvironmentFacts,
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
 * No plugin token to be had (minting failing): an orchconfig that holds the agent's own
 * service-account token (written by a version before the plugin had a token of its own) goes,
 * for that token must not stay on the node's disk. Until a token is minted, a plugin ADD the
 * agent's pod lookup cannot answer then fails closed (CNI error 11, try again later). Any other
 * orchconfig (an earlier plugin token, maybe still valid) stays.
 */
async function dropAgentTokenOrchconfig(s: InstallSettings, target: string, writes: Write[]): Promise<void> {
  const own = await readRegularFile(path.join(s.serviceAccountDir, 'token')).then(
    (r) => r.text.trim(),
    () => '',
  );
  if (own === '') return;
  const now = await readRegularFileIfExists(target, { noFollow: true }).then(
    (r) => r?.text ?? null,
    () => null,
  );
  if (now !== null && now.includes(own) && (await removeFile(target)))
    writes.push({ file: target, kind: 'orchconfig', action: 'remove' });
}

async function serviceAccountToken(s: InstallSettings, fail: Fail): Promise<string | null> {
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
