// The ADD of ambient mode (the entry's "ambient_enabled"): a pod the enablement selectors pick is
// handed to the node agent, which programs its netns and gives it to ztunnel (src/ambient/
// cmdadd.ts); the plugin itself writes no rules for it. As Istio's plugin, in its order: after the
// agent's own pods and the excluded namespaces, the pod and its namespace's labels decide, with
// the same pure isAmbientPod the agent's informer uses (shared/enablement.ts), then one POST
// /cmdadd over the agent's unix socket with the prevResult IPs (the kubelet has not published
// the pod's IP yet), at most 5 s.
//
// Fail closed, everywhere: an agent that cannot be reached, is slow or says no, or a socket that
// is not to be trusted (cni-plugin/shared/trustedpath.ts), fails the ADD with code 11 (the
// runtime tries the sandbox again), naming ztunnel when the agent says ztunnel did not take the
// pod. A pod whose namespace cannot be read fails too. Deliberate difference:
// Istio logs a detection error and starts the pod as not ambient (fail open) unless
// ENABLE_AMBIENT_DETECTION_RETRY; an ambient pod started so would run unredirected (docs/plugin.md,
// "Deliberate difference: detection fails closed").

import { CniError, CNI_ERROR } from './cni/errors.ts';
import type { CniRequest } from './cni/protocol.ts';
import type { UdsLog } from './log/udslog.ts';
import { orchAccessForPod, readOrchconfig } from './orch/orchconfig.ts';
import type { PodLike } from './redirect/spec.ts';
import {
  DEFAULT_ENABLEMENT_SELECTORS,
  isAmbientPod,
  labelSelectorMatches,
  parseEnablementSelectors,
  type AmbientRules,
  type EnablementSelector,
  type PodLike as EnablementPod,
} from './shared/enablement.ts';
import {
  CMDADD_PATH,
  CMDADD_TIMEOUT_MS,
  type CmdAddIp,
  type CmdAddReply,
  type CmdAddRequest,
} from './shared/pluginevent.ts';
import { fixTrust } from './shared/trustedpath.ts';
import { askUnix } from './unixsocket.ts';

/** The pod as the lookup found it, with its namespace's labels when the agent sent them. */
export interface FoundPod {
  readonly pod: PodLike;
  readonly namespaceLabels?: Readonly<Record<string, string>>;
}

function selectorsOf(req: CniRequest): readonly EnablementSelector[] {
  if (req.config.enablementSelectors === undefined) return DEFAULT_ENABLEMENT_SELECTORS;
  try {
    return parseEnablementSelectors(req.config.enablementSelectors);
  } catch (e) {
    throw new CniError(
      CNI_ERROR.INVALID_CONFIG,
      'invalid network config: enablement_selectors',
      `${(e as Error).message}; install-cni writes --ambient-enablement-selector there`,
    );
  }
}

/**
 * Ambient mode's part of an ADD: true when the pod is ambient and the agent enrolled it (the ADD
 * answers prevResult, no sidecar work); false when it is not ambient (the sidecar path decides).
 * Throws CniError 11 when the pod is ambient and not enrolled, or when its namespace cannot be read.
 */
