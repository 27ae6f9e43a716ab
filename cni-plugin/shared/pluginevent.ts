// Wire format of the agent's plugin event socket (ambient mode, the entry's
// "pluginevent_uds_address", <run dir>/pluginevent.sock): served by src/ambient/cmdadd.ts,
// asked by cni-plugin/ambient.ts. HTTP/1.1 over the unix socket, one request a connection:
//   POST /cmdadd   {"netns","podName","podNamespace","podUid","ips":[{"interface","address","gateway"}]}
//   200 {"ok":true}                       the pod is enrolled (in-pod rules, ztunnel, ipset, annotated)
//   500 {"ok":false,"reason","message"}   it is not; `reason` says what failed, `message` says it in words
// The IPs are the prevResult's: the kubelet has not published the pod's IP yet when the plugin runs.

export const CMDADD_PATH = '/cmdadd';
/** The socket's name in the agent's run dir (beside the pod lookup and log sockets). */
export const PLUGIN_EVENT_SOCKET = 'pluginevent.sock';
/** The plugin's limit for the whole exchange (Istio's client timeout). */
export const CMDADD_TIMEOUT_MS = 5000;
/** Largest request body the agent reads (a pod has a few IPs: a few hundred bytes). */
export const CMDADD_MAX_BODY_BYTES = 64 * 1024;

/** One of prevResult's ips[] (1.x shape: `interface` is an index into its interfaces[]). */
export interface CmdAddIp {
  readonly interface?: number;
  /** CIDR form, as in the CNI result: 198.18.0.5/24. */
  readonly address: string;
  readonly gateway?: string;
}

export interface CmdAddRequest {
  /** CNI_NETNS as the runtime passed it (a path on the host). */
  readonly netns: string;
  readonly podName: string;
  readonly podNamespace: string;
  /** K8S_POD_UID ('' when the runtime gave none). */
  readonly podUid: string;
  readonly ips: readonly CmdAddIp[];
}

/**
 * What failed: the dataplane's steps (netns, rules, ztunnel, ipset, annotate: the EnrollError
 * reasons) or the agent's checks before them.
 */
export const CMDADD_FAILURES = [
  'netns',
  'rules',
  'ztunnel',
  'ipset',
  'annotate',
  'not_found',
  'not_eligible',
  'bad_request',
  'internal',
] as const;
export type CmdAddFailure = (typeof CMDADD_FAILURES)[number];

export type CmdAddReply =
  { readonly ok: true } | { readonly ok: false; readonly reason: CmdAddFailure; readonly message: string };

/** The request body's shape checked (the agent reads it from anything that can reach the socket); null: not one. */
export function parseCmdAddRequest(v: unknown): CmdAddRequest | null {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return null;
  const o = v as Record<string, unknown>;
  for (const k of ['netns', 'podName', 'podNamespace', 'podUid'] as const) if (typeof o[k] !== 'string') return null;
  if (o.podName === '' || o.podNamespace === '' || o.netns === '') return null;
  if (!Array.isArray(o.ips)) return null;
  const ips: CmdAddIp[] = [];
  for (const ip of o.ips as unknown[]) {
    if (typeof ip !== 'object' || ip === null) return null;
    const i = ip as Record<string, unknown>;
    if (typeof i.address !== 'string' || i.address === '') return null;
    if (i.interface !== undefined && typeof i.interface !== 'number') return null;
    if (i.gateway !== undefined && typeof i.gateway !== 'string') return null;
    ips.push({
      address: i.address,
      ...(i.interface !== undefined ? { interface: i.interface } : {}),
      ...(i.gateway !== undefined ? { gateway: i.gateway } : {}),
    });
  }
  return {
    netns: o.netns as string,
    podName: o.podName as string,
    podNamespace: o.podNamespace as string,
    podUid: o.podUid as string,
    ips,
  };
}
