// The install bench's storm part (the race --mesh-owned-cni-config closes): the real install-cni
// process, and the primary rewritten REWRITES times (temp file + rename, 1 ms apart, no entry of
// ours) while a reader thread parses the file the runtime would pick
// (test/helpers/rewrite-storm.ts, the storm the test runs). One row per mode, from the same storm:
// reads that saw no entry of ours are the pods that would have started without mesh-cni.

import { readFileSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { spawnAgent } from '../../../test/helpers/agent.ts';
import { BRIDGE_CONFLIST, makeHostTree } from '../../../test/helpers/hosttree.ts';
import { rewriteStorm, type StormResult } from '../../../test/helpers/rewrite-storm.ts';
import { runtimeView } from '../../../test/helpers/runtime-view.ts';

async function stormOnce(owned: boolean, rewrites: number): Promise<StormResult> {
  const tree = await makeHostTree();
  const primary = '10-bridge.conflist';
  await fs.writeFile(path.join(tree.netDir, primary), BRIDGE_CONFLIST);
  const agent = spawnAgent(tree, {
    log_output_level: 'default:warn,install:warn',
    'reconcile-interval': '1h',
    'cleanup-on-exit': 'never',
    'mesh-owned-cni-config': String(owned),
  });
  const caughtUp = async (text: string | null) => {
    for (let i = 0; i < 3000; i++) {
      const v = runtimeView(tree.netDir);
      if (v.entries === 1 && (text === null || readFileSync(path.join(tree.netDir, v.file!), 'utf8').includes(text)))
        return;
      await new Promise((r) => setTimeout(r, 10));
    }
    throw new Error(
      `install-cni did not catch up (${owned ? 'owned' : 'spliced'}, waiting for ${text ?? 'our entry'}): ${JSON.stringify(runtimeView(tree.netDir))} ${agent.stderr()}`,
    );
  };
  try {
    await agent.monitoringPort();
    await caughtUp(null);
    return await rewriteStorm(tree.netDir, primary, BRIDGE_CONFLIST, {
      rewrites,
      settled: () => caughtUp(`"x-generation": ${rewrites - 1},`),
    });
  } finally {
    await agent.stop('SIGTERM');
    await tree.remove();
  }
}

export async function benchStorm(rewrites: number, runs: number): Promise<void> {
  const rows: string[] = [];
  for (const owned of [false, true]) {
    const results: StormResult[] = [];
    for (let i = 0; i < runs; i++) results.push(await stormOnce(owned, rewrites));
    const reads = results.reduce((a, r) => a + r.reads, 0);
    const missing = results.reduce((a, r) => a + r.missing, 0);
    const worst = Math.max(...results.map((r) => r.missing));
    rows.push(
      `| ${owned ? 'owned file (--mesh-owned-cni-config)' : 'entry spliced into the primary'} | ${runs} x ${rewrites} | ${reads} | ${missing} (${((100 * missing) / reads).toFixed(2)}%) | ${worst} |`,
    );
  }
  console.log(
    `\nstorm: the primary rewritten ${rewrites} times (1 ms apart) while a reader thread parses the file the runtime would pick; reads that saw no entry of ours, per mode:\n`,
  );
  console.log('| mode | runs x rewrites | reads | reads that saw no entry | worst run |');
  console.log('|---|---|---|---|---|');
  for (const r of rows) console.log(r);
}
