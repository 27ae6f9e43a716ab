// Which pod a process belongs to, from the text of its /proc/<pid>/cgroup. Pure.
//
// The kubelet names a pod's cgroup after its UID in every runtime and cgroup driver we know of:
//   cgroupfs:  /kubepods/besteffort/pod<uid>/<container id>
//   systemd:   /kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid, - as _>.slice/
//              cri-containerd-<id>.scope | crio-<id>.scope | crio-conmon-<id>.scope
//   podman --cgroup-parent=/kubepods/besteffort/pod<uid>:  .../pod<uid>/libpod-<id>
// and a path may sit under a prefix (kind's /docker/<id>/, a nested runtime, a cgroup namespace's
// /../). So, as Istio (after SPIRE) does, the path is not anchored at "kubepods": a UID counts
// when it follows "pod" between punctuation and a container ID (a last segment without
// punctuation) ends the path. A runtime that leaves the UID out (CRI-O under KubeEdge:
// crio-<id>.scope alone) names no pod here: the caller needs the UID, so that is null.
//
// Refused (null), where a wrong answer could point the agent at another pod's netns:
//  - a file whose lines name two different pod UIDs, or the same pod with two different
//    container IDs (a process caught half-way through a move between v1 hierarchies; Istio
//    refuses both too): its other processes (the sandbox is never moved) still find the pod;
//  - a single path naming two different pod UIDs (nested kubepods): Istio takes the first
//    one; we cannot tell which is ours, so neither (a deliberate difference);
//  - a line that is not `hierarchy-ID:controllers:path` (not a cgroup file).

/** ASCII punctuation, as Go's [[:punct:]] that the kubelet shapes are matched with. */
const P = '[!-/:-@\\[-`{-~]';
const NP = '[^!-/:-@\\[-`{-~]';
const X = '[0-9a-fA-F]';
const UID = `${X}{8}${P}?${X}{4}${P}?${X}{4}${P}?${X}{4}${P}?${X}{12}`;
/** Every `<punct>pod<uid><punct>` in a path (lookahead: the closing punctuation may open the next). */
const POD_UID = new RegExp(`${P}pod(${UID})(?=${P})`, 'g');
/** What follows the UID: punctuation-separated segments ending in the container ID. */
const AFTER_UID = new RegExp(`^${P}(?:${NP}+${P})*(${NP}+)$`);

/** A UID as the API server writes it: lower-case 8-4-4-4-12 with dashes (systemd's _ undone). */
function canonicalUid(raw: string): string {
  const hex = raw.replace(/[^0-9a-fA-F]/g, '').toLowerCase();
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

export interface CgroupPod {
  readonly uid: string;
  readonly containerId: string;
}

/** The pod and container one cgroup path names, null when none, 'ambiguous' for two pods in one path. */
export function podFromCgroupPath(cgroupPath: string): CgroupPod | null | 'ambiguous' {
  // A systemd unit's .scope suffix is not part of the container ID.
  const p = cgroupPath.endsWith('.scope') ? cgroupPath.slice(0, -'.scope'.length) : cgroupPath;
  const matches = [...p.matchAll(POD_UID)];
  if (matches.length === 0) return null;
  const uids = new Set(matches.map((m) => canonicalUid(m[1]!)));
  if (uids.size > 1) return 'ambiguous';
  // The container ID ends the path after the (last) UID.
  const last = matches[matches.length - 1]!;
  const rest = AFTER_UID.exec(p.slice(last.index + 'pod'.length + 1 + last[1]!.length));
  if (!rest) return null;
  return { uid: [...uids][0]!, containerId: rest[1]! };
}

/**
 * The pod UID a /proc/<pid>/cgroup text names (cgroup v1: a line per hierarchy; v2: one `0::/`
 * line; hybrid: both), canonical (lower case, dashes), or null: none, or refused (see above).
 */
export function podUidFromCgroup(text: string): string | null {
  let found: CgroupPod | null = null;
  for (const line of text.split('\n')) {
    if (line === '') continue;
    // hierarchy-ID:controllers:path; the path itself may hold colons (systemd's containerd
    // shape kubepods-...slice:cri-containerd:<id>).
    const first = line.indexOf(':');
    const second = first < 0 ? -1 : line.indexOf(':', first + 1);
    if (second < 0) return null;
    const pod = podFromCgroupPath(line.slice(second + 1));
    if (pod === 'ambiguous') return null;
    if (pod === null) continue;
    if (found && (found.uid !== pod.uid || found.containerId !== pod.containerId)) return null;
    found = pod;
  }
  return found?.uid ?? null;
}
