// Whether our DaemonSet still targets this node (src/install/nodematch.ts), as table tests. The
// cases follow Kubernetes' own tests of the same rules (component-helpers' nodeaffinity and
// FindMatchingUntoleratedTaint, core/v1 ToleratesTaint, the DaemonSet controller's
// NodeShouldRunDaemonPod), in our words; where we answer `unsure` instead of Kubernetes' "no
// match" (what the API server would refuse to store), the case says so.

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type {
  V1Node,
  V1NodeSelector,
  V1NodeSelectorRequirement,
  V1PodSpec,
  V1Taint,
  V1Toleration,
} from '@kubernetes/client-node';
import {
  daemonSetTargetsNode,
  matchFieldRequirement,
  matchLabelRequirement,
  matchNodeSelector,
  matchesLabelSet,
  parseInt64,
  SCHEDULING_EFFECTS,
  toleratesTaint,
  untoleratedTaint,
  type Match,
} from '../../src/install/nodematch.ts';

const UNSURE = 'unsure';
/** A Match as the tables write it. */
const said = (m: Match): boolean | typeof UNSURE => (typeof m === 'boolean' ? m : UNSURE);

const node = (labels: Record<string, string> = {}, taints: V1Taint[] = [], name = 'node-1'): V1Node => ({
  metadata: { name, labels },
  spec: { taints },
});
const req = (key: string, operator: string, values?: string[]): V1NodeSelectorRequirement => ({
  key,
  operator,
  ...(values ? { values } : {}),
});

describe('node selector requirements (matchExpressions against the node labels)', () => {
  const labels = { foo: 'bar', zone: 'a', gpu: '4', weird: '007', neg: '-3' };
  const cases: [string, V1NodeSelectorRequirement, boolean | typeof UNSURE][] = [
    ['In: the value is one of them', req('foo', 'In', ['x', 'bar']), true],
    ['In: the value is none of them', req('foo', 'In', ['x']), false],
    ['In: the label is missing', req('missing', 'In', ['bar']), false],
    ['NotIn: the value is none of them', req('foo', 'NotIn', ['x']), true],
    ['NotIn: the value is one of them', req('foo', 'NotIn', ['bar']), false],
    ['NotIn: the label is missing (matches)', req('missing', 'NotIn', ['bar']), true],
    ['Exists: present', req('zone', 'Exists'), true],
    ['Exists: missing', req('missing', 'Exists'), false],
    ['DoesNotExist: missing', req('missing', 'DoesNotExist'), true],
    ['DoesNotExist: present', req('zone', 'DoesNotExist'), false],
    ['Gt: 4 > 3', req('gpu', 'Gt', ['3']), true],
    ['Gt: 4 > 4 is false', req('gpu', 'Gt', ['4']), false],
    ['Lt: 4 < 5', req('gpu', 'Lt', ['5']), true],
    ['Lt: -3 < -2 (negative values)', req('neg', 'Lt', ['-2']), true],
    ['Gt: a label value that is not an integer never matches', req('foo', 'Gt', ['1']), false],
    ['Gt: a label value with leading zeros is an integer to Go (007 > 6)', req('weird', 'Gt', ['6']), true],
    ['Gt: the label is missing', req('missing', 'Gt', ['1']), false],
    // Kubernetes: a parse error, the term matches nothing. Us: unsure (the API server refuses these).
    ['In without values: unsure', req('foo', 'In', []), UNSURE],
    ['NotIn without values: unsure', req('foo', 'NotIn'), UNSURE],
    ['Exists with values: unsure', req('zone', 'Exists', ['a']), UNSURE],
    ['Gt with two values: unsure', req('gpu', 'Gt', ['1', '2']), UNSURE],
    ['Gt with a value that is not an integer: unsure', req('gpu', 'Gt', ['1.5']), UNSURE],
    ['Gt beyond int64: unsure', req('gpu', 'Gt', ['9223372036854775808']), UNSURE],
    ['an unknown operator: unsure', req('foo', 'Matches', ['bar']), UNSURE],
  ];
  for (const [name, r, want] of cases) it(name, () => assert.equal(said(matchLabelRequirement(r, labels)), want));
});

