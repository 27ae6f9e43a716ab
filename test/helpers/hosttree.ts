// A temp directory tree standing in for a node's host mounts, as install-cni sees them in its
// container: the CNI net and bin dirs, the binaries to install, a service-account dir laid out
// the way a projected volume is (token and ca.crt behind a `..data` symlink that is swapped
// atomically on rotation).

import { mkdtempSync } from 'node:fs';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';

export interface HostTree {
  readonly root: string;
  readonly netDir: string;
  readonly binDir: string;
  readonly binariesDir: string;
  readonly saDir: string;
  /** Flags that point install-cni at this tree. */
  readonly flags: Record<string, string>;
  /** Env the DaemonSet would give it. */
  readonly env: Record<string, string>;
  /** Swaps token and CA in the way the kubelet rotates a projected volume. */
  rotate(files: { token?: string; 'ca.crt'?: string }): Promise<void>;
  remove(): Promise<void>;
}

export const SAMPLE_CA = '-----BEGIN CERTIFICATE-----\nMIIBdummyCAforTests\n-----END CERTIFICATE-----\n';

let generation = 0;

export async function makeHostTree(opts: { token?: string; ca?: string } = {}): Promise<HostTree> {
  const root = mkdtempSync(path.join(os.tmpdir(), 'mcni-host-'));
  const netDir = path.join(root, 'host/etc/cni/net.d');
  const binDir = path.join(root, 'host/opt/cni/bin');
  const binariesDir = path.join(root, 'image/opt/mesh-cni/bin');
  const saDir = path.join(root, 'serviceaccount');
  for (const d of [netDir, binDir, binariesDir, saDir]) await fs.mkdir(d, { recursive: true });
  await fs.writeFile(path.join(binariesDir, 'mesh-cni'), '#!/bin/sh\necho mesh-cni v1\n', { mode: 0o755 });

  let current: Record<string, string> = {
    token: opts.token ?? 'token-1',
    'ca.crt': opts.ca ?? SAMPLE_CA,
    namespace: 'mesh-system',
  };
  const rotate = async (files: Record<string, string | undefined>) => {
    current = { ...current, ...Object.fromEntries(Object.entries(files).filter(([, v]) => v !== undefined)) } as Record<
      string,
      string
    >;
    const data = path.join(saDir, `..${Date.now()}_${++generation}`);
    await fs.mkdir(data);
    for (const [name, content] of Object.entries(current)) await fs.writeFile(path.join(data, name), content);
    const tmpLink = path.join(saDir, '..data_tmp');
    await fs.symlink(path.basename(data), tmpLink);
    const old = await fs.readlink(path.join(saDir, '..data')).catch(() => null);
    await fs.rename(tmpLink, path.join(saDir, '..data'));
    for (const name of Object.keys(current)) {
      await fs.symlink(path.join('..data', name), path.join(saDir, name)).catch(() => {});
    }
    if (old) await fs.rm(path.join(saDir, old), { recursive: true, force: true });
  };
  await rotate({});
  // A tree not wired to an API server (no token given) cannot have the plugin's token minted:
  // the agent gets one as a file, as an operator could give it (--plugin-token-file).
  const pluginTokenFile = path.join(root, 'plugin-token');
  if (opts.token === undefined) await fs.writeFile(pluginTokenFile, 'plugin-token-1\n', { mode: 0o600 });

  return {
    root,
    netDir,
    binDir,
    binariesDir,
    saDir,
    flags: {
      'mounted-cni-net-dir': netDir,
      'mounted-cni-bin-dir': binDir,
      'cni-binaries-dir': binariesDir,
      'service-account-dir': saDir,
      // The suites on this tree were written for our entry spliced into the primary's file (the
      // default), pinned so they keep testing it whatever the default; the owned file has its
      // own: install-owned*.test.ts, e2e-podman-owned.test.ts.
      'mesh-owned-cni-config': 'false',
      'log-uds-address': path.join(root, 'run/log.sock'),
      'pod-lookup-uds-address': path.join(root, 'run/pods.sock'),
      ...(opts.token === undefined ? { 'plugin-token-file': pluginTokenFile } : {}),
    },
    env: { KUBERNETES_SERVICE_HOST: '198.18.96.1', KUBERNETES_SERVICE_PORT: '443', NODE_NAME: 'node-1' },
    rotate,
    remove: () => fs.rm(root, { recursive: true, force: true }),
  };
}

export const BRIDGE_CONFLIST = `{
  "cniVersion": "1.0.0",
  "name": "bridge-net",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "mcni-br0",
      "ipam": { "type": "host-local", "ranges": [[{ "subnet": "198.18.96.0/24" }]] }
    }
  ]
}
`;

/** A host tree removed after the test that made it (see cleanupAfterEach). */
export async function makeHostTreeFor(
  defer: (cleanup: () => Promise<unknown>) => void,
  opts: { token?: string; ca?: string } = {},
): Promise<HostTree> {
  const t = await makeHostTree(opts);
  defer(() => t.remove());
  return t;
}