export async function ambientAdd(
  req: CniRequest,
  found: FoundPod,
  result: Record<string, unknown>,
  log: UdsLog,
): Promise<boolean> {
  const ref = req.pod!;
  const rules: AmbientRules = { excludeNamespaces: req.config.excludeNamespaces };
  const selectors = selectorsOf(req);
  // The redirect spec's pod type does not name hostNetwork: read it from the object as it came.
  // The containers go with it: whether the sidecar path takes the pod is part of the decision.
  const hostNetwork = (found.pod.spec as { hostNetwork?: unknown } | undefined)?.hostNetwork === true;
  const pod: EnablementPod = { metadata: found.pod.metadata, spec: { ...found.pod.spec, hostNetwork } };
  // What the pod alone rules out (host network, a sidecar, labelled none) needs no namespace read.
  if (!isAmbientPod(pod, undefined, [{}], rules)) {
    log.debug('not ambient: host network, a sidecar or labelled out');
    return false;
  }
  // No selector takes the pod's labels: no namespace can make it ambient, none is read.
  if (!selectors.some((s) => labelSelectorMatches(s.podSelector, pod.metadata?.labels))) {
    log.debug('not ambient: no enablement selector matches the pod');
    return false;
  }
  let nsLabels = found.namespaceLabels ?? (await namespaceLabelsFromApi(req, log));
  if (!isAmbientPod(pod, nsLabels, selectors, rules) && found.namespaceLabels !== undefined) {
    // The agent's namespace watch may be behind a relabel (backing off, relisting, slow): its
    // "not ambient" would start an ambient pod unredirected until the informer catches up. A
    // "no" is confirmed with the API server; a "yes" needs no check (the agent decides again).
    nsLabels = await namespaceLabelsFromApi(req, log);
  }
  if (!isAmbientPod(pod, nsLabels, selectors, rules)) {
    log.debug('not ambient: no enablement selector matches');
    return false;
  }
  const body: CmdAddRequest = {
    netns: req.netns,
    podName: ref.name,
    podNamespace: ref.namespace,
    podUid: ref.uid,
    ips: ipsOf(result),
  };
  const started = Date.now();
  const answer = await postCmdAdd(req.config.pluginEventUdsAddress, body, CMDADD_TIMEOUT_MS);
  const what = `${ref.namespace}/${ref.name}`;
  if ('refused' in answer) {
    // Not "the agent is down": someone else may be answering there (docs/security.md).
    throw new CniError(
      CNI_ERROR.TRY_AGAIN_LATER,
      `not handing ambient pod ${what} to the plugin event socket ${req.config.pluginEventUdsAddress}: ` +
        `${answer.refused}; not starting it unredirected`,
      `another user could answer there in the agent's place: ${fixTrust('--pluginevent-uds-address')}`,
    );
  }
  if ('error' in answer && answer.timedOut === true) {
    // Connected and sent: the agent is there, and what it waits on that long is ztunnel's ack
    // (its limit equals ours), so the error names ztunnel, as every ztunnel failure's error does.
    throw new CniError(
      CNI_ERROR.TRY_AGAIN_LATER,
      `the mesh node agent did not finish enrolling ambient pod ${what} within ${CMDADD_TIMEOUT_MS / 1000} s; ` +
        'not starting it unredirected',
      `${answer.error}; the agent waits up to 5 s for ztunnel to take a pod: check that ztunnel runs on this node ` +
        "and answers, then the agent's log (the runtime retries the pod)",
    );
  }
  if ('error' in answer) {
    throw new CniError(
      CNI_ERROR.TRY_AGAIN_LATER,
      `cannot reach the mesh node agent to enroll ambient pod ${what}; not starting it unredirected`,
      `${answer.error}; check that the mesh-cni agent runs on this node and is ready (the runtime retries the pod)`,
    );
  }
  if (answer.status !== 200) {
    const reply = replyOf(answer.body);
    const why = reply?.ok === false ? reply.message : answer.body.trim().slice(0, 500) || '(no text)';
    const byZtunnel = reply?.ok === false && reply.reason === 'ztunnel';
    throw new CniError(
      CNI_ERROR.TRY_AGAIN_LATER,
      byZtunnel
        ? `ztunnel did not take ambient pod ${what}; not starting it unredirected`
        : `the mesh node agent could not enroll ambient pod ${what} (HTTP ${answer.status}); not starting it unredirected`,
      byZtunnel
        ? `${why}; check that ztunnel runs on this node and is connected to the agent (the runtime retries the pod)`
        : why,
    );
  }
  log.info('ambient pod enrolled by the node agent', { elapsedMs: Date.now() - started, ips: body.ips.length });
  return true;
}

/** prevResult's ips[] (already converted to the config's version: 0.x adds `version`, dropped here). */
function ipsOf(result: Record<string, unknown>): CmdAddIp[] {
  const ips = Array.isArray(result.ips) ? (result.ips as Record<string, unknown>[]) : [];
  return ips
    .filter((ip) => typeof ip?.address === 'string')
    .map((ip) => ({
      address: ip.address as string,
      ...(typeof ip.interface === 'number' ? { interface: ip.interface } : {}),
      ...(typeof ip.gateway === 'string' ? { gateway: ip.gateway } : {}),
    }));
}

function replyOf(body: string): CmdAddReply | null {
  try {
    const r = JSON.parse(body) as CmdAddReply;
    return typeof r === 'object' && r !== null && typeof r.ok === 'boolean' ? r : null;
  } catch {
    return null;
  }
}

async function namespaceLabelsFromApi(req: CniRequest, log: UdsLog): Promise<Record<string, string>> {
  const ns = req.pod!.namespace;
  const access = orchAccessForPod(req.config.orchconfig);
  const [{ getNamespaceLabels }, { PodLookupError }] = await Promise.all([
    import('./orch/nsclient.ts'),
    import('./orch/podclient.ts'),
  ]);
  const started = Date.now();
  try {
    const labels = await getNamespaceLabels(access, ns, {
      timeoutMs: req.config.podLookupTimeoutMs,
      attemptTimeoutMs: req.config.podLookupAttemptTimeoutMs,
      reloadAccess: () => readOrchconfig(req.config.orchconfig),
      onRetry: (attempt, why, delayMs) => log.debug('namespace lookup retry', { attempt, reason: why, delayMs }),
    });
    log.debug('namespace read from the API server', { elapsedMs: Date.now() - started });
    return labels;
  } catch (e) {
    const reason = e instanceof PodLookupError ? ` (${e.reason})` : '';
    throw new CniError(
      CNI_ERROR.TRY_AGAIN_LATER,
      `cannot read namespace ${ns} from the API server${reason}: cannot tell whether the pod is ambient; not starting it`,
      (e as Error).message,
    );
  }
}