describe('node selector requirements (matchFields: metadata.name only)', () => {
  const cases: [string, V1NodeSelectorRequirement, boolean | typeof UNSURE][] = [
    ['In: this node', req('metadata.name', 'In', ['node-1']), true],
    ['In: another node', req('metadata.name', 'In', ['node-2']), false],
    ['NotIn: another node', req('metadata.name', 'NotIn', ['node-2']), true],
    ['NotIn: this node', req('metadata.name', 'NotIn', ['node-1']), false],
    ['In with two values: unsure (must have one element)', req('metadata.name', 'In', ['node-1', 'node-2']), UNSURE],
    ['Exists on a field: unsure (not supported)', req('metadata.name', 'Exists'), UNSURE],
    ['another field: unsure', req('spec.unschedulable', 'In', ['true']), UNSURE],
  ];
  for (const [name, r, want] of cases) it(name, () => assert.equal(said(matchFieldRequirement(r, 'node-1')), want));
});

describe('required node affinity (terms ORed, requirements ANDed)', () => {
  const n = node({ foo: 'bar', zone: 'a' });
  const sel = (...terms: V1NodeSelector['nodeSelectorTerms']): V1NodeSelector => ({ nodeSelectorTerms: terms });
  const cases: [string, V1NodeSelector, boolean | typeof UNSURE][] = [
    ['one term that matches', sel({ matchExpressions: [req('foo', 'In', ['bar'])] }), true],
    [
      'two expressions ANDed, one fails',
      sel({ matchExpressions: [req('foo', 'In', ['bar']), req('zone', 'In', ['b'])] }),
      false,
    ],
    [
      'two terms ORed, the second matches',
      sel({ matchExpressions: [req('foo', 'In', ['x'])] }, { matchExpressions: [req('zone', 'In', ['a'])] }),
      true,
    ],
    [
      'matchFields does not match, matchExpressions does (one term): no',
      sel({ matchExpressions: [req('foo', 'In', ['bar'])], matchFields: [req('metadata.name', 'In', ['node-2'])] }),
      false,
    ],
    [
      'matchFields and matchExpressions both match (one term)',
      sel({ matchExpressions: [req('foo', 'In', ['bar'])], matchFields: [req('metadata.name', 'In', ['node-1'])] }),
      true,
    ],
    [
      'two terms: matchFields does not match, matchExpressions does',
      sel({ matchFields: [req('metadata.name', 'In', ['node-2'])] }, { matchExpressions: [req('foo', 'In', ['bar'])] }),
      true,
    ],
    ['an empty term selects nothing', sel({}), false],
    ['empty matchExpressions selects nothing', sel({ matchExpressions: [] }), false],
    // Kubernetes reports a parse error only when no term matched; so do we, as unsure.
    [
      'an unreadable term beside one that matches: matches',
      sel({ matchExpressions: [req('foo', 'Bogus')] }, { matchExpressions: [req('foo', 'In', ['bar'])] }),
      true,
    ],
    [
      'an unreadable term beside one that does not match: unsure',
      sel({ matchExpressions: [req('foo', 'Bogus')] }, { matchExpressions: [req('foo', 'In', ['x'])] }),
      UNSURE,
    ],
    ['no terms at all (the API server refuses it): unsure', sel(), UNSURE],
  ];
  for (const [name, s, want] of cases) it(name, () => assert.equal(said(matchNodeSelector(s, n)), want));
});

describe('nodeSelector (the map)', () => {
  const cases: [string, Record<string, string> | undefined, Record<string, string>, boolean][] = [
    ['no selector', undefined, {}, true],
    ['missing labels', { foo: 'bar' }, {}, false],
    ['same labels', { foo: 'bar', baz: 'blah' }, { foo: 'bar', baz: 'blah' }, true],
    ['node labels are a superset', { foo: 'bar' }, { foo: 'bar', baz: 'blah' }, true],
    ['node labels are a subset', { foo: 'bar', baz: 'blah' }, { foo: 'bar' }, false],
    ['another value', { foo: 'bar' }, { foo: 'baz' }, false],
    ['an empty value is a value', { foo: '' }, { foo: '' }, true],
  ];
  for (const [name, s, labels, want] of cases) it(name, () => assert.equal(matchesLabelSet(s, labels), want));
});

