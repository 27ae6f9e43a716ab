// A rewrite storm: the primary CNI's config rewritten `rewrites` times (without our entry)
// while a reader keeps parsing the file the runtime would pick. What the reader counts is what
// a pod starting at that moment would have got: reads that found no entry of ours are pods
// that would have started without mesh-cni. Shared by the storm test and the install bench.

import { once } from 'node:events';
import { Worker } from 'node:worker_threads';

export interface StormResult {
  readonly rewrites: number;
  /** Reads of the file the runtime would pick, during the storm and until the installer settled. */
  readonly reads: number;
  /** Reads that found no entry of ours there. */
  readonly missing: number;
  /** Reads that found no config the runtime would load at all. */
  readonly none: number;
  /** The chains those reads saw (plugin types joined by commas) and how often. */
  readonly chains: Record<string, number>;
}

export interface StormOptions {
  readonly rewrites?: number;
  /** Pause between rewrites (ms), so the installer gets to run between them. */
  readonly gapMs?: number;
  /** Resolves once the installer has caught up after the last rewrite. */
  readonly settled: () => Promise<void>;
}

export async function rewriteStorm(
  netDir: string,
  primaryName: string,
  primaryText: string,
  opts: StormOptions,
): Promise<StormResult> {
  const stop = new SharedArrayBuffer(4);
  const common = { netDir, primaryName, primaryText, rewrites: opts.rewrites ?? 1000, gapMs: opts.gapMs ?? 1, stop };
  const url = new URL('./rewrite-storm-worker.ts', import.meta.url);
  const reader = new Worker(url, { workerData: { ...common, role: 'reader' } });
  const read = once(reader, 'message');
  const writer = new Worker(url, { workerData: { ...common, role: 'writer' } });
  try {
    await once(writer, 'message');
    await opts.settled();
  } finally {
    Atomics.store(new Int32Array(stop), 0, 1);
  }
  const [result] = (await read) as [Omit<StormResult, 'rewrites'>];
  await Promise.all([reader.terminate(), writer.terminate()]);
  return { rewrites: common.rewrites, ...result };
}
