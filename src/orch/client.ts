// How the agent itself reaches the API server: an explicit orchconfig file (--orchconfig, for
// running outside a cluster), else in-cluster from the service-account dir and the
// KUBERNETES_SERVICE_HOST/PORT the settings captured. The token is re-read from its file as it
// rotates (client-node's tokenFile auth provider). The client is handed its own slice of the
// settings (OrchClientArgs, cut by src/partargs.ts), not the whole.

// The module itself, not the package index: the index loads every generated API and model.
import { KubeConfig } from '@kubernetes/client-node/dist/config.js';
import path from 'node:path';
import type { OrchSettings } from '../config/settings.ts';
import { clientNodeApi, type OrchApi } from './api.ts';
import { orchContext, type RequestLimiter } from './ratelimit.ts';

/** `https://host:port`, with an IPv6 literal in brackets (also the orchconfig's server, install/orchconfig.ts). */
export function serverUrl(host: string, port: string): string {
  const h = host.includes(':') && !host.startsWith('[') ? `[${host}]` : host;
  return `https://${h}${port ? `:${port}` : ''}`;
}

/** What the agent's API client reads of the settings: where the API server is, how to trust it, its limits. */
export interface OrchClientArgs {
  /** --orchconfig; empty: in-cluster. */
  readonly orchconfig: string;
  /** KUBERNETES_SERVICE_HOST and _PORT: the API server, in-cluster. */
  readonly serviceHost: string;
  readonly servicePort: string;
  /** --service-account-dir: the agent's own token (and CA), in-cluster. */
  readonly serviceAccountDir: string;
  /** --orch-ca-file; empty: the service account's ca.crt. */
  readonly orchCaFile: string;
  readonly skipTlsVerify: boolean;
  /** --orch-qps, --orch-burst, --orch-list-mode: one limiter per this object (ratelimit.ts), shared by every reader. */
  readonly limits: OrchSettings;
}

/** The agent's API: its KubeConfig, under its request limiter and with its list settings (ratelimit.ts). */
export function orchApi(args: OrchClientArgs, kc: KubeConfig = orchKubeConfig(args)): OrchApi {
  return clientNodeApi(kc, orchContext(args.limits));
}

/** The rate limit the agent's own requests wait on (--orch-qps/--orch-burst). */
export function orchLimiter(args: OrchClientArgs): RequestLimiter {
  return orchContext(args.limits).limiter;
}

/** How the agent reaches the API server (no limit of its own: each request says which it waits on). */
export function orchKubeConfig(args: OrchClientArgs): KubeConfig {
  const kc = new KubeConfig();
  if (args.orchconfig) {
    try {
      kc.loadFromFile(args.orchconfig);
    } catch (e) {
      // No cause: js-yaml's error quotes the lines around it (a token), and a logged error shows its cause.
      // eslint-disable-next-line preserve-caught-error
      throw new Error(`cannot load --orchconfig ${args.orchconfig}: ${describeLoadError(e)}`);
    }
    return kc;
  }
  const { serviceHost: host, servicePort: port } = args;
  if (!host)
    throw new Error('KUBERNETES_SERVICE_HOST is not set and no --orchconfig was given: cannot reach the API server');
  const sa = args.serviceAccountDir;
  kc.loadFromClusterAndUser(
    {
      name: 'in-cluster',
      server: serverUrl(host, port),
      caFile: args.orchCaFile || path.join(sa, 'ca.crt'),
      skipTLSVerify: args.skipTlsVerify,
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