describe('tolerations against one taint', () => {
  const taint = (key: string, effect: string, value?: string): V1Taint => ({
    key,
    effect,
    ...(value ? { value } : {}),
  });
  const tol = (t: V1Toleration) => t;
  const cases: [string, V1Toleration, V1Taint, boolean | typeof UNSURE][] = [
    [
      'same key and effect, Exists, taint without value',
      tol({ key: 'foo', operator: 'Exists', effect: 'NoSchedule' }),
      taint('foo', 'NoSchedule'),
      true,
    ],
    [
      'same key and effect, Exists, taint with a value',
      tol({ key: 'foo', operator: 'Exists', effect: 'NoSchedule' }),
      taint('foo', 'NoSchedule', 'bar'),
      true,
    ],
    [
      'empty key with Exists matches every key',
      tol({ operator: 'Exists', effect: 'NoSchedule' }),
      taint('foo', 'NoSchedule', 'bar'),
      true,
    ],
    [
      'empty key and effect with Exists matches everything',
      tol({ operator: 'Exists' }),
      taint('foo', 'NoExecute', 'bar'),
      true,
    ],
    [
      'same key, effect and value, Equal',
      tol({ key: 'foo', operator: 'Equal', value: 'bar', effect: 'NoSchedule' }),
      taint('foo', 'NoSchedule', 'bar'),
      true,
    ],
    [
      'no operator means Equal',
      tol({ key: 'foo', value: 'bar', effect: 'NoSchedule' }),
      taint('foo', 'NoSchedule', 'bar'),
      true,
    ],
    [
      'Equal, other value',
      tol({ key: 'foo', operator: 'Equal', value: 'baz', effect: 'NoSchedule' }),
      taint('foo', 'NoSchedule', 'bar'),
      false,
    ],
    [
      'Equal, other effect',
      tol({ key: 'foo', operator: 'Equal', value: 'bar', effect: 'NoExecute' }),
      taint('foo', 'NoSchedule', 'bar'),
      false,
    ],
    ['empty effect matches every effect', tol({ key: 'foo', operator: 'Exists' }), taint('foo', 'NoExecute'), true],
    ['other key', tol({ key: 'other', operator: 'Exists' }), taint('foo', 'NoExecute'), false],
    ['Gt: taint 10 above 5', tol({ key: 'foo', operator: 'Gt', value: '5' }), taint('foo', 'NoSchedule', '10'), true],
    ['Gt: taint 3 below 5', tol({ key: 'foo', operator: 'Gt', value: '5' }), taint('foo', 'NoSchedule', '3'), false],
    ['Gt: equal values', tol({ key: 'foo', operator: 'Gt', value: '5' }), taint('foo', 'NoSchedule', '5'), false],
    ['Lt: taint 3 below 5', tol({ key: 'foo', operator: 'Lt', value: '5' }), taint('foo', 'NoSchedule', '3'), true],
    [
      'Lt: negative values, taint -10 below -5',
      tol({ key: 'foo', operator: 'Lt', value: '-5' }),
      taint('foo', 'NoSchedule', '-10'),
      true,
    ],
    [
      'Gt: a taint value that is not a number',
      tol({ key: 'foo', operator: 'Gt', value: '5' }),
      taint('foo', 'NoSchedule', 'high'),
      false,
    ],
    [
      'Gt: a toleration value with a leading zero is not canonical',
      tol({ key: 'foo', operator: 'Gt', value: '05' }),
      taint('foo', 'NoSchedule', '10'),
      false,
    ],
    [
      'Gt: a plus sign is not canonical',
      tol({ key: 'foo', operator: 'Gt', value: '+5' }),
      taint('foo', 'NoSchedule', '10'),
      false,
    ],
    [
      'Gt: large int64 values',
      tol({ key: 'foo', operator: 'Gt', value: '9223372036854775806' }),
      taint('foo', 'NoSchedule', '9223372036854775807'),
      true,
    ],
    // Kubernetes: not tolerated. Us: unsure, since a later version may know the operator.
    [
      'an unknown operator: unsure',
      tol({ key: 'foo', operator: 'Near', value: '5' }),
      taint('foo', 'NoSchedule', '5'),
      UNSURE,
    ],
  ];
  for (const [name, t, tn, want] of cases) it(name, () => assert.equal(said(toleratesTaint(t, tn)), want));
});

