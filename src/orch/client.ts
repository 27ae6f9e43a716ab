// How the agent itself reaches the API server: an explicit orchconfig file (--orchconfig, for
// running outside a cluster), else in-cluster from the service-account dir and the
// KUBERNETES_SERVICE_HOST/PORT the settings captured. The token is re-read from its file as it
// rotates (client-node's tokenFile auth provider).

// The module itself, not the package index: the index loads every generated API and model.
import { KubeConfig } from '@kubernetes/client-node/dist/config.js';
import path from 'node:path';
import type { Settings } from '../config/settings.ts';
import { clientNodeApi, type OrchApi } from './api.ts';
import { orchContext, type RequestLimiter } from './ratelimit.ts';

/** `https://host:port`, with an IPv6 literal in brackets (also the orchconfig's server, install/orchconfig.ts). */
export function serverUrl(host: string, port: string): string {
  const h = host.includes(':') && !host.startsWith('[') ? `[${host}]` : host;
  return `https://${h}${port ? `:${port}` : ''}`;
}

/** The agent's API: its KubeConfig, under its request limiter and with its list settings (ratelimit.ts). */
export function orchApi(settings: Settings, kc: KubeConfig = orchKubeConfig(settings)): OrchApi {
  // Settings made by hand (tests) may have no orch part: then no limit.
  return clientNodeApi(kc, settings.orch ? orchContext(settings.orch) : undefined);
}

/** The rate limit the agent's own requests wait on (--orch-qps/--orch-burst); none without an orch part. */
export function orchLimiter(settings: Settings): RequestLimiter | undefined {
  return settings.orch ? orchContext(settings.orch).limiter : undefined;
}

/** How the agent reaches the API server (no limit of its own: each request says which it waits on). */
export function orchKubeConfig(settings: Settings): KubeConfig {
  const kc = new KubeConfig();
  if (settings.orchconfig) {
    try {
      kc.loadFromFile(settings.orchconfig);
    } catch (e) {
      // No cause: js-yaml's error quotes the lines around it (a token), and a logged error shows its cause.
      // eslint-disable-next-line preserve-caught-error
      throw new Error(`cannot load --orchconfig ${settings.orchconfig}: ${describeLoadError(e)}`);
    }
    return kc;
  }
  const { orchServiceHost: host, orchServicePort: port } = settings.env;
  if (!host)
    throw new Error('KUBERNETES_SERVICE_HOST is not set and no --orchconfig was given: cannot reach the API server');
  const sa = settings.install.serviceAccountDir;
  kc.loadFromClusterAndUser(
    {
      name: 'in-cluster',
      server: serverUrl(host, port),
      caFile: settings.install.orchCaFile || path.join(sa, 'ca.crt'),
      skipTLSVerify: settings.install.skipTlsVerify,
    },
    { name: 'service-account', authProvider: { name: 'tokenFile', config: { tokenFile: path.join(sa, 'token') } } },
  );
  return kc;
}

/**
 * What went wrong loading an orchconfig, without its text: js-yaml's message quotes the lines
 * around the error (a token line), and this becomes the plugin token's last error on /readyz and
 * a log line. A YAML error is said by its kind and place; other errors (a missing file, a
 * missing field) name no contents and are kept, to their first line.
 */
function describeLoadError(e: unknown): string {
  const y = e as { name?: unknown; reason?: unknown; mark?: { line?: unknown; column?: unknown } };
  if (y?.name === 'YAMLException') {
    let kind = typeof y.reason === 'string' ? y.reason : '';
    // Kinds are plain words ("bad indentation of a mapping entry"); anything quoting is not said.
    if (kind === '' || kind.length > 80 || /["'`]/.test(kind)) kind = 'syntax error';
    const where =
      typeof y.mark?.line === 'number' && typeof y.mark.column === 'number'
        ? ` at line ${y.mark.line + 1} column ${y.mark.column + 1}`
        : '';
    return `not valid YAML (${kind}${where})`;
  }
  return (e instanceof Error ? e.message : String(e)).split('\n')[0]!;
}
