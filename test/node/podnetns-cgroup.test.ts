// The pod UID in a /proc/<pid>/cgroup text (src/podnetns/cgroup.ts): a table of the shapes the
// kubelet, containerd, CRI-O and podman give, in cgroup v1 (a line per hierarchy), v2 (`0::/`)
// and hybrid files, and of the texts that must name no pod. Our own fixtures: the UIDs and
// container IDs are made up here. The rows marked [istio] cover the behaviour of one of Istio's
// cgroup-path test cases (cni/pkg/nodeagent/podcgroupns_linux_test.go, TestGetContainerIDFromCGroups).

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { podFromCgroupPath, podUidFromCgroup } from '../../src/podnetns/cgroup.ts';

const UID = '5f0e6a1c-7d2b-4c39-9e84-2b61d0a7c3f5';
const UID_SYSTEMD = UID.replaceAll('-', '_');
const OTHER = '0b9d4e27-31aa-4f6e-8c05-77e1f9a2d604';
/** Container IDs: 64 hex digits, as containerd and CRI-O make them. */
const CID = 'a1'.repeat(8) + '5e7c'.repeat(12);
const CID2 = '0d'.repeat(16) + '93f8'.repeat(8);

/**
 * A cgroup v1 file: one line per hierarchy, each at `path` unless `elsewhere` says otherwise;
 * elsewhere[''] adds the v2 line of a hybrid machine.
 */
function v1(path: string, elsewhere: Record<string, string> = {}): string {
  const hierarchies = ['name=systemd', 'pids', 'blkio', 'freezer', 'devices', 'memory', 'cpuset', 'cpuacct', 'cpu'];
  const lines = hierarchies.map((h, i) => `${hierarchies.length - i}:${h}:${elsewhere[h] ?? path}`);
  if (elsewhere[''] !== undefined) lines.push(`0::${elsewhere['']}`);
  return lines.join('\n') + '\n';
}
const v2 = (path: string) => `0::${path}\n`;

