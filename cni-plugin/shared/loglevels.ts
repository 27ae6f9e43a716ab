// Log levels and their ranks, one list for the agent's scopes (--log_output_level), the level
// install-cni writes into our plugin entry (--log-level -> "log_level") and the plugin's own
// threshold on the log socket: a level the agent accepts is one the plugin can parse.

export const LOG_LEVELS = ['none', 'error', 'warn', 'info', 'debug'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];
/** A level a record is written at (`none` only turns output off). */
export type EmitLevel = Exclude<LogLevel, 'none'>;

/** Higher is more verbose: a record is written when its rank is at most the threshold's. */
export const LEVEL_RANK: Readonly<Record<LogLevel, number>> = Object.freeze({
  none: 0,
  error: 1,
  warn: 2,
  info: 3,
  debug: 4,
});

export function isLogLevel(v: unknown): v is LogLevel {
  return typeof v === 'string' && (LOG_LEVELS as readonly string[]).includes(v);
}
