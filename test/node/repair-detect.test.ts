// Pure parts of the repair controller: broken-pod detection, selectors, backoff, token bucket,
// and the start-up validation of the selector flags.

import type { V1Pod } from '@kubernetes/client-node';
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ConfigErrors } from '../../src/config/parse.ts';
import { buildSettings } from '../../src/config/settings.ts';
import { podQuery, repairMode } from '../../src/repair/controller.ts';
import { detectBroken, type BrokenCriteria } from '../../src/repair/detect.ts';
import { Backoff, TokenBucket, type Clock } from '../../src/orch/limits.ts';
import { runBin } from '../helpers/cli.ts';
import { brokenPod, testPod } from '../helpers/pods.ts';

const criteria: BrokenCriteria = {
  sidecarAnnotation: 'sidecar.mesh.io/status',
  initContainerName: 'mesh-validation',
  initContainerExitCode: 126,
  initContainerTerminationMessage: '',
};

function withUid(p: V1Pod, uid = 'uid-1'): V1Pod {
  p.metadata!.uid = uid;
  return p;
}

describe('detectBroken', () => {
  const cases: Array<{ name: string; pod: V1Pod; c?: Partial<BrokenCriteria>; broken: boolean }> = [
    { name: 'current state exited 126', pod: brokenPod('a'), broken: true },
    { name: 'last state exited 126 (kubelet restarted it)', pod: brokenPod('a', { where: 'lastState' }), broken: true },
    { name: 'exited 0', pod: testPod('a', { initExitCode: 0 }), broken: false },
    {
      // Its last run passed (repaired in place, or fixed otherwise); lastState keeps the old 126
      // for the pod's life. An agent restart (rolling upgrade) must not act on it again.
      name: 'exited 0 after a run that exited 126 (state passed, lastState 126)',
      pod: (() => {
        const p = brokenPod('a', { where: 'lastState' });
        p.status!.initContainerStatuses![0]!.state = { terminated: { exitCode: 0, reason: 'Completed' } };
        return p;
      })(),
      broken: false,
    },
    {
      name: 'running again after a run that exited 126 (lastState 126): still broken until it passes',
      pod: (() => {
        const p = brokenPod('a', { where: 'lastState' });
        p.status!.initContainerStatuses![0]!.state = { running: { startedAt: new Date() } };
        return p;
      })(),
      broken: true,
    },
    { name: 'exited 1', pod: testPod('a', { initExitCode: 1 }), broken: false },
    { name: 'not run yet', pod: testPod('a'), broken: false },
    { name: 'no sidecar annotation', pod: brokenPod('a', { meshed: false }), broken: false },
    // The annotation and the failed check, but a pod the plugin's sidecar path never redirects
    // (its author can write all of it): not the start-up race, and not sidecar rules' to fix.
    ...(
      [
        ['no mesh-proxy container', (p) => (p.spec!.containers = [{ name: 'app', image: 'busybox' }])],
        ['injection off by label', (p) => (p.metadata!.labels = { 'sidecar.mesh.io/inject': 'false' })],
        ['a gateway proxy', (p) => (p.spec!.containers[1]!.args = ['proxy', 'router'])],
        ['its own mesh-init', (p) => p.spec!.initContainers!.push({ name: 'mesh-init', image: 'x' })],
      ] as [string, (p: V1Pod) => unknown][]
    ).map(([why, change]) => {
      const pod = brokenPod('a');
      change(pod);
      return { name: `annotated and exited 126, but ${why}: the sidecar path never redirects it`, pod, broken: false };
    }),
    {
      name: 'another init container exited 126',
      pod: brokenPod('a', { initContainerName: 'other-init' }),
      broken: false,
    },
    {
      name: 'custom exit code matches',
      pod: testPod('a', { initExitCode: 7 }),
      c: { initContainerExitCode: 7 },
      broken: true,
    },
    {
      name: 'custom init container name',
      pod: brokenPod('a', { initContainerName: 'check' }),
      c: { initContainerName: 'check' },
      broken: true,
    },
    {
      name: 'message filter matches',
      pod: brokenPod('a', { message: 'traffic not redirected to 15001' }),
      c: { initContainerTerminationMessage: 'not redirected' },
      broken: true,
    },
    {
      name: 'message filter does not match',
      pod: brokenPod('a', { message: 'something else' }),
      c: { initContainerTerminationMessage: 'not redirected' },
      broken: false,
    },
    {
      name: 'message filter with no message',
      pod: brokenPod('a'),
      c: { initContainerTerminationMessage: 'not redirected' },
      broken: false,
    },
    {
      name: 'annotation with empty value still counts',
      pod: (() => {
        const p = brokenPod('a');
        p.metadata!.annotations = { 'sidecar.mesh.io/status': '' };
        return p;
      })(),
      broken: true,
    },
    {
      name: 'no status at all',
      pod: { metadata: { name: 'a', annotations: { 'sidecar.mesh.io/status': 'x' } } },
      broken: false,
    },
  ];
  for (const tc of cases) {
    it(tc.name, () => {
      const got = detectBroken(withUid(tc.pod), { ...criteria, ...tc.c });
      assert.equal(got !== undefined, tc.broken, JSON.stringify(got));
      if (got) assert.match(got.why, /mesh-validation|check/);
    });
  }

  it('other containers exiting 126 do not count', () => {
    const p = testPod('a', { initExitCode: 0 });
    p.status!.containerStatuses = [
      { name: 'app', image: 'x', imageID: '', ready: false, restartCount: 0, state: { terminated: { exitCode: 126 } } },
    ];
    assert.equal(detectBroken(withUid(p), criteria), undefined);
  });

  it('keys a broken state by uid and run, the same from a list (Date) as from a watch (string)', () => {
    const p = withUid(brokenPod('a'));
    const t = p.status!.initContainerStatuses![0]!.state!.terminated!;
    t.containerID = undefined;
    const fromList = detectBroken(p, criteria)!.stateKey;
    const fromWatch = detectBroken(JSON.parse(JSON.stringify(p)) as V1Pod, criteria)!.stateKey;
    assert.equal(fromList, fromWatch);
    assert.notEqual(
      detectBroken(withUid(brokenPod('a'), 'uid-2'), criteria)!.stateKey,
      detectBroken(withUid(brokenPod('a')), criteria)!.stateKey,
    );
  });
});

