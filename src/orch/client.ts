// How the agent itself reaches the API server: an explicit orchconfig file (--orchconfig, for
// running outside a cluster), else in-cluster from the service-account dir and the
// KUBERNETES_SERVICE_HOST/PORT the settings captured. The token is re-read from its file as it
// rotates (client-node's tokenFile auth provider).

// The module itself, not the package index: the index loads every generated API and model.
import { KubeConfig } from '@kubernetes/client-node/dist/config.js';
import path from 'node:path';
import type { Settings } from '../config/settings.ts';
import { serverUrl } from '../install/orchconfig.ts';

export function orchKubeConfig(settings: Settings): KubeConfig {
  const kc = new KubeConfig();
  if (settings.orchconfig) {
    kc.loadFromFile(settings.orchconfig);
    return kc;
  }
  const { orchServiceHost: host, orchServicePort: port } = settings.env;
  if (!host) throw new Error('KUBERNETES_SERVICE_HOST is not set and no --orchconfig was given: cannot reach the API server');
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
