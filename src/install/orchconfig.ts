// The orchconfig (a kubeconfig) the plugin uses to read pods: the API server address, the pod's
// service-account token and the CA to trust. Written as strict JSON, which is valid kubeconfig
// for kubectl and client libraries and lets the plugin read it with JSON.parse alone.

import { serverUrl } from '../orch/client.ts';

export interface OrchconfigInput {
  readonly host: string;
  readonly port: string;
  readonly token: string;
  /** PEM of the CA; omitted with skipTlsVerify. */
  readonly caPem?: string;
  readonly skipTlsVerify: boolean;
}

export function renderOrchconfig(input: OrchconfigInput): string {
  const cluster: Record<string, unknown> = { server: serverUrl(input.host, input.port) };
  if (input.skipTlsVerify) cluster['insecure-skip-tls-verify'] = true;
  else cluster['certificate-authority-data'] = Buffer.from(input.caPem ?? '').toString('base64');
  const config = {
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [{ name: 'local', cluster }],
    users: [{ name: 'mesh-cni', user: { token: input.token } }],
    contexts: [{ name: 'mesh-cni-context', context: { cluster: 'local', user: 'mesh-cni' } }],
    'current-context': 'mesh-cni-context',
  };
  return JSON.stringify(config, null, 2) + '\n';
}