describe('the first untolerated NoSchedule/NoExecute taint', () => {
  const noSched = { key: 'dedicated', value: 'db', effect: 'NoSchedule' };
  const prefer = { key: 'soft', effect: 'PreferNoSchedule' };
  const cases: [string, V1Taint[], V1Toleration[], string | undefined][] = [
    ['no taints, no tolerations', [], [], undefined],
    ['no taints, some tolerations', [], [{ key: 'x', operator: 'Exists' }], undefined],
    ['every taint tolerated', [noSched], [{ key: 'dedicated', operator: 'Equal', value: 'db' }], undefined],
    ['PreferNoSchedule never keeps a daemon pod off', [prefer], [], undefined],
    ['an untolerated NoSchedule taint', [prefer, noSched], [], 'dedicated'],
    [
      'an untolerated NoExecute taint after a tolerated one',
      [noSched, { key: 'evict', effect: 'NoExecute' }],
      [{ key: 'dedicated', operator: 'Exists' }],
      'evict',
    ],
    [
      'unsure when only an unknown operator could tolerate it',
      [noSched],
      [{ key: 'dedicated', operator: 'Near' }],
      UNSURE,
    ],
    [
      'an unknown operator beside one that tolerates: tolerated',
      [noSched],
      [
        { key: 'dedicated', operator: 'Near' },
        { key: 'dedicated', operator: 'Exists' },
      ],
      undefined,
    ],
  ];
  for (const [name, taints, tols, want] of cases)
    it(name, () => {
      const got = untoleratedTaint(taints, tols, SCHEDULING_EFFECTS);
      assert.equal(got === undefined ? undefined : 'unsure' in got ? UNSURE : got.taint.key, want);
    });
});

