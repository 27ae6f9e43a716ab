// The plugin entry the installer fixtures in test/node/fixtures/install/ were made with.

import { DEFAULT_TEMPLATE, renderEntry, type TemplateValues } from '../../src/install/template.ts';

export const FIXTURE_VALUES: TemplateValues = {
  kubeconfigFilepath: '/etc/cni/net.d/ZZZ-mesh-cni-orchconfig',
  logLevel: 'warn',
  logUdsAddress: '/var/run/mesh-cni/log.sock',
  podLookupUdsAddress: '/var/run/mesh-cni/pods.sock',
  orchServiceHost: '198.18.96.1',
  orchServicePort: '443',
  nodeName: 'node-1',
  hostIp: '198.18.96.10',
  cniNetDir: '/etc/cni/net.d',
  cniBinDir: '/opt/cni/bin',
  excludeNamespaces: ['mesh-system', 'kube-system'],
};

export const FIXTURE_ENTRY = renderEntry(DEFAULT_TEMPLATE, FIXTURE_VALUES, 'the default template');
