// In-place repair of one broken pod (docs/repair.md "Repair in place"): find its running netns on
// this node, program the rules the plugin would have programmed, and prove them with the validation
// check run inside that netns. Only a proof (exit 0) counts as repaired: Istio's users saw
// "repaired" claimed while validation kept failing (istio/istio#56587, #57332); here the claim is
// the check itself.
//
// The netns is entered by fd, never by setns of the agent's own threads: src/podnetns/ finds it
// from the host's /proc and runs `nsenter --net=/proc/self/fd/3` with the fd handed to the child.
// The rules are the plugin's own (cni-plugin/redirect/: specForPod, the rule model, and the
// runner-generic iptables and nft code), written with the backend the node uses (rulewriters.ts),
// only where they differ from what is there.
//
// What the controller does with a failure (retry, fall through to label/delete) is its call
// (controller.ts); here each failure gets a reason and whether trying again can help (`final`).

import { stat } from 'node:fs/promises';
import path from 'node:path';
import type { V1Pod } from '@kubernetes/client-node';
import type { Flavour, NetnsRunner, RunResult } from '../../cni-plugin/redirect/iptables.ts';
import type { Family } from '../../cni-plugin/redirect/net.ts';
import { NftError } from '../../cni-plugin/redirect/nft.ts';
import { hostFlavourDetector } from '../hostnet/flavour.ts';
import { RulesFailed, writeIptables, writeNftables } from './rulewriters.ts';
import { MIRROR_ANNOTATION } from '../../cni-plugin/shared/poduid.ts';
import { AnnotationError, specForPod, type PodLike, type RedirectSpec } from '../../cni-plugin/redirect/spec.ts';

export type InPlaceReason =
  | 'no_netns'
  | 'ip_mismatch'
  | 'rules_failed'
  | 'proof_failed'
  | 'repair_did_not_hold'
  | 'no_capability'
  | 'will_not_restart'
  | 'host_network';

export type InPlaceResult =
  | { readonly ok: true; readonly detail: string }
  | {
      readonly ok: false;
      readonly reason: InPlaceReason;
      readonly detail: string;
      /** No later attempt at this broken state can do better: fall through now. */
      readonly final: boolean;
    }
  /** The agent's stop cut the repair short: it proves nothing and is no failure of the pod. */
  | { readonly ok: false; readonly reason: 'aborted'; readonly detail: string; readonly final: false };

/** The part of a held netns (src/podnetns HeldNetns) repair uses. */
export interface HeldNetnsLike {
  readonly fd: number;
  readonly dev: bigint;
  readonly ino: bigint;
  readonly pid: number;
  close(): void;
}

export type FindResultLike =
  | { readonly ok: true; readonly netns: HeldNetnsLike }
  | { readonly ok: false; readonly reason: 'no_netns' | 'ip_mismatch'; readonly detail: string };

/**
 * What in-place repair needs of src/podnetns (its index.ts), injected so the decision
 * logic is tested with a fake and the real module is wired in by the agent (podNetnsOf).
 */
export interface PodNetns {
  findPodNetns(uid: string, podIPs: readonly string[]): Promise<FindResultLike>;
  runInNetns(
    netns: HeldNetnsLike,
    argv: readonly string[],
    opts?: { readonly input?: string | null; readonly timeoutMs?: number; readonly signal?: AbortSignal },
  ): Promise<RunResult>;
  /** The process the netns was found through still has it (it did not exit meanwhile). */
  stillThere(netns: HeldNetnsLike): Promise<boolean>;
}

/** The real module's functions, as src/podnetns/index.ts exports them. */
export interface PodNetnsModule {
  findPodNetns(
    uid: string,
    podIPs: readonly string[],
    opts: { readonly hostProcDir: string; readonly hostNetnsPath: string },
  ): Promise<FindResultLike>;
  runInNetns: PodNetns['runInNetns'];
}

/** PodNetns over the real module and the host's /proc. */
export function podNetnsOf(mod: PodNetnsModule, opts: { hostProcDir: string; hostNetnsPath: string }): PodNetns {
  return {
    findPodNetns: (uid, ips) => mod.findPodNetns(uid, ips, opts),
    runInNetns: (n, argv, o) => mod.runInNetns(n, argv, o),
    stillThere: async (n) => {
      try {
        const st = await stat(path.join(opts.hostProcDir, String(n.pid), 'ns', 'net'), { bigint: true });
        return st.dev === n.dev && st.ino === n.ino;
      } catch {
        return false;
      }
    },
  };
}

export interface InPlaceOptions {
  readonly netns: PodNetns;
  /** mesh-validation.cjs (settings.repair.validationBundle) and the node binary that runs it. */
  readonly validationBundle: string;
  readonly nodeBinary?: string;
  /** --probe-timeout of the proof: short, the check runs on the repair's path. */
  readonly probeTimeout?: string;
  /**
   * The redirect backend the agent decided at start (--native-nftables and the node): true, the
   * pod's rules are the nftables table inet mesh_pod, as the plugin's entry says; false, iptables.
   */
  readonly nativeNftables?: boolean;
  /** The node's iptables flavour, for a netns with no rules of ours yet (detected once). */
  readonly hostFlavour?: () => Promise<Flavour>;
  /** Time limit of each program run in the netns. */
  readonly runTimeoutMs?: number;
}

