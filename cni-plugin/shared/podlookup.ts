// Wire format of the pod lookup socket (the agent's --pod-lookup-uds-address, the entry's
// "pod_lookup_uds_address"): served by src/install/podlookup.ts, asked by
// cni-plugin/orch/agentlookup.ts. One connection per lookup; the agent closes after answering.
//   plugin -> agent   {"namespace":"ns","name":"pod","uid":"<K8S_POD_UID>"}\n
//   agent  -> plugin  {"pod":{...the V1Pod...}}\n   or   {"miss":"<why>"}\n
// With ambient mode on, a hit also carries the labels of the pod's namespace as the agent's
// namespace watch holds them, {"pod":{...},"namespaceLabels":{...}}, so the plugin decides
// whether the pod is ambient without asking the API server; without them it asks.
// UTF-8, one JSON object a line. A request line longer than POD_LOOKUP_MAX_REQUEST_BYTES is
// refused. A reply with another pod than the one asked for is a miss to the plugin (see
// poduid.ts): an older agent matched any uid.

/** The request line: the pod the runtime named (CNI_ARGS K8S_POD_NAMESPACE, K8S_POD_NAME, K8S_POD_UID). */
export interface PodLookupRequest {
  readonly namespace: string;
  readonly name: string;
  /** '' when the runtime gave none: the agent then answers a miss. */
  readonly uid: string;
}

/** The reply line: the pod as the agent's watch holds it, or why not (the plugin asks the API server). */
export type PodLookupReply<Pod> =
  { readonly pod: Pod; readonly namespaceLabels?: Readonly<Record<string, string>> } | { readonly miss: string };

/** Longest request line the agent reads (a namespace, a name and a uid fit many times over). */
export const POD_LOOKUP_MAX_REQUEST_BYTES = 4096;
