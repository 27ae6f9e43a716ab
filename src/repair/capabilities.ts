// What in-place repair needs of the agent's process, checked once at start-up (docs/repair.md
// "Repair in place"). The minimum was measured in the image (DEPLOY's note,
// deploy/overlays/repair-in-place): dropping any one of these four makes a step fail:
// - CAP_SYS_PTRACE: open /proc/<pid>/ns/net of a pod process of another uid (EACCES without);
// - CAP_SYS_ADMIN: nsenter's setns into that netns;
// - CAP_NET_ADMIN: iptables-restore/-save, both flavours;
// - CAP_NET_RAW: iptables-legacy-restore/-save (nft does without, but the flavour is the node's).
// Plus the host's /proc mounted and readable, nsenter on PATH, --host-netns-path a namespace file
// (src/podnetns refuses every scan without it: fail closed), and iptables-legacy's lock file
// creatable (it opens it with O_CREAT even without -w: on a read-only /run every legacy restore
// fails). Whatever is missing is named
// once with what to add; in-place repair is then off for the life of the process and broken pods
// go straight to label/delete (metric reason no_capability, per pod).

import { accessSync, closeSync, constants, openSync, readdirSync, readFileSync, statfsSync } from 'node:fs';
import path from 'node:path';

export const IN_PLACE_CAPABILITIES: readonly (readonly [name: string, bit: number])[] = [
  ['CAP_NET_ADMIN', 12],
  ['CAP_NET_RAW', 13],
  ['CAP_SYS_PTRACE', 19],
  ['CAP_SYS_ADMIN', 21],
];

/** The capabilities of IN_PLACE_CAPABILITIES not in the CapEff line of a /proc/<pid>/status text. */
export function missingCapabilities(statusText: string): string[] {
  const m = /^CapEff:\s*([0-9a-fA-F]+)\s*$/m.exec(statusText);
  if (!m) return IN_PLACE_CAPABILITIES.map(([n]) => n);
  const eff = BigInt(`0x${m[1]}`);
  return IN_PLACE_CAPABILITIES.filter(([, bit]) => (eff & (1n << BigInt(bit))) === 0n).map(([n]) => n);
}

export interface InPlaceEnv {
  /** This process's /proc/self/status. */
  readonly selfStatusPath: string;
  readonly hostProcDir: string;
  /** PATH as the agent runs its children (nsenter is looked up on it). */
  readonly path: string;
  /** --host-netns-path: the host's netns, which the scan tells apart from pods' by (dev, ino). */
  readonly hostNetnsPath: string;
  /** iptables-legacy's lock file (its default; the component gives /run as an emptyDir). */
  readonly xtablesLock: string;
}

/** statfs type of a namespace file (NSFS_MAGIC). */
const NSFS_MAGIC = 0x6e736673;

/** Each thing in-place repair lacks, as "what; what to do". Empty: everything is there. */
export function inPlaceMissing(env: InPlaceEnv): string[] {
  const out: string[] = [];
  let status = '';
  try {
    status = readFileSync(env.selfStatusPath, 'utf8');
  } catch (e) {
    out.push(`cannot read ${env.selfStatusPath} (${(e as Error).message}) to check capabilities`);
  }
  if (status !== '') {
    const caps = missingCapabilities(status);
    if (caps.length > 0)
      out.push(
        `capabilities ${caps.join(', ')} (add them to the container's securityContext.capabilities.add, as ` +
          'deploy/overlays/repair-in-place does)',
      );
  }
  try {
    // A pid dir proves it is a proc mount, not an empty directory where the mount was forgotten.
    if (!readdirSync(env.hostProcDir).some((n) => /^\d+$/.test(n))) throw new Error('no process directories in it');
  } catch (e) {
    out.push(
      `the host's /proc at ${env.hostProcDir} (--host-proc-dir): ${(e as Error).message}; mount the host's /proc ` +
        'there read-only (hostPath /proc)',
    );
  }
  const nsenter = env.path
    .split(':')
    .filter((d) => d !== '')
    .map((d) => path.join(d, 'nsenter'))
    .find((f) => {
      try {
        accessSync(f, constants.X_OK);
        return true;
      } catch {
        return false;
      }
    });
  if (nsenter === undefined) out.push(`nsenter, not found on PATH ${env.path}; install util-linux in the image`);
  try {
    if (statfsSync(env.hostNetnsPath).type !== NSFS_MAGIC) throw new Error('not a namespace file');
  } catch (e) {
    out.push(
      `--host-netns-path ${env.hostNetnsPath}: ${(e as Error).message}; set it to a file of the host's network ` +
        "namespace the agent can read (/proc/<pid>/ns/net of a process in the host's netns, under --host-proc-dir)",
    );
  }
  try {
    // As iptables-legacy opens it: read-only, created when missing.
    closeSync(openSync(env.xtablesLock, constants.O_RDONLY | constants.O_CREAT, 0o600));
  } catch (e) {
    out.push(
      `iptables-legacy's lock file ${env.xtablesLock}: ${(e as Error).message}; give the agent a writable /run ` +
        '(deploy/overlays/repair-in-place mounts an emptyDir there)',
    );
  }
  return out;
}
