// Where log lines go: --log_target (stdout, stderr, file paths) plus the --log_rotate file. Each
// output takes whole lines; the logger formats a record once and hands the line to all of them.

import path from 'node:path';
import { pino } from 'pino';
import { createStream, type RotatingFileStream } from 'rotating-file-stream';
import { ConfigError, ConfigErrors } from '../config/parse.ts';
import type { LoggingSettings } from '../config/settings.ts';

export interface LogOutput {
  write(line: string): void;
  /** Stops writing; resolves once buffered lines are on disk. */
  close(): Promise<void>;
}

type Stdio = 'stdout' | 'stderr';
const broken: Record<Stdio, boolean> = { stdout: false, stderr: false };
let guarded = false;
const streamOf = (name: Stdio) => (name === 'stdout' ? process.stdout : process.stderr);

function stdioFailed(name: Stdio, e: Error): void {
  if (broken[name]) return;
  broken[name] = true;
  const other: Stdio = name === 'stdout' ? 'stderr' : 'stdout';
  if (broken[other]) return;
  try {
    streamOf(other).write(`install-cni: writing to ${name} failed (${e.message}); its log lines are dropped\n`);
  } catch {
    // Said where it can be; nothing else to do.
  }
}

/**
 * A reader of stdout or stderr that goes away (`| head -c 100`, a log shipper that restarts)
 * makes every later write fail with EPIPE, emitted as an 'error' that would crash the agent,
 * possibly in the middle of its stop. With this, the first failure of either stream is said once
 * on the other, and lines for that stream are dropped from then on: logging never takes the agent
 * down. Idempotent; the agent calls it first, and the first log line does too.
 */
export function guardStdio(): void {
  if (guarded) return;
  guarded = true;
  for (const name of ['stdout', 'stderr'] as const) streamOf(name).on('error', (e: Error) => stdioFailed(name, e));
}

function stdioOutput(name: Stdio): LogOutput {
  return {
    write: (line) => {
      guardStdio();
      if (broken[name]) return;
      try {
        streamOf(name).write(line);
      } catch (e) {
        stdioFailed(name, e as Error);
      }
    },
    close: async () => {},
  };
}

export const stdoutOutput: LogOutput = stdioOutput('stdout');
export const stderrOutput: LogOutput = stdioOutput('stderr');

/** A plain file, appended to with synchronous writes: a SIGKILL loses no line that was logged. */
function fileOutput(file: string): LogOutput {
  let dest: ReturnType<typeof pino.destination>;
  try {
    dest = pino.destination({ dest: file, append: true, mkdir: true, sync: true });
  } catch (e) {
    // A bad flag value like any other: the CLI prints it on one line and exits 2.
    const why = (e as NodeJS.ErrnoException).code ?? (e as Error).message;
    throw new ConfigErrors([
      new ConfigError('--log_target', file, `cannot open it (${why}); give stdout, stderr or a writable file path`),
    ]);
  }
  let failed = false;
  dest.on('error', (e: Error) => {
    // A full disk or a vanished directory must not take the agent down (pino re-emits write
    // errors, which would throw with no listener): say it once on stderr and stop writing.
    if (!failed) process.stderr.write(`install-cni: log target ${file} failed: ${e.message}; logging to it stopped\n`);
    failed = true;
  });
  return {
    write: (line) => {
      if (failed) return;
      try {
        dest.write(line);
      } catch (e) {
        dest.emit('error', e as Error);
      }
    },
    close: () =>
      new Promise((resolve) => {
        if (failed) return resolve();
        dest.once('close', () => resolve());
        dest.end();
      }),
  };
}

/**
 * The --log_rotate file: rotated by size (--log_rotate_max_size, megabytes) and age
 * (--log_rotate_max_age, days), keeping --log_rotate_max_backups rotated files (0: no limit),
 * named `<file>.<yyyymmdd-hhmmss>.<n>` next to it, as lumberjack-style rotation does for Istio.
 */
function rotatingOutput(
  s: Pick<LoggingSettings, 'rotate' | 'rotateMaxAgeDays' | 'rotateMaxBackups' | 'rotateMaxSizeMb'>,
): LogOutput {
  const abs = path.resolve(s.rotate);
  const base = path.basename(abs);
  const stamp = (t: Date) => t.toISOString().replace(/[-:]/g, '').replace('T', '-').slice(0, 15);
  const stream: RotatingFileStream = createStream(
    (time, index) =>
      time === null ? base : `${base}.${stamp(time instanceof Date ? time : new Date(time))}.${index ?? 1}`,
    {
      path: path.dirname(abs),
      // rotating-file-stream's list of rotated files (it prunes by it); hidden, beside the log.
      history: `.${base}.history`,
      size: `${s.rotateMaxSizeMb}M`,
      ...(s.rotateMaxAgeDays > 0 ? { interval: `${s.rotateMaxAgeDays}d` } : {}),
      ...(s.rotateMaxBackups > 0 ? { maxFiles: s.rotateMaxBackups } : {}),
    },
  );
  let failed = false;
  stream.on('error', (e) => {
    // Logging must never take the agent down; say it once on stderr, where an operator looks.
    if (!failed)
      process.stderr.write(
        `install-cni: log rotation file ${abs} failed: ${e.message}; check the directory exists and is writable\n`,
      );
    failed = true;
  });
  stream.on('warning', (e) => process.stderr.write(`install-cni: log rotation ${abs}: ${e.message}\n`));
  return {
    write: (line) => {
      if (!failed) stream.write(line);
    },
    close: () =>
      new Promise((resolve) => {
        if (failed || stream.destroyed) return resolve();
        stream.end(() => resolve());
      }),
  };
}

/** Opens every output the settings name; throws a message naming the target that cannot be opened. */
export function openLogOutputs(
  s: Pick<LoggingSettings, 'targets' | 'rotate' | 'rotateMaxAgeDays' | 'rotateMaxBackups' | 'rotateMaxSizeMb'>,
): LogOutput[] {
  const outputs: LogOutput[] = [];
  try {
    for (const t of new Set(s.targets)) {
      outputs.push(t === 'stdout' ? stdoutOutput : t === 'stderr' ? stderrOutput : fileOutput(t));
    }
    if (s.rotate !== '') outputs.push(rotatingOutput(s));
  } catch (e) {
    for (const o of outputs) void o.close();
    throw e;
  }
  return outputs;
}
