// The plugin's commands: which pods get redirect rules (and why the others do not), applying
// them in the pod netns, checking and removing them. Fail closed: a pod that should be
// redirected never gets a success answer without its rules.

import { CniError, CNI_ERROR } from './cni/errors.ts';
import type { CniRequest } from './cni/protocol.ts';
import { convertResult, resultFamilies } from './cni/result.ts';
import type { UdsLog } from './log/udslog.ts';
import { netnsExists, notANamespaceFile, notAPodNetns } from './netns/guard.ts';
import type { Flavour } from './netns/iptables.ts';
import type { PodUserns } from './netns/userns.ts';
import { orchAccessForPod, readOrchconfig } from './orch/orchconfig.ts';
import type { Family } from './redirect/net.ts';
import { AnnotationError, specForPod, type PodLike, type RedirectSpec } from './redirect/spec.ts';
import { sidecarSkipReason } from './shared/sidecar.ts';
import type { FoundPod } from './ambient.ts';

type Decision = { readonly skip: string } | { readonly spec: RedirectSpec };

// How long the agent may take before the plugin asks the API server itself: the agent waits up
// to 250 ms for a pod its watch has not delivered yet.
const AGENT_LOOKUP_TIMEOUT_MS = 400;

/** Skips decided from the request alone, before any lookup (the agent's own pods among them). */
function skipWithoutLookup(req: CniRequest): string | null {
  if (req.pod === null) {
    const missing = ['K8S_POD_NAMESPACE', 'K8S_POD_NAME'].filter((k) => !req.args.get(k));
    return `CNI_ARGS has no ${missing.join(' and ')}: not a Kubernetes pod`;
  }
  if (req.config.excludeNamespaces.includes(req.pod.namespace)) return `namespace ${req.pod.namespace} is excluded`;
  return null;
}

/** Pod lookup (unless ADD's ambient branch did it) + skip logic + annotations, shared by ADD and CHECK. */
async function decide(
  req: CniRequest,
  pod: NonNullable<CniRequest['pod']>,
  log: UdsLog,
  read?: PodLike,
): Promise<Decision> {
  const found = read ?? (await lookupPod(req, pod, log)).pod;
  // The one sidecar predicate (shared/sidecar.ts): the ambient decision of the plugin and the
  // agent calls every other pod ambient, so none is skipped by both.
  const why = sidecarSkipReason(found);
  if (why !== null) return { skip: why };
  try {
    return { spec: specForPod(found) };
  } catch (e) {
    if (e instanceof AnnotationError) {
      throw new CniError(
        CNI_ERROR.BAD_POD_ANNOTATION,
        `pod ${pod.namespace}/${pod.name} has a bad ${e.what}; no rules applied`,
        `${e.message}; fix the ${e.what} and recreate the pod`,
      );
    }
    throw e;
  }
}

// The lookup, flavour and iptables code is imported when a pod gets that far (docs/design.md
// "Start-up time"): an excluded namespace, a call with no pod and a DEL never evaluate what they do
// not run.
const iptables = () => import('./netns/iptables.ts');
const ruleBuilder = () => import('./redirect/rules.ts');
const nftPod = () => import('./netns/nftpod.ts');

/**
 * The pod's own user namespace when it owns CNI_NETNS (a `hostUsers: false` pod), for iptables to
 * run in too (netns/userns.ts); null for every other pod. Throws the error `fail` makes when that
 * cannot be told or done: nothing is written from the host's user namespace instead.
 */
async function podUsernsFor(req: CniRequest, log: UdsLog, fail: (why: string) => Error): Promise<PodUserns | null> {
  const { podUserns } = await import('./netns/userns.ts');
  let userns;
  try {
    userns = await podUserns(req.netns);
  } catch (e) {
    throw fail((e as Error).message);
  }
  if (userns !== null) log.debug("the pod's user namespace owns its netns: entering both", { userns: userns.path });
  return userns;
}

/**
 * The pod from the agent's watch when it has it (with its namespace's labels in ambient mode),
 * else from the API server (fail closed).
 */