export type PostAnswer =
  | { readonly status: number; readonly body: string }
  /** timedOut: connected and the request written, then no answer in time. */
  | { readonly error: string; readonly timedOut?: boolean }
  /** Not connected: the socket is not to be trusted (why, shared/trustedpath.ts). */
  | { readonly refused: string };

/** The agent's answer to /cmdadd is a status and a line of JSON: more is not the agent's answer. */
const MAX_ANSWER_BYTES = 1024 * 1024;

/**
 * One HTTP/1.1 POST over the unix socket at `address`, on the runtime's own socket (unixsocket.ts:
 * Bun.connect under Bun, node:net under Node; node:http under Bun costs what node:net does and
 * more). The agent answers with Content-Length and closes. Never throws.
 */
export function postCmdAdd(address: string, body: CmdAddRequest, timeoutMs: number): Promise<PostAnswer> {
  const payload = JSON.stringify(body);
  const request =
    `POST ${CMDADD_PATH} HTTP/1.1\r\nHost: mesh-cni-agent\r\nContent-Type: application/json\r\n` +
    `Content-Length: ${Buffer.byteLength(payload)}\r\nConnection: close\r\n\r\n${payload}`;
  return askUnix(address, request, {
    timeoutMs,
    maxAnswerBytes: MAX_ANSWER_BYTES,
    read: (text, closed) => parseResponse(text, closed),
  }).then((asked): PostAnswer => {
    if ('answer' in asked) return asked.answer;
    if ('refused' in asked) return { refused: asked.refused };
    if ('error' in asked) return { error: `cannot reach the agent at ${address}: ${asked.error}` };
    if ('closed' in asked) return { error: `the agent at ${address} closed without an answer` };
    if ('tooLong' in asked) return { error: `the agent at ${address} sent more than ${asked.tooLong} bytes of answer` };
    return { error: `the agent did not answer on ${address} within ${timeoutMs} ms`, timedOut: asked.sent };
  });
}

/** The status and body once complete (Content-Length, or the close when there is none); null: not yet. */
export function parseResponse(text: string, closed: boolean): PostAnswer | null {
  const end = text.indexOf('\r\n\r\n');
  if (end < 0) return closed && text !== '' ? { error: 'the agent sent a truncated HTTP answer' } : null;
  const [statusLine = '', ...headers] = text.slice(0, end).split('\r\n');
  const m = /^HTTP\/1\.[01] (\d{3})/.exec(statusLine);
  if (!m) return { error: `the agent sent no HTTP answer: ${JSON.stringify(statusLine.slice(0, 80))}` };
  const body = text.slice(end + 4);
  if (headers.some((h) => /^transfer-encoding:.*chunked/i.test(h))) {
    const decoded = dechunk(body);
    if (decoded === null) return closed ? { error: 'the agent sent a truncated HTTP answer' } : null;
    return { status: Number(m[1]), body: decoded };
  }
  const lengthHeader = headers.find((h) => /^content-length:/i.test(h));
  if (lengthHeader !== undefined) {
    const want = Number(lengthHeader.slice(lengthHeader.indexOf(':') + 1).trim());
    if (Buffer.byteLength(body) < want) return closed ? { error: 'the agent sent a truncated HTTP answer' } : null;
  } else if (!closed) return null;
  return { status: Number(m[1]), body };
}

/** A chunked body decoded once its last chunk is in; null: not yet (sizes count bytes, the text is decoded). */
function dechunk(text: string): string | null {
  const bytes = Buffer.from(text, 'utf8');
  const parts: Buffer[] = [];
  let at = 0;
  for (;;) {
    const eol = bytes.indexOf('\r\n', at);
    if (eol < 0) return null;
    const size = parseInt(bytes.subarray(at, eol).toString('latin1'), 16);
    if (!Number.isFinite(size)) return null;
    if (size === 0) return Buffer.concat(parts).toString('utf8');
    if (bytes.length < eol + 2 + size + 2) return null;
    parts.push(bytes.subarray(eol + 2, eol + 2 + size));
    at = eol + 2 + size + 2;
  }
}