describe('whether the DaemonSet still targets the node (NodeShouldRunDaemonPod)', () => {
  // deploy/daemonset.yaml's own template: every taint tolerated, Linux nodes.
  const ours: V1PodSpec = {
    containers: [{ name: 'install-cni' }],
    hostNetwork: true,
    nodeSelector: { 'kubernetes.io/os': 'linux' },
    tolerations: [{ operator: 'Exists' }],
  };
  const linux = { 'kubernetes.io/os': 'linux' };
  const plain: V1PodSpec = { containers: [{ name: 'c' }] };
  const affinity = (terms: V1NodeSelector['nodeSelectorTerms']): V1PodSpec => ({
    ...plain,
    affinity: { nodeAffinity: { requiredDuringSchedulingIgnoredDuringExecution: { nodeSelectorTerms: terms } } },
  });
  const t = (key: string, effect: string): V1Taint => ({ key, effect });
  const cases: [string, V1PodSpec | undefined, V1Node, string][] = [
    ['ours on a Linux node', ours, node(linux), 'targets'],
    ['ours on a node with any taint', ours, node(linux, [t('anything', 'NoExecute')]), 'targets'],
    ['ours on a node no longer labelled Linux', ours, node({}), 'not_targeted:node_selector'],
    ['a template naming another node', { ...plain, nodeName: 'node-2' }, node(), 'not_targeted:node_name'],
    ['a template naming this node', { ...plain, nodeName: 'node-1' }, node(), 'targets'],
    [
      'affinity still matching',
      affinity([{ matchExpressions: [req('pool', 'In', ['mesh'])] }]),
      node({ pool: 'mesh' }),
      'targets',
    ],
    [
      'affinity no longer matching',
      affinity([{ matchExpressions: [req('pool', 'In', ['mesh'])] }]),
      node({ pool: 'batch' }),
      'not_targeted:node_affinity',
    ],
    [
      'affinity excluding this node by name',
      affinity([{ matchFields: [req('metadata.name', 'NotIn', ['node-1'])] }]),
      node(),
      'not_targeted:node_affinity',
    ],
    ['affinity that cannot be read', affinity([{ matchExpressions: [req('pool', 'Bogus')] }]), node(), 'unsure'],
    [
      'nodeSelector and affinity both required: the selector fails',
      { ...affinity([{ matchExpressions: [req('pool', 'Exists')] }]), nodeSelector: { disk: 'ssd' } },
      node({ pool: 'x' }),
      'not_targeted:node_selector',
    ],
    [
      'an untolerated NoSchedule taint',
      plain,
      node({}, [t('dedicated', 'NoSchedule')]),
      'not_targeted:untolerated_taint',
    ],
    [
      'an untolerated NoExecute taint',
      plain,
      node({}, [t('dedicated', 'NoExecute')]),
      'not_targeted:untolerated_taint',
    ],
    ['a PreferNoSchedule taint', plain, node({}, [t('dedicated', 'PreferNoSchedule')]), 'targets'],
    // The tolerations the DaemonSet controller adds to every daemon pod.
    [
      'cordoned or drained (unschedulable)',
      plain,
      node({}, [t('node.kubernetes.io/unschedulable', 'NoSchedule')]),
      'targets',
    ],
    ['not ready', plain, node({}, [t('node.kubernetes.io/not-ready', 'NoExecute')]), 'targets'],
    ['unreachable', plain, node({}, [t('node.kubernetes.io/unreachable', 'NoExecute')]), 'targets'],
    [
      'disk, memory and PID pressure',
      plain,
      node(
        {},
        ['disk', 'memory', 'pid'].map((p) => t(`node.kubernetes.io/${p}-pressure`, 'NoSchedule')),
      ),
      'targets',
    ],
    [
      'network unavailable, host-network pod',
      { ...plain, hostNetwork: true },
      node({}, [t('node.kubernetes.io/network-unavailable', 'NoSchedule')]),
      'targets',
    ],
    [
      'network unavailable, pod network pod',
      plain,
      node({}, [t('node.kubernetes.io/network-unavailable', 'NoSchedule')]),
      'not_targeted:untolerated_taint',
    ],
    [
      'not ready as NoSchedule is not the NoExecute the controller tolerates',
      plain,
      node({}, [t('node.kubernetes.io/not-ready', 'NoSchedule')]),
      'not_targeted:untolerated_taint',
    ],
    ['no template spec', undefined, node(), 'unsure'],
  ];
  for (const [name, spec, n, want] of cases)
    it(name, () => {
      const v = daemonSetTargetsNode(spec, n);
      assert.equal(v.kind === 'not_targeted' ? `${v.kind}:${v.reason}` : v.kind, want);
    });

  it('names what no longer matches', () => {
    const v = daemonSetTargetsNode(plain, node({}, [{ key: 'dedicated', value: 'db', effect: 'NoExecute' }]));
    assert.equal(v.kind, 'not_targeted');
    assert.match(v.kind === 'not_targeted' ? v.why : '', /node node-1 has taint dedicated=db:NoExecute/);
  });
});

describe('int64 as Go reads it', () => {
  const cases: [string, boolean, bigint | undefined][] = [
    ['42', false, 42n],
    ['+42', false, 42n],
    ['-0', false, 0n],
    ['007', false, 7n],
    ['9223372036854775807', false, 9223372036854775807n],
    ['9223372036854775808', false, undefined],
    ['-9223372036854775808', false, -9223372036854775808n],
    ['1e3', false, undefined],
    [' 1', false, undefined],
    ['', false, undefined],
    ['007', true, undefined],
    ['+5', true, undefined],
    ['-5', true, -5n],
    ['0', true, 0n],
    ['-', true, undefined],
  ];
  for (const [s, canonical, want] of cases)
    it(`${JSON.stringify(s)}${canonical ? ' (canonical)' : ''}`, () => assert.equal(parseInt64(s, canonical), want));
});
