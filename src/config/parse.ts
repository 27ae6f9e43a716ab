// Value parsers shared by every flag: each returns the typed value or throws a ConfigError that
// names the flag, the value given and what is allowed.

import { durationMs } from '../../cni-plugin/shared/duration.ts';

export class ConfigError extends Error {
  readonly flag: string;
  readonly value: string;
  readonly allowed: string;
  constructor(flag: string, value: string, allowed: string) {
    super(`invalid value ${JSON.stringify(value)} for ${flag}: ${allowed}`);
    this.name = 'ConfigError';
    this.flag = flag;
    this.value = value;
    this.allowed = allowed;
  }
}

/** Several bad settings at once: the CLI prints one line each and exits 2. */
export class ConfigErrors extends Error {
  readonly errors: readonly ConfigError[];
  constructor(errors: readonly ConfigError[]) {
    super(errors.map((e) => e.message).join('\n'));
    this.name = 'ConfigErrors';
    this.errors = errors;
  }
}

const TRUE = new Set(['1', 't', 'T', 'true', 'TRUE', 'True']);
const FALSE = new Set(['0', 'f', 'F', 'false', 'FALSE', 'False']);

/** Booleans as Go's strconv.ParseBool reads them, so env settings written for Istio still work. */
export function parseBool(flag: string, value: string): boolean {
  if (TRUE.has(value)) return true;
  if (FALSE.has(value)) return false;
  throw new ConfigError(flag, value, 'expected true or false (also 1/0, t/f)');
}

export function parseInt10(flag: string, value: string, min: number, max: number): number {
  const trimmed = value.trim();
  if (!/^[+-]?\d+$/.test(trimmed)) throw new ConfigError(flag, value, `expected a whole number from ${min} to ${max}`);
  const n = Number(trimmed);
  if (!Number.isSafeInteger(n) || n < min || n > max) {
    throw new ConfigError(flag, value, `expected a whole number from ${min} to ${max}`);
  }
  return n;
}

export function parsePort(flag: string, value: string): number {
  return parseInt10(flag, value, 1, 65535);
}

/**
 * A file mode, written as Istio's install-cni takes it (decimal 384 for 0600) or in octal with a
 * leading 0 or 0o ("0600", "0o600"): only permission bits (0 to 0777) are allowed.
 */
export function parseFileMode(flag: string, value: string): number {
  const v = value.trim();
  let n: number;
  if (/^0o[0-7]+$/i.test(v)) n = parseInt(v.slice(2), 8);
  else if (/^0[0-7]+$/.test(v)) n = parseInt(v, 8);
  else if (/^\d+$/.test(v)) n = Number(v);
  else n = NaN;
  if (!Number.isInteger(n) || n < 0 || n > 0o777) {
    throw new ConfigError(
      flag,
      value,
      'expected a file mode from 0 to 0777 (decimal 0-511, or octal written 0600 or 0o600)',
    );
  }
  return n;
}

export { MAX_TIMER_MS } from '../../cni-plugin/shared/duration.ts';

/** A Go-style duration ("100ms", "5s", "1m30s") in milliseconds, within [min, max]. */
export function parseDuration(flag: string, value: string, opts: { min?: number; max?: number } = {}): number {
  const total = durationMs(value);
  if (total === null) throw new ConfigError(flag, value, 'expected a duration such as 500ms, 5s or 1m30s');
  if (opts.min !== undefined && total < opts.min) {
    throw new ConfigError(flag, value, `expected a duration of at least ${opts.min}ms`);
  }
  if (opts.max !== undefined && total > opts.max) {
    throw new ConfigError(flag, value, `expected a duration of at most ${opts.max}ms`);
  }
  return total;
}

export function parseEnum<T extends string>(flag: string, value: string, choices: readonly T[]): T {
  if ((choices as readonly string[]).includes(value)) return value as T;
  throw new ConfigError(flag, value, `expected one of ${choices.join(', ')}`);
}

/** A comma-separated list; empty items are dropped. */
export function parseList(value: string): string[] {
  return value
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s.length > 0);
}
