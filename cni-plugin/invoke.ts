// One plugin invocation: CNI_* env + stdin -> stdout text and exit code. Split from main.ts so
// tests and the benchmark can import it without running it.
//
// The short calls load only what they need (docs/design.md "Start-up time"): VERSION and DEL of a
// netns that is gone answer from the modules imported here (node:fs and our parsing); the log
// socket (node:net) and the commands (plugin.ts, which loads the lookup and iptables code only when
// a pod needs them) are imported when a call gets that far. esbuild keeps each such module in the
// one bundle behind a lazy initializer, so a call that does not reach it never evaluates it.
// test/node/plugin-lazy.test.ts pins which modules each short call loads.

import { fstatSync, readFileSync, readSync, writeSync } from 'node:fs';
import { CniError, CNI_ERROR } from './cni/errors.ts';
import { parseCommand, parseConfig, parseRequest, versionOf, type Env } from './cni/protocol.ts';
import { SUPPORTED_VERSIONS } from './cni/result.ts';
import type { UdsLog } from './log/udslog.ts';
import { netnsExists } from './netns/guard.ts';

/**
 * All of stdin. Read synchronously while the pipe gives data (no stream set-up on the pod's
 * critical path); a runtime's pipe may be non-blocking and still empty when we start, where a
 * read fails with EAGAIN: the rest is then read as a stream, after what was already read.
 */
async function readStdin(): Promise<string> {
  if (stdinIsTerminal()) return '';
  const chunks: Buffer[] = [];
  try {
    for (;;) {
      const buf = Buffer.allocUnsafe(64 * 1024);
      const n = readSync(0, buf, 0, buf.length, null);
      if (n === 0) return Buffer.concat(chunks).toString('utf8');
      chunks.push(buf.subarray(0, n));
    }
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'EAGAIN') throw stdinError(e);
  }
  try {
    for await (const c of process.stdin) chunks.push(c as Buffer);
    return Buffer.concat(chunks).toString('utf8');
  } catch (e) {
    throw stdinError(e);
  }
}

/** A terminal on stdin (someone typing `mesh-cni` by hand): nothing to read. node:tty (which
 * loads node:net) only for a character device, never for the runtime's pipe. */
function stdinIsTerminal(): boolean {
  try {
    if (!fstatSync(0).isCharacterDevice()) return false;
  } catch {
    return false; // no stdin at all: the read below says so
  }
  return process.getBuiltinModule('node:tty').isatty(0);
}

function stdinError(e: unknown): CniError {
  return new CniError(CNI_ERROR.IO_FAILURE, 'cannot read the network config from stdin', (e as Error).message);
}

export interface ExitAndStdout {
  readonly code: number;
  readonly stdout: string;
}

/** Runs one invocation; never throws. */
export async function run(env: Env, stdinText: () => string | Promise<string>): Promise<ExitAndStdout> {
  let stdin = '';
  let log: UdsLog | null = null;
  try {
    stdin = await stdinText();
    const command = parseCommand(env);
    if (command === 'VERSION') {
      return {
        code: 0,
        stdout: JSON.stringify({ cniVersion: versionOf(stdin), supportedVersions: SUPPORTED_VERSIONS }) + '\n',
      };
    }
    if (command === 'STATUS' || command === 'GC') {
      const config = parseConfig(stdin, command);
      // GC: mesh-cni keeps no per-attachment state outside the pod netns, so nothing is stale.
      if (command === 'STATUS') (await import('./plugin.ts')).cmdStatus(config.orchconfig);
      return { code: 0, stdout: '' };
    }
    const req = parseRequest(env, stdin);
    // DEL of a netns that is gone (a runtime's second DEL, a node after reboot): nothing of ours
    // can be left, so answer at once. cmdDel checks again: the netns may go in between.
    if (command === 'DEL' && !netnsExists(req.netns)) return { code: 0, stdout: '' };
    const [{ UdsLog }, { cmdAdd, cmdCheck, cmdDel }] = await Promise.all([
      import('./log/udslog.ts'),
      import('./plugin.ts'),
    ]);
    log = new UdsLog(req.config.logUdsAddress, req.config.logLevel, {
      command,
      containerID: req.containerId,
      pod: req.pod ? { namespace: req.pod.namespace, name: req.pod.name } : null,
    });
    const started = Date.now();
    let stdout = '';
    if (command === 'ADD') stdout = JSON.stringify(await cmdAdd(req, log)) + '\n';
    else if (command === 'CHECK') await cmdCheck(req, log);
    else await cmdDel(req, log);
    log.debug(`${command} done`, { elapsedMs: Date.now() - started });
    return { code: 0, stdout };
  } catch (e) {
    const err =
      e instanceof CniError
        ? e
        : new CniError(CNI_ERROR.RULES_FAILED, 'internal error in mesh-cni', (e as Error)?.stack ?? String(e));
    if (log) log.error(err.message, { code: err.code, details: err.details });
    else process.stderr.write(`mesh-cni: ${err.message}${err.details ? ': ' + err.details : ''}\n`);
    return { code: 1, stdout: JSON.stringify(err.toJSON(versionOf(stdin))) + '\n' };
  } finally {
    await log?.flush(5);
  }
}

/**
 * Under Bun, a signal the parent ignored stays ignored (Node resets every inherited disposition
 * at start), so a Bun plugin ran on through the SIGTERM that ends a Node one. For each of these
 * the parent left ignored (SigIgn in /proc/self/status), a listener ends us by that signal.
 */
function endOnSignalsParentIgnored(): void {
  if (!('Bun' in globalThis)) return;
  let ignored: bigint;
  try {
    ignored = BigInt('0x' + (/^SigIgn:\s*([0-9a-f]+)$/m.exec(readFileSync('/proc/self/status', 'latin1'))?.[1] ?? '0'));
  } catch {
    return;
  }
  for (const [sig, n] of [
    ['SIGHUP', 1],
    ['SIGINT', 2],
    ['SIGTERM', 15],
  ] as const) {
    if (((ignored >> BigInt(n - 1)) & 1n) === 0n) continue;
    const end = () => {
      process.removeListener(sig, end); // back to the default action, which the kill then takes
      process.kill(process.pid, sig);
      process.exit(128 + n);
    };
    process.on(sig, end);
  }
}

export async function main(): Promise<void> {
  endOnSignalsParentIgnored();
  const out = await run(process.env, readStdin);
  writeResult(out.stdout, out.code);
}

/** Writes the answer with plain write calls (no stream set-up), then exits. */
function writeResult(text: string, code: number): void {
  const buf = Buffer.from(text, 'utf8');
  let off = 0;
  try {
    while (off < buf.length) off += writeSync(1, buf, off);
  } catch (e) {
    // A full non-blocking pipe: the stream waits for room. Anything else (EPIPE: the runtime
    // stopped reading) cannot be reported anywhere but the exit code.
    if ((e as NodeJS.ErrnoException).code === 'EAGAIN') {
      process.stdout.write(buf.subarray(off), () => process.exit(code));
      return;
    }
  }
  process.exit(code);
}
