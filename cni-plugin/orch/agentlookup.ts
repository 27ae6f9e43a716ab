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
import { connectUnix, type UnixSocket } from '../unixsocket.ts';

/** The agent's reply (the wire type), or a miss said here: any failure is one. */
export type AgentAnswer = PodLookupReply<PodLike>;

/** Rejects only with the CniError of a refused socket (see the top). */
export function podFromAgent(address: string, ref: PodLookupRequest, timeoutMs: number): Promise<AgentAnswer> {
  if (ref.uid === '')
    return Promise.resolve({
      miss: 'the runtime passed no K8S_POD_UID, so only the API server can tell which pod of that name is meant',
    });
  return new Promise((resolve, reject) => {
    let settled = false;
    let data = '';
    const finish = (answer: AgentAnswer | CniError) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.destroy();
      if (answer instanceof CniError) reject(answer);
      else resolve(answer);
    };
    const timer = setTimeout(() => finish({ miss: `the agent did not answer within ${timeoutMs} ms` }), timeoutMs);
    // The runtime's own socket (unixsocket.ts): node:net under Bun costs ~5 ms of CPU per call.
    const socket: UnixSocket = connectUnix(address, {
      open: () => socket.write(JSON.stringify(ref) + '\n'),
      data: (chunk) => {
        data += chunk;
        const nl = data.indexOf('\n');
        if (nl < 0) return;
        try {
          const reply = JSON.parse(data.slice(0, nl)) as { pod?: PodLike; miss?: string; namespaceLabels?: unknown };
          if (reply.pod && typeof reply.pod === 'object') {
            const uid = JSON.stringify(reply.pod.metadata?.uid ?? null);
            const nsLabels = stringMap(reply.namespaceLabels);
            finish(
              samePod(reply.pod, ref)
                ? { pod: reply.pod, ...(nsLabels ? { namespaceLabels: nsLabels } : {}) }
                : { miss: `the agent answered with another pod (uid ${uid})` },
            );
          } else finish({ miss: typeof reply.miss === 'string' ? reply.miss : 'the agent sent no pod' });
        } catch {
          finish({ miss: 'the agent sent something that is not JSON' });
        }
      },
      error: (message) => finish({ miss: `cannot reach the agent at ${address}: ${message}` }),
      close: () => finish({ miss: 'the agent closed the connection without an answer' }),
      refused: (reason) =>
        finish(
          new CniError(
            CNI_ERROR.TRY_AGAIN_LATER,
            `not asking the pod lookup socket ${address} for pod ${ref.namespace}/${ref.name}: ${reason}; not starting the pod`,
            `another user could answer there in the agent's place: ${fixTrust('--pod-lookup-uds-address')}`,
          ),
        ),
    });
  });
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