async function lookupPod(req: CniRequest, pod: NonNullable<CniRequest['pod']>, log: UdsLog): Promise<FoundPod> {
  if (req.config.podLookupUdsAddress !== '') {
    const { podFromAgent } = await import('./orch/agentlookup.ts');
    const started = Date.now();
    const answer = await podFromAgent(
      req.config.podLookupUdsAddress,
      { namespace: pod.namespace, name: pod.name, uid: pod.uid },
      AGENT_LOOKUP_TIMEOUT_MS,
    );
    if ('pod' in answer) {
      log.debug('pod read from the agent', { elapsedMs: Date.now() - started });
      return answer;
    }
    log.debug('the agent could not answer; asking the API server', { reason: answer.miss });
  }
  const access = orchAccessForPod(req.config.orchconfig);
  let found: PodLike;
  const { getPod, PodLookupError } = await import('./orch/podclient.ts');
  const started = Date.now();
  try {
    found = await getPod(access, pod.namespace, pod.name, {
      timeoutMs: req.config.podLookupTimeoutMs,
      attemptTimeoutMs: req.config.podLookupAttemptTimeoutMs,
      expectUid: pod.uid,
      reloadAccess: () => readOrchconfig(req.config.orchconfig),
      onRetry: (attempt, why, delayMs) => log.debug('pod lookup retry', { attempt, reason: why, delayMs }),
    });
  } catch (e) {
    if (e instanceof PodLookupError) {
      throw new CniError(
        CNI_ERROR.TRY_AGAIN_LATER,
        `cannot read pod ${pod.namespace}/${pod.name} from the API server (${e.reason}); not starting it unredirected`,
        e.message,
      );
    }
    throw new CniError(
      CNI_ERROR.TRY_AGAIN_LATER,
      `cannot read pod ${pod.namespace}/${pod.name} from the API server`,
      (e as Error).message,
    );
  }
  log.debug('pod read from the API server', { elapsedMs: Date.now() - started });
  return { pod: found };
}

function families(result: Record<string, unknown>): Family[] {
  const f = resultFamilies(result);
  return f.has(6) ? (f.has(4) ? [4, 6] : [6]) : [4];
}

async function flavourFor(req: CniRequest, log: UdsLog): Promise<Flavour> {
  if (req.config.iptablesFlavour !== 'auto') return req.config.iptablesFlavour;
  try {
    const [{ cacheFileFor, cachedFlavour }, { detectFlavour }] = await Promise.all([
      import('./netns/flavourcache.ts'),
      iptables(),
    ]);
    const d = await cachedFlavour(cacheFileFor(req.config.logUdsAddress), detectFlavour);
    log.debug('iptables flavour', { flavour: d.flavour, why: d.why, cached: d.cached });
    return d.flavour;
  } catch (e) {
    throw new CniError(CNI_ERROR.RULES_FAILED, 'cannot use iptables on this host', (e as Error).message);
  }
}

function requireNetns(req: CniRequest): void {
  if (!netnsExists(req.netns))
    throw new CniError(
      CNI_ERROR.INVALID_ENV,
      `CNI_NETNS ${req.netns} does not exist`,
      'the pod network namespace is gone or the runtime passed a wrong path',
    );
  refuseHostNetns(req);
}

/** ADD, CHECK and DEL touch nothing in a netns that is not a pod's (the host's). */
function refuseHostNetns(req: CniRequest): void {
  const what = notAPodNetns(req.netns);
  if (what !== null) {
    throw new CniError(
      CNI_ERROR.INVALID_ENV,
      `CNI_NETNS ${req.netns} is not a pod's network namespace; refusing to touch it`,
      `it is ${what}; a runtime passes the pod sandbox's own netns, so check what called mesh-cni ${req.command}`,
    );
  }
}

export async function cmdAdd(req: CniRequest, log: UdsLog): Promise<Record<string, unknown>> {
  const result = convertResult(req.config.prevResult, req.config.cniVersion);
  requireNetns(req);
  const early = skipWithoutLookup(req);
  if (early !== null) {
    log.info(`not redirecting: ${early}`, { reason: early });
    return result;
  }
  // Flavour detection (host iptables-save runs, unless remembered) overlaps the pod lookup;
  // both are on the pod's critical path.
  const flavourP = flavourFor(req, log);
  flavourP.catch(() => {
    /* awaited below when needed */
  });
  let read: PodLike | undefined;
  if (req.config.ambientEnabled) {
    // Ambient mode (cni-plugin/ambient.ts): an ambient pod is the agent's; the others go on to
    // the sidecar decision with the pod already read.
    const [found, { ambientAdd }] = await Promise.all([lookupPod(req, req.pod!, log), import('./ambient.ts')]);
    if (await ambientAdd(req, found, result, log)) {
      await flavourP.catch(() => {});
      return result;
    }
    read = found.pod;
  }
  const d = await decide(req, req.pod!, log, read);
  if ('skip' in d) {
    // A detection under way finishes and is remembered, rather than orphaned at our exit.
    await flavourP.catch(() => {});
    log.info(`not redirecting: ${d.skip}`, { reason: d.skip });
    return result;
  }
  const fams = families(result);
  const cannotApply = (why: string) =>
    new CniError(CNI_ERROR.RULES_FAILED, 'cannot apply the redirect rules in the pod netns', why);
  if (req.config.nativeNftables) {
    await addNative(req, d.spec, fams, flavourP, log, cannotApply);
    return result;
  }
  const flavour = await flavourP;
  const userns = await podUsernsFor(req, log, cannotApply);
  const [{ applyRules, ipBatch }, { buildFamilyRules }] = await Promise.all([iptables(), ruleBuilder()]);
  try {
    // A single family (most pods) restores with a blocking spawn, a little sooner; two run side
    // by side, each nf_tables commit waiting out its own grace period. Our nftables table, left
    // by an ADD before the node switched back to iptables, goes at the same time.
    await Promise.all([
      removeNftLeftover(req.netns, log),
      ...fams.map(async (fam) => {
        const r = buildFamilyRules(d.spec, fam);
        const how = await applyRules(req.netns, flavour, fam, r.restore, fams.length === 1, userns?.path ?? null);
        if (how === 'reconciled') log.debug('rules of ours were there already: replaced', { family: fam });
        await ipBatch(req.netns, fam, r.ipBatch, userns?.path ?? null);
      }),
    ]);
  } catch (e) {
    throw cannotApply((e as Error).message);
  } finally {
    userns?.close();
  }
  log.info('redirect rules applied', {
    families: fams,
    flavour,
    interceptionMode: d.spec.interceptionMode,
    podUserns: userns !== null,
  });
  return result;
}