/** The pod's IPs as the API server has them (status.podIPs, else status.podIP). */
export function podIPs(pod: V1Pod): string[] {
  const ips = (pod.status?.podIPs ?? []).map((p) => p.ip).filter((ip): ip is string => !!ip);
  if (ips.length === 0 && pod.status?.podIP) ips.push(pod.status.podIP);
  return ips;
}

/** The families to program: those of the pod's IPs (the plugin reads the same from its CNI result). */
export function familiesOf(ips: readonly string[]): Family[] {
  const v4 = ips.some((ip) => ip.includes('.'));
  const v6 = ips.some((ip) => ip.includes(':'));
  return v6 ? (v4 ? [4, 6] : [6]) : [4];
}

const lastLine = (t: string): string =>
  t
    .trim()
    .split('\n')
    .filter((l) => l.trim() !== '')
    .slice(-3)
    .join(' / ');

export class InPlaceRepairer {
  readonly #o: Required<InPlaceOptions>;

  constructor(o: InPlaceOptions) {
    this.#o = {
      nodeBinary: process.execPath,
      probeTimeout: '2s',
      nativeNftables: false,
      hostFlavour: hostFlavourDetector(),
      runTimeoutMs: 10_000,
      ...o,
    };
  }

  /**
   * `signal` aborted (the agent stopping): the program running in the netns is killed and the
   * result is `aborted`, whatever that step gave: a half-run repair proves and disproves nothing.
   */
  async repair(pod: V1Pod, signal?: AbortSignal): Promise<InPlaceResult> {
    const aborted = (what: string): InPlaceResult => ({
      ok: false,
      reason: 'aborted',
      detail: `cut short by the agent's stop; ${what}`,
      final: false,
    });
    const fail = (reason: InPlaceReason, detail: string, final: boolean): InPlaceResult =>
      signal?.aborted ? aborted(`the step then: ${detail}`) : { ok: false, reason, detail, final };
    // A hostNetwork pod's netns is the node's: never program it, whatever a /proc scan would
    // say (the scan's own host-netns guard rests on --host-netns-path being right).
    if (pod.spec?.hostNetwork === true) {
      return fail(
        'host_network',
        "the pod uses hostNetwork: its network namespace is the node's, which is never repaired in place",
        true,
      );
    }
    let spec: RedirectSpec;
    try {
      spec = specForPod(pod as PodLike);
    } catch (e) {
      // The plugin refuses such a pod too (BAD_POD_ANNOTATION): no attempt makes a rule of it.
      if (e instanceof AnnotationError) return fail('rules_failed', `bad ${e.what}: ${e.message}`, true);
      throw e;
    }
    // A static pod runs under the kubelet's UID, which its mirror pod carries in an annotation.
    const uid = pod.metadata?.annotations?.[MIRROR_ANNOTATION] ?? pod.metadata?.uid ?? '';
    const ips = podIPs(pod);
    // No IP yet: the sandbox may still be coming up; a later attempt may find it.
    if (ips.length === 0) return fail('no_netns', 'the pod has no IP in its status yet', false);
    // With the IP known, no netns of this pod holding it on this node will not change by waiting:
    // the sandbox is gone (or not here), or the pod got another netns. Fall through at once.
    let found: FindResultLike;
    try {
      found = await this.#o.netns.findPodNetns(uid, ips);
    } catch (e) {
      // A configuration error (--host-netns-path, --host-proc-dir unusable): no retry mends it.
      return fail('no_netns', (e as Error).message, true);
    }
    if (!found.ok) return fail(found.reason, found.detail, true);
    const netns = found.netns;
    try {
      const where = `in the netns of pod ${pod.metadata?.namespace}/${pod.metadata?.name} (pid ${netns.pid})`;
      const runner: NetnsRunner = {
        where,
        run: (argv, o) =>
          this.#o.netns.runInNetns(netns, argv, { input: o.input ?? null, timeoutMs: this.#o.runTimeoutMs, signal }),
      };
      const families = familiesOf(ips);
      let done: string[];
      try {
        done = this.#o.nativeNftables
          ? await writeNftables(runner, spec, families)
          : await writeIptables(runner, spec, families, this.#o.hostFlavour);
      } catch (e) {
        // Final when no retry can help (the rules cannot be said in nft, no nft on the node, a
        // table of our name not ours): the controller falls through to label/delete at once.
        const final = e instanceof RulesFailed ? e.final : e instanceof NftError && e.permanent;
        return fail('rules_failed', (e as Error).message, final);
      }
      const proof = await this.#o.netns.runInNetns(
        netns,
        [
          this.#o.nodeBinary,
          this.#o.validationBundle,
          '--probe-timeout',
          this.#o.probeTimeout,
          '--termination-log',
          '/dev/null',
        ],
        { timeoutMs: this.#o.runTimeoutMs + 5000, signal },
      );
      if (proof.error !== null || proof.code !== 0) {
        const text = lastLine(proof.stderr) || lastLine(proof.stdout);
        return fail('proof_failed', `validation ${where} ${proof.error ?? `exited ${proof.code}`}: ${text}`, false);
      }
      // Rules in a netns nobody uses any more prove nothing: the process we found it through
      // must still be in it (it may have exited, the sandbox torn down, mid-repair).
      if (!(await this.#o.netns.stillThere(netns))) {
        return fail('no_netns', `the pod's process ${netns.pid} left its netns during the repair`, true);
      }
      if (signal?.aborted) return aborted('the proof passed, but is not taken as a repair while stopping');
      return { ok: true, detail: `${done.join(', ')}; validation passed: ${lastLine(proof.stdout)}` };
    } finally {
      netns.close();
    }
  }
}
