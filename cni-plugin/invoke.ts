// One plugin invocation: CNI_* env + stdin -> stdout text and exit code. Split from main.ts so
// tests and the benchmark can import it without running it.

import { CniError, CNI_ERROR } from './cni/errors.ts';
import { parseCommand, parseConfig, parseRequest, versionOf, type Env } from './cni/protocol.ts';
import { SUPPORTED_VERSIONS } from './cni/result.ts';
import { UdsLog } from './log/udslog.ts';
import { cmdAdd, cmdCheck, cmdDel, cmdStatus } from './plugin.ts';

/**
 * All of stdin, read as a stream: the runtime's pipe may be non-blocking and still empty when we
 * start, where a synchronous read fails with EAGAIN.
 */
async function readStdin(): Promise<string> {
  if (process.stdin.isTTY) return '';
  try {
    const chunks: Buffer[] = [];
    for await (const c of process.stdin) chunks.push(c as Buffer);
    return Buffer.concat(chunks).toString('utf8');
  } catch (e) {
    throw new CniError(CNI_ERROR.IO_FAILURE, 'cannot read the network config from stdin', (e as Error).message);
  }
}

export interface Outcome {
  readonly code: number;
  readonly stdout: string;
}

/** Runs one invocation; never throws. */
export async function run(env: Env, stdinText: () => string | Promise<string>): Promise<Outcome> {
  let stdin = '';
  let log: UdsLog | null = null;
  try {
    stdin = await stdinText();
    const command = parseCommand(env);
    if (command === 'VERSION') {
      return { code: 0, stdout: JSON.stringify({ cniVersion: versionOf(stdin), supportedVersions: SUPPORTED_VERSIONS }) + '\n' };
    }
    if (command === 'STATUS' || command === 'GC') {
      const config = parseConfig(stdin, command);
      // GC: mesh-cni keeps no per-attachment state outside the pod netns, so nothing is stale.
      if (command === 'STATUS') cmdStatus(config.orchconfig);
      return { code: 0, stdout: '' };
    }
    const req = parseRequest(env, stdin);
    log = new UdsLog(req.config.logUdsAddress, req.config.logLevel,
      { command, containerID: req.containerId, pod: req.pod ? { namespace: req.pod.namespace, name: req.pod.name } : null });
    const started = Date.now();
    let stdout = '';
    if (command === 'ADD') stdout = JSON.stringify(await cmdAdd(req, log)) + '\n';
    else if (command === 'CHECK') await cmdCheck(req, log);
    else await cmdDel(req, log);
    log.debug(`${command} done`, { elapsedMs: Date.now() - started });
    return { code: 0, stdout };
  } catch (e) {
    const err = e instanceof CniError ? e : new CniError(CNI_ERROR.RULES_FAILED, 'internal error in mesh-cni', (e as Error)?.stack ?? String(e));
    if (log) log.error(err.message, { code: err.code, details: err.details });
    else process.stderr.write(`mesh-cni: ${err.message}${err.details ? ': ' + err.details : ''}\n`);
    return { code: 1, stdout: JSON.stringify(err.toJSON(versionOf(stdin))) + '\n' };
  } finally {
    await log?.flush(5);
  }
}

export async function main(): Promise<void> {
  const out = await run(process.env, readStdin);
  process.stdout.write(out.stdout, () => process.exit(out.code));
}
