// Whether the installer's last answer can still be trusted. /readyz reports the last pass that
// finished; a pass stuck in a file system call (a hung mount, a file that blocks) would leave
// that answer standing forever. So readiness also asks: is a pass running for too long, and did
// one finish recently enough? Pure: the installer passes the times in.

export interface PassTimes {
  readonly now: number;
  /** When the pass running now started; null when none runs. */
  readonly runningSince: number | null;
  /** When the last pass finished; null before the first. */
  readonly lastFinished: number | null;
  /** When the installer started. */
  readonly started: number;
  readonly intervalMs: number;
  readonly timeoutMs: number;
}

const seconds = (ms: number) => `${(ms / 1000).toFixed(1)} s`;

/** Reasons not to trust the last pass's answer; empty when there are none. */
export function watchdogReasons(t: PassTimes): string[] {
  const reasons: string[] = [];
  if (t.runningSince !== null && t.now - t.runningSince > t.timeoutMs) {
    reasons.push(
      `a reconcile pass has been running for ${seconds(t.now - t.runningSince)}, over --reconcile-timeout ${seconds(t.timeoutMs)}: it is stuck (a file system call that does not return?), so nothing is kept in place until it ends`,
    );
  }
  // A pass is due every interval and may take up to the timeout; one more of each as slack.
  const since = t.lastFinished ?? t.started;
  const due = 2 * (t.intervalMs + t.timeoutMs);
  if (t.now - since > due) {
    reasons.push(
      `${t.lastFinished === null ? 'no reconcile pass has finished since the start' : 'the last reconcile pass finished'} ${seconds(t.now - since)} ago, more than twice --reconcile-interval plus --reconcile-timeout (${seconds(due)}): passes have stopped`,
    );
  }
  return reasons;
}