/**
 * Our nftables table out of a pod redirected with iptables; a host without nft has none. Best
 * effort: on a node that redirects with iptables, an nft that cannot run (the version-skew crash
 * of docs/plugin.md "The image's nft and the node's") must not fail every pod, and a table of
 * ours left from an ADD under nftables only ever redirects into the proxy, never around it.
 */
async function removeNftLeftover(netns: string, log: UdsLog): Promise<void> {
  let gone: 'removed' | 'absent' | 'foreign' | 'no-nft';
  try {
    gone = await (await nftPod()).removePodTable(netns);
  } catch (e) {
    log.warn('cannot check the pod netns for a table of ours left from nftables; going on with iptables', {
      error: (e as Error).message,
    });
    return;
  }
  if (gone === 'removed') log.info('removed our nftables table: this node now redirects with iptables');
  if (gone === 'foreign') log.warn("a table inet mesh_pod that is not mesh-cni's is in the pod netns: left alone");
}

/**
 * ADD with native nftables (`native_nftables: true`): our iptables rules in the netns, if an ADD
 * before the switch left any, go first; then the table, whole, in one nft transaction, and the
 * policy routing. Any failure fails the ADD: the runtime then DELs, which takes out what we wrote.
 */
async function addNative(
  req: CniRequest,
  spec: RedirectSpec,
  fams: readonly Family[],
  flavourP: Promise<Flavour>,
  log: UdsLog,
  cannotApply: (why: string) => CniError,
): Promise<void> {
  const [{ sidecarPlan }, { applyPodTable, podTableBody }] = await Promise.all([ruleBuilder(), nftPod()]);
  const userns = await podUsernsFor(req, log, cannotApply);
  try {
    // Rendered before anything is touched: a plan nft cannot say fails the pod with nothing done.
    const plans = fams.map((fam) => sidecarPlan(spec, fam));
    const body = podTableBody(plans);
    await removeIptablesRules(req, flavourP, userns?.path ?? null, log);
    const how = await applyPodTable(req.netns, body, plans, userns?.path ?? null);
    log.info('redirect rules applied', {
      families: fams,
      backend: 'nftables',
      table: how,
      interceptionMode: spec.interceptionMode,
      podUserns: userns !== null,
    });
  } catch (e) {
    throw cannotApply((e as Error).message);
  } finally {
    userns?.close();
  }
}

/**
 * Our iptables chains and jumps out of the netns, both families. A host where no iptables runs
 * (flavour detection found neither) has none of ours to remove.
 */
async function removeIptablesRules(
  req: CniRequest,
  flavourP: Promise<Flavour>,
  userns: string | null,
  log: UdsLog,
): Promise<void> {
  let flavour: Flavour;
  try {
    flavour = await flavourP;
  } catch (e) {
    log.debug('no iptables on this host: no iptables rules of ours to remove', { why: (e as Error).message });
    return;
  }
  const { removeRules } = await iptables();
  await Promise.all(
    ([4, 6] as const).map(async (fam) => {
      if (await removeRules(req.netns, flavour, fam, userns))
        log.info('removed our iptables rules: this node now redirects with nftables', { family: fam });
    }),
  );
}