// [what, /proc/<pid>/cgroup text, the pod UID it names or null]
const TABLE: [string, string, string | null][] = [
  // Istio's cases, in our words.
  ['[istio] an empty file names no pod', '', null],
  ['[istio] a user session (user.slice) names no pod', '1:name=systemd:/user.slice\n', null],
  [
    '[istio] one hierarchy in a pod container (cgroupfs, no QoS class), another in user.slice',
    `2:name=systemd:/user.slice\n1:pids:/kubepods/pod${UID}/${CID}\n`,
    UID,
  ],
  [
    "[istio] a UID written with systemd's _ comes back with -",
    `2:name=systemd:/user.slice\n1:pids:/kubepods/pod${UID_SYSTEMD}/${CID}\n`,
    UID,
  ],
  [
    '[istio] CRI-O without the UID in its path (KubeEdge; a cgroup namespace) names no pod we could use',
    v2(`/../crio-${CID}.scope`),
    null,
  ],
  [
    '[istio] the same pod with two container IDs (a process caught mid-move between hierarchies): refused',
    `3:name=systemd:/user.slice\n2:pids:/kubepods/pod${UID}/${CID}\n1:cpu:/kubepods/kubepods/besteffort/pod${UID}/${CID2}\n`,
    null,
  ],
  [
    '[istio] two pod UIDs in one file: refused (which pod the process is in cannot be told)',
    `3:name=systemd:/user.slice\n2:pids:/kubepods/pod${UID}/${CID}\n1:cpu:/kubepods/kubepods/besteffort/pod${OTHER}/${CID}\n`,
    null,
  ],
  // containerd.
  [
    'containerd, cgroupfs driver, besteffort, cgroup v1 (every hierarchy)',
    v1(`/kubepods/besteffort/pod${UID}/${CID}`),
    UID,
  ],
  ['containerd, cgroupfs driver, burstable, cgroup v2', v2(`/kubepods/burstable/pod${UID}/${CID}`), UID],
  ['containerd, cgroupfs driver, guaranteed (no QoS dir), cgroup v2', v2(`/kubepods/pod${UID}/${CID}`), UID],
  [
    'containerd, systemd driver, besteffort slice, cgroup v2',
    v2(
      `/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod${UID_SYSTEMD}.slice/cri-containerd-${CID}.scope`,
    ),
    UID,
  ],
  [
    'containerd, systemd driver, burstable slice, cgroup v1',
    v1(
      `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod${UID_SYSTEMD}.slice/cri-containerd-${CID}.scope`,
    ),
    UID,
  ],
  [
    'containerd, systemd driver, guaranteed (directly under kubepods.slice), cgroup v2',
    v2(`/kubepods.slice/kubepods-pod${UID_SYSTEMD}.slice/cri-containerd-${CID}.scope`),
    UID,
  ],
  [
    "containerd, systemd driver as a cgroupfs path (slice:cri-containerd:id, the path's own colons)",
    v2(`/kubepods-besteffort-pod${UID_SYSTEMD}.slice:cri-containerd:${CID}`),
    UID,
  ],
  [
    'kind / a nested runtime: kubepods under a docker container and kubelet.slice',
    v2(
      `/system.slice/docker-${CID2}.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/` +
        `kubelet-kubepods-besteffort-pod${UID_SYSTEMD}.slice/cri-containerd-${CID}.scope`,
    ),
    UID,
  ],
  ['cgroupfs under /docker/<id>/ (kind)', v2(`/docker/${CID2}/kubepods/besteffort/pod${UID}/${CID}`), UID],
  ['seen from inside a cgroup namespace: /../../pod<uid>/<id>', v2(`/../../pod${UID}/${CID}`), UID],
  // CRI-O.
  [
    'CRI-O, systemd driver, burstable, cgroup v2',
    v2(`/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod${UID_SYSTEMD}.slice/crio-${CID}.scope`),
    UID,
  ],
  [
    "CRI-O's conmon (crio-conmon-<id>.scope) names the pod: it is in the host netns, which the scan skips",
    v2(
      `/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod${UID_SYSTEMD}.slice/crio-conmon-${CID}.scope`,
    ),
    UID,
  ],
  ['CRI-O, cgroupfs driver, cgroup v1', v1(`/kubepods/besteffort/pod${UID}/crio-${CID}`), UID],
  // podman with a kubelet-shaped --cgroup-parent (the end-to-end tests' runtime).
  [
    'podman libpod-<id> under --cgroup-parent=/kubepods/besteffort/pod<uid>, cgroup v1',
    v1(`/kubepods/besteffort/pod${UID}/libpod-${CID}`),
    UID,
  ],
  ["podman's conmon under the same parent", v1(`/kubepods/besteffort/pod${UID}/conmon`), UID],
  // Hybrid and partial files.
  [
    'v1 with only one hierarchy in the pod (the others at / or elsewhere) and a v2 line at /',
    v1('/', { pids: `/kubepods/besteffort/pod${UID}/${CID}`, memory: '/process_api/77aa', '': '/' }),
    UID,
  ],
  [
    'hybrid: v1 hierarchies and the v2 line all in the pod',
    v1(`/kubepods/besteffort/pod${UID}/${CID}`, { '': `/kubepods/besteffort/pod${UID}/${CID}` }),
    UID,
  ],
  ['an upper-case UID comes back lower case', v2(`/kubepods/besteffort/pod${UID.toUpperCase()}/${CID}`), UID],
  ['a UID without separators comes back in 8-4-4-4-12 form', v2(`/kubepods/pod${UID.replaceAll('-', '')}/${CID}`), UID],
  // Not a pod.
  ['system.slice (containerd itself)', v2('/system.slice/containerd.service'), null],
  ['user.slice (a login session), cgroup v1', v1('/user.slice/user-0.slice/session-3.scope'), null],
  ['the root cgroup, v2', v2('/'), null],
  ['the root cgroup in every v1 hierarchy', v1('/'), null],
  ['the pod cgroup itself, no container under it', v2(`/kubepods/besteffort/pod${UID}`), null],
  ['the pod cgroup itself with a trailing /', v2(`/kubepods/besteffort/pod${UID}/`), null],
  ['"pod" glued to a word (not after punctuation)', v2(`/kubepods/besteffort/xpod${UID}/${CID}`), null],
  ['more hex after the UID (not a UID)', v2(`/kubepods/besteffort/pod${UID}ab/${CID}`), null],
  ['a UID one digit short', v2(`/kubepods/besteffort/pod${UID.slice(0, -1)}/${CID}`), null],
  ['a path naming two pods (nested kubepods): refused', v2(`/kubepods/pod${OTHER}/kubepods/pod${UID}/${CID}`), null],
  ['the same pod twice in one path is one pod', v2(`/kubepods/pod${UID}/kubepods/pod${UID}/${CID}`), UID],
  [
    'a line that is not hierarchy:controllers:path: not a cgroup file',
    `garbage\n0::/kubepods/pod${UID}/${CID}\n`,
    null,
  ],
];

describe('podUidFromCgroup', () => {
  for (const [what, text, want] of TABLE) {
    it(what, () => assert.equal(podUidFromCgroup(text), want));
  }
});

describe('podFromCgroupPath', () => {
  it('gives the container ID without the .scope suffix or the runtime prefix', () => {
    assert.deepEqual(podFromCgroupPath(`/kubepods-besteffort-pod${UID_SYSTEMD}.slice/cri-containerd-${CID}.scope`), {
      uid: UID,
      containerId: CID,
    });
    assert.deepEqual(podFromCgroupPath(`/kubepods/besteffort/pod${UID}/libpod-${CID}`), { uid: UID, containerId: CID });
  });
  it('says ambiguous, not null, for a path naming two pods', () => {
    assert.equal(podFromCgroupPath(`/kubepods/pod${OTHER}/kubepods/pod${UID}/${CID}`), 'ambiguous');
  });
});
