// npm start: runs install-cni on this machine against ./.sandbox/, a directory tree standing in
// for the host mounts of a node (CNI net and bin dirs, a service account), with metrics on
// :15014 and ControlZ on localhost:9876. Extra flags pass through: npm start -- --log_as_json.
// Ctrl-C stops it and takes mesh-cni out of the sandbox's CNI configs again (the binary stays, as
// on a node): --cleanup-on-exit=always, as the tree is a throw-away one, and `auto` would keep
// everything here (no POD_NAME, no DaemonSet to ask about). `npm start -- --cleanup-on-exit=never`
// keeps it installed.

import fse from 'fs-extra';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { main } from '../src/cmd/install-cni.ts';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
// MESH_SANDBOX_DIR: another tree (tests run the sandbox in a temp dir of their own).
const sandbox = process.env.MESH_SANDBOX_DIR || path.join(root, '.sandbox');
const netDir = path.join(sandbox, 'host/etc/cni/net.d');
const binDir = path.join(sandbox, 'host/opt/cni/bin');
const saDir = path.join(sandbox, 'serviceaccount');
const binariesDir = path.join(root, 'dist/bin');

// fs-extra: the directory tree and sample files, each created only if missing.
for (const d of [netDir, binDir, saDir, path.join(sandbox, 'run/mesh-cni')]) fse.ensureDirSync(d);
if (!fse.readdirSync(netDir).some((n) => /\.(conf|conflist|json)$/.test(n))) {
  fse.outputJsonSync(
    path.join(netDir, '10-bridge.conflist'),
    {
      cniVersion: '1.0.0',
      name: 'sandbox-bridge',
      plugins: [
        {
          type: 'bridge',
          bridge: 'mcni-sandbox0',
          isGateway: true,
          ipMasq: true,
          ipam: { type: 'host-local', ranges: [[{ subnet: '198.18.100.0/24' }]] },
        },
        { type: 'portmap', capabilities: { portMappings: true } },
      ],
    },
    { spaces: 2 },
  );
}
const files: Record<string, string> = {
  token: 'sandbox-token',
  namespace: 'mesh-system',
  'ca.crt': '-----BEGIN CERTIFICATE-----\nsandbox\n-----END CERTIFICATE-----\n',
};
for (const [name, content] of Object.entries(files)) {
  if (!fse.pathExistsSync(path.join(saDir, name))) fse.outputFileSync(path.join(saDir, name), content);
}
// No API server to mint the plugin's token from: the agent is given one as a file.
const pluginToken = path.join(sandbox, 'plugin-token');
if (!fse.pathExistsSync(pluginToken)) fse.outputFileSync(pluginToken, 'sandbox-plugin-token', { mode: 0o600 });
if (!fse.pathExistsSync(path.join(binariesDir, 'mesh-cni'))) {
  console.error(
    `npm start: ${path.join(binariesDir, 'mesh-cni')} is missing; run npm run build first (npm start does)`,
  );
  process.exit(1);
}

console.error(
  `sandbox: ${sandbox}\n  primary CNI config: ${netDir}\n  metrics: http://localhost:15014/metrics  readiness: http://localhost:15014/readyz  ControlZ: http://localhost:9876/\n  (the default ports: with --monitoring-port or --ctrlz_port, the "listening" log lines say where)\n  Ctrl-C: takes mesh-cni out of the sandbox's CNI configs`,
);
process.exit(
  await main(
    [
      `--mounted-cni-net-dir=${netDir}`,
      `--mounted-cni-bin-dir=${binDir}`,
      `--cni-binaries-dir=${binariesDir}`,
      `--service-account-dir=${saDir}`,
      `--plugin-token-file=${pluginToken}`,
      `--log-uds-address=${path.join(sandbox, 'run/mesh-cni/log.sock')}`,
      // No API server here to watch pods from: the plugin would read them from one itself.
      '--pod-lookup-uds-address=',
      '--cleanup-on-exit=always',
      ...process.argv.slice(2),
    ],
    {
      KUBERNETES_SERVICE_HOST: '127.0.0.1',
      KUBERNETES_SERVICE_PORT: '6443',
      NODE_NAME: 'sandbox-node',
      ...process.env,
    },
  ),
);
