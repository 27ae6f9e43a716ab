// The agent's redirect backend at work (docs/plugin.md "Native nftables"): the choice goes into
// our plugin entry as native_nftables, whatever the template says, and with
// --native-nftables=true on a node that cannot, the running agent is not ready from its start,
// naming the fix, while its entry still says nftables (pods fail closed). The decision and the
// probe themselves: nft-host.test.ts.

import assert from 'node:assert/strict';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, it } from 'node:test';
import { DEFAULT_TEMPLATE, renderEntry, type TemplateValues } from '../../src/install/template.ts';
import { spawnAgent } from '../helpers/agent.ts';
import { startTestApiServer } from '../helpers/apiserver.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { BRIDGE_CONFLIST, makeHostTree } from '../helpers/hosttree.ts';
import { noFirewallPath } from '../helpers/nofirewall.ts';
import { waitFor } from '../helpers/poll.ts';

const defer = cleanupAfterEach();

describe('our entry carries the backend', () => {
  const VALUES: TemplateValues = {
    kubeconfigFilepath: '/etc/cni/net.d/ZZZ-mesh-cni-orchconfig',
    logLevel: 'warn',
    logUdsAddress: '',
    podLookupUdsAddress: '',
    orchServiceHost: '10.0.0.1',
    orchServicePort: '443',
    nodeName: 'node-1',
    hostIp: '',
    cniNetDir: '/etc/cni/net.d',
    cniBinDir: '/opt/cni/bin',
    excludeNamespaces: [],
  };

  it('our entry says native_nftables: true when the agent chose nftables, and has no such key otherwise, whatever the template says', () => {
    assert.equal(renderEntry(DEFAULT_TEMPLATE, { ...VALUES, nativeNftables: true }, 't').native_nftables, true);
    assert.equal('native_nftables' in renderEntry(DEFAULT_TEMPLATE, VALUES, 't'), false);
    const saysTrue = '{"type": "mesh-cni", "native_nftables": true}';
    assert.equal('native_nftables' in renderEntry(saysTrue, { ...VALUES, nativeNftables: false }, 't'), false);
  });
});

describe('the agent with --native-nftables=true on a node that cannot', () => {
  it('is not ready from its start, saying why and the fix, logs its choice, and writes native_nftables: true (fail closed)', async () => {
    const api = await startTestApiServer();
    defer(() => api.close());
    const tree = await makeHostTree({ token: api.token, ca: api.caPem });
    defer(() => tree.remove());
    await mkdir(tree.netDir, { recursive: true });
    await writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
    // The nft found first on PATH fails: this node "cannot".
    const a = spawnAgent(
      tree,
      { 'cleanup-on-exit': 'never', 'native-nftables': 'true' },
      {
        KUBERNETES_SERVICE_HOST: api.host,
        KUBERNETES_SERVICE_PORT: String(api.port),
        NODE_NAME: 'node-1',
        POD_NAMESPACE: 'mesh-system',
        PATH: noFirewallPath(),
      },
    );
    defer(() => a.stop('SIGKILL'));
    const chose = await a.waitForLog((r) => r.msg === 'redirect backend', 'the backend choice', 20_000);
    assert.equal(chose.backend, 'nftables');
    assert.equal(chose.mode, 'true');
    const entry = await waitFor(
      'our entry in the primary config',
      async () => {
        const conf = JSON.parse(await readFile(path.join(tree.netDir, '10-bridge.conflist'), 'utf8')) as {
          plugins: Record<string, unknown>[];
        };
        return conf.plugins.find((p) => p.type === 'mesh-cni');
      },
      20_000,
    );
    assert.equal(entry.native_nftables, true);
    const readyz = await a.get('/readyz');
    assert.equal(readyz.status, 503, readyz.body);
    assert.match(
      readyz.body,
      /^- nftables: --native-nftables=true, but this node cannot run native nftables: .*not on this test's PATH.*install nftables >= 1\.0\.1 built with JSON support .*or set --native-nftables=false/m,
    );
    assert.equal(await a.stop('SIGTERM'), 0, a.stderr());
  });
});
