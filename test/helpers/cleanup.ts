// What a test made is removed after it, newest first, whether it passed or not: each test defers
// the removal of what it makes as soon as it has made it.

import { afterEach } from 'node:test';

export type Defer = (cleanup: () => Promise<unknown>) => void;

/**
 * Registers an afterEach that runs every cleanup deferred during the test, newest first. A
 * cleanup that fails does not stop the others (the test's own failure is the one to read).
 */
export function cleanupAfterEach(): Defer {
  const cleanups: (() => Promise<unknown>)[] = [];
  afterEach(async () => {
    for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
  });
  return (cleanup) => void cleanups.push(cleanup);
}
