// Which pod object the runtime means by K8S_POD_UID (cni-plugin/shared/poduid.ts), used by the
// plugin's API read, its check of the agent's answer, and the agent's pod lookup alike.

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { isPodWithUid, MIRROR_ANNOTATION } from '../../cni-plugin/shared/poduid.ts';

describe('the pod the runtime named by uid', () => {
  const cases: { name: string; metadata: Record<string, unknown>; uid: string; want: boolean }[] = [
    { name: 'its own uid', metadata: { uid: 'u-1' }, uid: 'u-1', want: true },
    { name: 'another uid (a stale namesake)', metadata: { uid: 'u-2' }, uid: 'u-1', want: false },
    {
      name: 'a static pod: the mirror names the kubelet uid',
      metadata: { uid: 'api-uid', annotations: { [MIRROR_ANNOTATION]: 'hash-1' } },
      uid: 'hash-1',
      want: true,
    },
    {
      name: 'a mirror of another static pod',
      metadata: { uid: 'api-uid', annotations: { [MIRROR_ANNOTATION]: 'hash-2' } },
      uid: 'hash-1',
      want: false,
    },
    {
      name: 'only config.hash, no mirror annotation (not a mirror pod)',
      metadata: { uid: 'api-uid', annotations: { 'kubernetes.io/config.hash': 'hash-1' } },
      uid: 'hash-1',
      want: false,
    },
    {
      name: 'no uid asked: nothing matches',
      metadata: { uid: '', annotations: { [MIRROR_ANNOTATION]: '' } },
      uid: '',
      want: false,
    },
  ];
  for (const c of cases) {
    it(c.name, () => assert.equal(isPodWithUid({ metadata: c.metadata }, c.uid), c.want));
  }
});
