// The agent's footprint, for the DaemonSet's resources: runs the bundled agent (dist/install-cni.js,
// what the image runs) on a sandbox node with the repair controller watching PODS pods of its
// node on the test API server, waits for it to settle, then for SECONDS seconds rewrites the
// primary CNI config (the installer puts our entry back) and adds a pod every second. Prints
// resident memory (now, split into anonymous and file-backed pages such as the node binary, and
// peak) and CPU from /proc, at start-up and after the churn.
//
//   npm run build && node scripts/footprint.ts [PODS=200] [SECONDS=30]

import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startTestApiServer } from '../test/helpers/apiserver.ts';
import { BRIDGE_CONFLIST, makeHostTree } from '../test/helpers/hosttree.ts';
import { testPod } from '../test/helpers/pods.ts';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const pods = Number(process.argv[2] ?? 200);
const seconds = Number(process.argv[3] ?? 30);
const CLK_TCK = 100;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function sample(pid: number) {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kib = (field: string) => Number(new RegExp(`${field}:\\s+(\\d+)`).exec(status)![1]);
  return {
    cpuSeconds: (Number(stat[11]) + Number(stat[12])) / CLK_TCK,
    rssMiB: kib('VmRSS') / 1024,
    anonMiB: kib('RssAnon') / 1024,
    fileMiB: kib('RssFile') / 1024,
    peakRssMiB: kib('VmHWM') / 1024,
  };
}

const api = await startTestApiServer();
const tree = await makeHostTree({ token: api.token, ca: api.caPem });
const primary = path.join(tree.netDir, '10-bridge.conflist');
try {
  await fs.writeFile(primary, BRIDGE_CONFLIST);
  for (let i = 0; i < pods; i++) api.upsertPod(testPod(`pod-${i}`, { node: 'node-1' }));
  const flags = {
    ...tree.flags,
    'monitoring-port': '0',
    ctrlz_port: '0',
    'repair-enabled': 'true',
    'repair-label-pods': 'true',
    'cleanup-on-exit': 'always',
  };
  const child = spawn(
    process.execPath,
    [
      ...(process.env.NODE_FLAGS ?? '').split(' ').filter(Boolean),
      path.join(root, 'dist/install-cni.js'),
      ...Object.entries(flags).map(([k, v]) => `--${k}=${v}`),
    ],
    {
      env: {
        PATH: process.env.PATH ?? '/usr/bin:/bin',
        ...tree.env,
        KUBERNETES_SERVICE_HOST: '127.0.0.1',
        KUBERNETES_SERVICE_PORT: String(api.port),
      },
      stdio: ['ignore', 'ignore', 'inherit'],
    },
  );
  await sleep(5000);
  const settled = sample(child.pid!);
  const t0 = Date.now();
  for (let i = 0; i < seconds; i++) {
    await sleep(1000);
    await fs.writeFile(primary, BRIDGE_CONFLIST);
    api.upsertPod(testPod(`churn-${i}`, { node: 'node-1' }));
  }
  const end = sample(child.pid!);
  const wall = (Date.now() - t0) / 1000;
  console.table({
    'after start-up (5 s)': {
      'RSS MiB': settled.rssMiB.toFixed(1),
      'anon MiB': settled.anonMiB.toFixed(1),
      'file MiB': settled.fileMiB.toFixed(1),
      'peak RSS MiB': settled.peakRssMiB.toFixed(1),
      'CPU s': settled.cpuSeconds.toFixed(2),
      'CPU %': '',
    },
    [`after ${seconds} s of churn`]: {
      'RSS MiB': end.rssMiB.toFixed(1),
      'anon MiB': end.anonMiB.toFixed(1),
      'file MiB': end.fileMiB.toFixed(1),
      'peak RSS MiB': end.peakRssMiB.toFixed(1),
      'CPU s': end.cpuSeconds.toFixed(2),
      'CPU %': (((end.cpuSeconds - settled.cpuSeconds) / wall) * 100).toFixed(2),
    },
  });
  const exited = new Promise((r) => child.once('exit', r));
  child.kill('SIGTERM');
  await exited;
} finally {
  await api.close();
  await tree.remove();
}