describe('selectors', () => {
  // The parser and matchers themselves: test/node/orch-selectors.test.ts, against Kubernetes' cases.
  it('builds the query: this node first, then the operator selectors', () => {
    assert.deepEqual(
      podQuery({
        nodeName: 'node-a',
        fieldSelectors: 'metadata.namespace!=kube-system',
        labelSelectors: 'app in (a,b)',
      }),
      {
        fieldSelector: 'spec.nodeName=node-a,metadata.namespace!=kube-system',
        labelSelector: 'app in (a,b)',
      },
    );
    assert.deepEqual(podQuery({ nodeName: '', fieldSelectors: '', labelSelectors: '' }), {
      fieldSelector: '',
      labelSelector: '',
    });
  });

  it('chooses the mode from the flags', () => {
    assert.equal(repairMode({ labelPods: true, deletePods: true }), 'label+delete');
    assert.equal(repairMode({ labelPods: false, deletePods: true }), 'delete');
    assert.equal(repairMode({ labelPods: true, deletePods: false }), 'label');
    assert.equal(repairMode({ labelPods: false, deletePods: false }), 'report');
  });

  it('rejects a bad selector flag at start-up, naming the flag', async () => {
    assert.throws(
      () => buildSettings({ 'repair-label-selectors': 'app in (a' }, {}),
      (e: unknown) => e instanceof ConfigErrors && /--repair-label-selectors/.test(e.message),
    );
    assert.throws(
      () => buildSettings({}, { REPAIR_FIELD_SELECTORS: 'spec.nodename=x' }),
      (e: unknown) =>
        e instanceof ConfigErrors && /env REPAIR_FIELD_SELECTORS.*field label not supported/.test(e.message),
    );
    assert.equal(
      buildSettings({ 'repair-field-selectors': 'status.phase!=Running' }, {}).repair.fieldSelectors,
      'status.phase!=Running',
    );
    const r = await runBin('install-cni', ['--repair-enabled', '--repair-field-selectors', 'spec.bogus=1']);
    assert.equal(r.code, 2);
    assert.match(r.stderr, /--repair-field-selectors.*field label not supported: "spec.bogus"/);
  });
});

describe('limits', () => {
  it('backs off exponentially with bounded jitter, honouring Retry-After', () => {
    let rnd = 0.5;
    const b = new Backoff({ baseMs: 100, maxMs: 1000, jitter: 0.5, random: () => rnd });
    assert.deepEqual([b.next(), b.next(), b.next(), b.next(), b.next()], [100, 200, 400, 800, 1000]);
    b.reset();
    rnd = 0;
    assert.equal(b.next(), 50);
    rnd = 1;
    assert.equal(b.next(), 300);
    assert.equal(b.next(5000), 5000, 'Retry-After is a floor');
  });

  it('with full jitter draws each delay from 0 to the step, a Retry-After capped', () => {
    let rnd = 1;
    const b = new Backoff({ baseMs: 100, maxMs: 1000, jitter: 'full', retryAfterCapMs: 2000, random: () => rnd });
    assert.deepEqual([b.next(), b.next(), b.next(), b.next(), b.next()], [100, 200, 400, 800, 1000]);
    rnd = 0;
    assert.equal(b.next(), 0, 'anywhere from 0: a fleet that failed together comes back spread');
    assert.equal(b.next(500), 500, 'Retry-After is a floor');
    assert.equal(b.next(60_000), 2000, 'a Retry-After is waited for at most retryAfterCapMs');
    assert.equal(b.retryAfter(60_000), 2000);
  });

  it('token bucket gives the burst at once, then qps', async () => {
    let now = 0;
    const slept: number[] = [];
    const clock: Clock = {
      now: () => now,
      sleep: async (ms) => {
        slept.push(ms);
        now += ms;
      },
    };
    const tb = new TokenBucket(10, 3, clock);
    for (let i = 0; i < 3; i++) await tb.take();
    assert.deepEqual(slept, []);
    await tb.take();
    await tb.take();
    assert.equal(Math.round(now), 200, 'two more tokens at 10/s take 200 ms');
  });

  it('a cancelled waiter does not block the ones behind it', async () => {
    const tb = new TokenBucket(1000, 1);
    await tb.take();
    const ac = new AbortController();
    const first = tb.take(ac.signal);
    ac.abort(new Error('stop'));
    await assert.rejects(first, /stop/);
    await tb.take();
  });
});
