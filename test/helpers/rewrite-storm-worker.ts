// One side of a rewrite storm (rewrite-storm.ts), in its own thread so that it runs truly
// beside the installer: `writer` rewrites the primary config again and again, as a primary CNI
// does on upgrade or restart (temp file + rename, without our entry); `reader` reads the file
// the runtime would pick, as fast as it can, and counts the reads that found no entry of ours.

import { renameSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { parentPort, workerData } from 'node:worker_threads';
import { runtimeView } from './runtime-view.ts';

interface Job {
  readonly role: 'writer' | 'reader';
  readonly netDir: string;
  readonly primaryName: string;
  readonly primaryText: string;
  readonly rewrites: number;
  readonly gapMs: number;
  /** Int32 [0]: set to 1 to stop the reader. */
  readonly stop: SharedArrayBuffer;
}

const job = workerData as Job;
const flag = new Int32Array(job.stop);
const sleep = (ms: number) => Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);

if (job.role === 'writer') {
  const file = path.join(job.netDir, job.primaryName);
  const tmp = path.join(job.netDir, `.${job.primaryName}.storm`);
  const at = job.primaryText.indexOf('{') + 1;
  for (let i = 0; i < job.rewrites; i++) {
    // A new generation each time, so every rewrite is a change to follow.
    writeFileSync(tmp, `${job.primaryText.slice(0, at)}\n  "x-generation": ${i},${job.primaryText.slice(at)}`);
    renameSync(tmp, file);
    if (job.gapMs > 0) sleep(job.gapMs);
  }
  parentPort!.postMessage({ rewrites: job.rewrites });
} else {
  let reads = 0;
  let missing = 0;
  let none = 0;
  const chains = new Map<string, number>();
  while (Atomics.load(flag, 0) === 0) {
    const v = runtimeView(job.netDir);
    reads++;
    if (v.file === null) none++;
    if (v.entries === 0) {
      missing++;
      const k = v.chain.join(',');
      chains.set(k, (chains.get(k) ?? 0) + 1);
    }
  }
  parentPort!.postMessage({ reads, missing, none, chains: Object.fromEntries(chains) });
}