export async function cmdCheck(req: CniRequest, log: UdsLog): Promise<void> {
  const result = convertResult(req.config.prevResult, req.config.cniVersion);
  requireNetns(req);
  if (skipWithoutLookup(req) !== null) return;
  const d = await decide(req, req.pod!, log);
  if ('skip' in d) return;
  if (req.config.nativeNftables) return checkNative(req, d.spec, families(result));
  const flavour = await flavourFor(req, log);
  const userns = await podUsernsFor(
    req,
    log,
    (why) => new CniError(CNI_ERROR.RULES_MISMATCH, 'cannot read the redirect rules in the pod netns', why),
  );
  const [{ diffRules, parseRules, save }, { buildFamilyRules }] = await Promise.all([iptables(), ruleBuilder()]);
  const problems: string[] = [];
  try {
    for (const fam of families(result)) {
      const want = parseRules(buildFamilyRules(d.spec, fam).restore);
      const have = parseRules(
        await save(req.netns, flavour, fam, userns?.path ?? null).catch((e: Error) => {
          problems.push(e.message);
          return '';
        }),
      );
      problems.push(...diffRules(want, have).map((p) => `IPv${fam} ${p}`));
    }
  } finally {
    userns?.close();
  }
  if (problems.length > 0) {
    throw new CniError(
      CNI_ERROR.RULES_MISMATCH,
      'redirect rules in the pod netns are missing or changed',
      problems.slice(0, 5).join('; '),
    );
  }
}

/** CHECK with native nftables: our table as the pod's plans make it (shape and digest). */
async function checkNative(req: CniRequest, spec: RedirectSpec, fams: readonly Family[]): Promise<void> {
  const [{ sidecarPlan }, { checkPodTable }] = await Promise.all([ruleBuilder(), nftPod()]);
  let problems: string[];
  try {
    problems = await checkPodTable(
      req.netns,
      fams.map((fam) => sidecarPlan(spec, fam)),
    );
  } catch (e) {
    problems = [(e as Error).message];
  }
  if (problems.length > 0) {
    throw new CniError(
      CNI_ERROR.RULES_MISMATCH,
      'redirect rules in the pod netns are missing or changed',
      problems.slice(0, 5).join('; '),
    );
  }
}

/**
 * Best effort: the netns may be gone (that is success); our jumps and chains go, nothing else.
 * Both backends' rules of ours go, whichever this node uses now: a pod ADDed before a switch
 * leaves nothing behind.
 */
export async function cmdDel(req: CniRequest, log: UdsLog): Promise<void> {
  if (!netnsExists(req.netns)) {
    log.debug('netns already gone', { netns: req.netns });
    return;
  }
  // A FIFO, a directory, an unmounted netns file: no rule of ours can be in it.
  const notNs = notANamespaceFile(req.netns);
  if (notNs !== null) {
    log.debug('nothing to remove: CNI_NETNS is no netns', { netns: req.netns, is: notNs });
    return;
  }
  refuseHostNetns(req);
  const nft = nftPod()
    .then(({ removePodTable }) => removePodTable(req.netns))
    .then(
      (gone) => {
        if (gone === 'removed') log.debug('nftables table removed');
        if (gone === 'foreign')
          log.warn("a table inet mesh_pod that is not mesh-cni's is in the pod netns: left alone");
      },
      (e: Error) => log.warn('could not remove our nftables table (ignored: DEL is best effort)', { error: e.message }),
    );
  try {
    const flavour = await flavourFor(req, log);
    const userns = await podUsernsFor(req, log, (why) => new Error(why));
    const { removeRules } = await iptables();
    try {
      await Promise.all(
        ([4, 6] as const).map(async (fam) => {
          if (await removeRules(req.netns, flavour, fam, userns?.path ?? null))
            log.debug('redirect rules removed', { family: fam });
        }),
      );
    } finally {
      userns?.close();
    }
  } catch (e) {
    // Under native nftables a host without iptables has no iptables rules of ours.
    const level = req.config.nativeNftables ? 'debug' : 'warn';
    log[level]('could not remove redirect rules (ignored: DEL is best effort)', { error: (e as Error).message });
  }
  await nft;
}

/** STATUS (1.1): ready when the orchconfig install-cni writes is usable. */
export function cmdStatus(orchconfig: string): void {
  if (orchconfig === '')
    throw new CniError(CNI_ERROR.NOT_AVAILABLE, 'mesh-cni is not configured', 'orch.orchconfig is empty');
  try {
    readOrchconfig(orchconfig);
  } catch (e) {
    throw new CniError(CNI_ERROR.NOT_AVAILABLE, 'mesh-cni cannot reach the API server', (e as Error).message);
  }
}
