// Asks the agent for the pod over its unix socket (wire format: cni-plugin/shared/podlookup.ts):
// about a millisecond where reading it from the API server costs a TLS set-up and
// handshake. Any failure to get an answer is a miss, and the caller asks the API server instead;
// but a socket refused as untrusted (not root's, or below a dir another user can write:
// shared/trustedpath.ts) fails the call with CNI error 11: someone may be standing in for the
// agent, and a node set up so is to be fixed, not worked around pod by pod.
// Only the pod the runtime named by uid counts as an answer: without K8S_POD_UID the agent is not
// asked (its watch cannot tell a pod from one re-created under the same name), and a reply with
// another pod (an older agent matched any uid) is a miss, whatever answers on the socket.

import { CniError, CNI_ERROR } from '../cni/errors.ts';
import type { PodLike } from '../redirect/spec.ts';
import type { PodLookupReply, PodLookupRequest } from '../shared/podlookup.ts';
import { isPodWithUid } from '../shared/poduid.ts';
import { fixTrust } from '../shared/trustedpath.ts';
import { askUnix } from '../unixsocket.ts';

/**
 * A pod with its namespace's labels is kilobytes; the API server stores objects up to 1.5 MiB.
 * More than this is not an agent's answer, and is not held in the plugin's memory.
 */
const MAX_ANSWER_BYTES = 4 * 1024 * 1024;

/** The agent's reply (the wire type), or a miss said here: any failure is one. */
export type AgentAnswer = PodLookupReply<PodLike>;

/** Rejects only with the CniError of a refused socket (see the top). */
export async function podFromAgent(address: string, ref: PodLookupRequest, timeoutMs: number): Promise<AgentAnswer> {
  if (ref.uid === '')
    return {
      miss: 'the runtime passed no K8S_POD_UID, so only the API server can tell which pod of that name is meant',
    };
  // The runtime's own socket (unixsocket.ts): node:net under Bun costs ~5 ms of CPU per call.
  const asked = await askUnix(address, JSON.stringify(ref) + '\n', {
    timeoutMs,
    maxAnswerBytes: MAX_ANSWER_BYTES,
    read: (text) => {
      const nl = text.indexOf('\n');
      return nl < 0 ? null : replyFor(text.slice(0, nl), ref);
    },
  });
  if ('answer' in asked) return asked.answer;
  if ('refused' in asked)
    throw new CniError(
      CNI_ERROR.TRY_AGAIN_LATER,
      `not asking the pod lookup socket ${address} for pod ${ref.namespace}/${ref.name}: ${asked.refused}; not starting the pod`,
      `another user could answer there in the agent's place: ${fixTrust('--pod-lookup-uds-address')}`,
    );
  if ('error' in asked) return { miss: `cannot reach the agent at ${address}: ${asked.error}` };
  if ('closed' in asked) return { miss: 'the agent closed the connection without an answer' };
  if ('tooLong' in asked) return { miss: `the agent sent more than ${asked.tooLong} bytes without ending its answer` };
  return { miss: `the agent did not answer within ${timeoutMs} ms` };
}

/** The agent's one line, checked: only the pod asked for by uid is an answer. */
function replyFor(line: string, ref: PodLookupRequest): AgentAnswer {
  // Anything that throws here ("null", a pod that is not an object) is not a reply.
  try {
    const reply = JSON.parse(line) as { pod?: PodLike; miss?: string; namespaceLabels?: unknown };
    if (reply.pod && typeof reply.pod === 'object') {
      const uid = JSON.stringify(reply.pod.metadata?.uid ?? null);
      const nsLabels = stringMap(reply.namespaceLabels);
      return samePod(reply.pod, ref)
        ? { pod: reply.pod, ...(nsLabels ? { namespaceLabels: nsLabels } : {}) }
        : { miss: `the agent answered with another pod (uid ${uid})` };
    }
    return { miss: typeof reply.miss === 'string' ? reply.miss : 'the agent sent no pod' };
  } catch {
    return { miss: 'the agent sent something that is not JSON' };
  }
}

function samePod(pod: PodLike, ref: PodLookupRequest): boolean {
  const m = pod.metadata;
  return m?.namespace === ref.namespace && m?.name === ref.name && isPodWithUid(pod, ref.uid);
}

/** The namespace's labels when the agent sent a map of strings (ambient mode); anything else: none. */
function stringMap(v: unknown): Record<string, string> | undefined {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return undefined;
  const entries = Object.entries(v);
  return entries.every(([, x]) => typeof x === 'string') ? Object.fromEntries(entries) : undefined;
}
