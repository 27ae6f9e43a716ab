// Durations as Go writes them ("500ms", "5s", "1m30s"): the agent's flags (Istio's flags are Go
// durations, and env settings written for it must still parse) and mesh-validation's
// --probe-timeout read the same grammar.

/** Longest timer Node.js keeps (longer ones fire after 1 ms): the most a duration here may wait. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

const UNIT_MS: Readonly<Record<string, number>> = {
  ns: 1e-6,
  us: 1e-3,
  µs: 1e-3,
  ms: 1,
  s: 1000,
  m: 60_000,
  h: 3_600_000,
};

/**
 * Milliseconds of a Go-style duration, surrounding blanks ignored; `0` alone needs no unit.
 * null when `text` is not one (the caller says which flag and what is allowed).
 */
export function durationMs(text: string): number | null {
  const v = text.trim();
  if (v === '0') return 0;
  const re = /(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)/gy;
  let total = 0;
  let matched = 0;
  for (let m = re.exec(v); m; m = re.exec(v)) {
    total += Number(m[1]) * (UNIT_MS[m[2]!] ?? NaN);
    matched = re.lastIndex;
  }
  return matched !== v.length || v.length === 0 || !Number.isFinite(total) ? null : total;
}
