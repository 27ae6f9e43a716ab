// Waiting in tests for something that happens asynchronously (a file rewritten, a request seen,
// a log line printed): poll, and fail with what was awaited when it does not come in time.

export interface PollOptions {
  readonly timeoutMs?: number;
  readonly everyMs?: number;
  /** Appended to the timeout error, e.g. the last log lines. */
  readonly context?: () => string;
}

/**
 * Polls `check` until it gives something other than undefined or false, and returns that.
 * A number for `options` is the timeout in ms.
 */
export async function waitFor<T>(
  what: string,
  check: () => T | undefined | false | Promise<T | undefined | false>,
  options: PollOptions | number = {},
): Promise<T> {
  const { timeoutMs = 10_000, everyMs = 20, context } = typeof options === 'number' ? { timeoutMs: options } : options;
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await check();
    if (v !== undefined && v !== false) return v;
    if (Date.now() > deadline)
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${context ? `\n${context()}` : ''}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/** waitFor for a yes/no check, `what` after it. */
export async function eventually(check: () => boolean | Promise<boolean>, what: string, ms = 5000): Promise<void> {
  await waitFor(what, check, { timeoutMs: ms, everyMs: 10 });
}
