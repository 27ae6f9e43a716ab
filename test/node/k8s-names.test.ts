// The names the repair flags hold (a container's, an annotation key, a node's) are checked with
// the API server's own rules: a name Kubernetes refuses can never be on a pod, so a flag holding
// one would make repair match nothing, silently, for the agent's whole life. The cases are those
// of Kubernetes' own tables for these rules (k8s.io/apimachinery), plus our flags' defaults.

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  annotationKeyProblem,
  dns1123LabelProblem,
  dns1123SubdomainProblem,
  qualifiedNameProblem,
} from '../../src/config/k8snames.ts';
import { ConfigErrors } from '../../src/config/parse.ts';
import { buildSettings } from '../../src/config/settings.ts';

function table(check: (v: string) => string | undefined, good: readonly string[], bad: readonly string[]): void {
  for (const v of good)
    it(`takes ${JSON.stringify(v.length > 40 ? `${v.slice(0, 12)}...(${v.length})` : v)}`, () => {
      assert.equal(check(v), undefined);
    });
  for (const v of bad)
    it(`refuses ${JSON.stringify(v.length > 40 ? `${v.slice(0, 12)}...(${v.length})` : v)}`, () => {
      assert.equal(typeof check(v), 'string');
    });
}

describe('a DNS-1123 label (a container name)', () => {
  table(
    dns1123LabelProblem,
    ['a', 'ab', 'abc', 'a1', 'a-1', 'a--1--2--b', '0', '01', '012', '1a', '1-a', '1--a--b--2', 'a'.repeat(63)],
    [
      ...['', 'A', 'ABC', 'aBc', 'A1', 'A-1', '1-A', '-', 'a-', '-a', '1-', '-1'],
      ...['_', 'a_', '_a', 'a_b', '1_', '_1', '1_2', '.', 'a.', '.a', 'a.b', '1.', '.1', '1.2'],
      ...[' ', 'a ', ' a', 'a b', '1 ', ' 1', '1 2', 'a'.repeat(64)],
    ],
  );
  it('says a subdomain is no label because of its dot', () => {
    assert.match(dns1123LabelProblem('a.b')!, /dot/);
  });
});

describe('a DNS-1123 subdomain (a node name)', () => {
  table(
    dns1123SubdomainProblem,
    [
      ...['a', 'ab', 'abc', 'a1', 'a-1', 'a--1--2--b', '0', '01', '012', '1a', '1-a', '1--a--b--2'],
      ...['a.a', 'ab.a', 'abc.a', 'a1.a', 'a-1.a', 'a--1--2--b.a', 'a.1', 'ab.1', 'abc.1', 'a1.1', 'a-1.1'],
      ...['0.a', '01.a', '012.a', '1a.a', '1-a.a', '0.1', '01.1', '012.1', '1a.1', '1-a.1', '1--a--b--2.1'],
      ...['a.b.c.d.e', 'aa.bb.cc.dd.ee', '1.2.3.4.5', '11.22.33.44.55', 'a'.repeat(253)],
      ...['ip-10-0-0-1.ec2.internal', 'kind-control-plane'],
    ],
    [
      ...['', 'A', 'ABC', 'aBc', 'A1', 'A-1', '1-A', '-', 'a-', '-a', '1-', '-1'],
      ...['_', 'a_', '_a', 'a_b', '1_', '_1', '1_2', '.', 'a.', '.a', 'a..b', '1.', '.1', '1..2'],
      ...[' ', 'a ', ' a', 'a b', '1 ', ' 1', '1 2', 'A.a', 'aB.a', 'ab.A', 'A1.a', 'a1.A'],
      ...['A.1', 'aB.1', 'A1.1', '1A.1', '0.A', '01.A', '012.A', '1A.a', '1a.A'],
      ...['A.B.C.D.E', 'AA.BB.CC.DD.EE', 'a.B.c.d.e', 'aa.bB.cc.dd.ee'],
      ...['a@b', 'a,b', 'a;b', 'a:b', 'a%b', 'a?b', 'a$b', 'a'.repeat(254), 'UPPER_case'],
    ],
  );
});

describe('a qualified name (a label key)', () => {
  table(
    qualifiedNameProblem,
    [
      ...['simple', 'now-with-dashes', '1-starts-with-num', '1234', 'simple/simple', 'now-with-dashes/simple'],
      ...['now-with-dashes/now-with-dashes', 'now.with.dots/simple', 'now-with.dashes-and.dots/simple'],
      ...['1-num.2-num/3-num', '1234/5678', '1.2.3.4/5678', 'Uppercase_Is_OK_123', 'example.com/Uppercase_Is_OK_123'],
      ...['requests.storage-foo', 'a'.repeat(63), `${'a'.repeat(253)}/${'b'.repeat(63)}`],
    ],
    [
      ...['nospecialchars%^=@', 'cantendwithadash-', '-cantstartwithadash-', 'only/one/slash', 'Example.com/abc'],
      ...['example_com/abc', 'example.com/', '/simple', 'a'.repeat(64), `${'a'.repeat(254)}/abc`, '', '!!'],
    ],
  );
});

describe('an annotation key', () => {
  // The API server lower-cases an annotation key before checking it as a qualified name.
  table(
    annotationKeyProblem,
    ['sidecar.mesh.io/status', 'Example.com/Status', 'EXAMPLE.COM/abc', 'status'],
    ['!!', 'example_com/abc', 'only/one/slash', '/status', 'example.com/', '', 'a'.repeat(64)],
  );
});

describe('the repair flags that name things on a pod', () => {
  const refused: [Record<string, string>, Record<string, string>, RegExp][] = [
    [{ 'repair-init-container-name': 'Bad_Name' }, {}, /--repair-init-container-name: .*DNS-1123 label/],
    [{ 'repair-init-container-name': 'a.b' }, {}, /--repair-init-container-name: .*dot/],
    [{}, { REPAIR_INIT_CONTAINER_NAME: 'x'.repeat(64) }, /env REPAIR_INIT_CONTAINER_NAME: .*more than 63/],
    [{ 'repair-sidecar-annotation': '!!' }, {}, /--repair-sidecar-annotation: .*qualified name/],
    [{ 'repair-sidecar-annotation': 'a/b/c' }, {}, /--repair-sidecar-annotation: .*more than one \//],
    [{ 'repair-node-name': 'UPPER_case' }, {}, /--repair-node-name: .*DNS-1123 subdomain/],
    [{}, { REPAIR_NODE_NAME: 'node a' }, /env REPAIR_NODE_NAME: .*DNS-1123 subdomain/],
    // With repair on, an empty annotation (no pod carries one) is refused like an empty container name.
    [{ 'repair-enabled': 'true', 'repair-sidecar-annotation': '' }, {}, /--repair-sidecar-annotation/],
  ];
  for (const [flags, env, re] of refused) {
    it(`refuses ${JSON.stringify({ ...flags, ...env })}, saying the rule`, () => {
      assert.throws(
        () => buildSettings(flags, env),
        (e: unknown) => e instanceof ConfigErrors && re.test(e.message),
      );
    });
  }

  it('takes names Kubernetes takes, and the defaults', () => {
    const s = buildSettings(
      {
        'repair-init-container-name': 'istio-validation',
        'repair-sidecar-annotation': 'Sidecar.Istio.io/Status',
        'repair-node-name': 'ip-10-0-0-1.ec2.internal',
      },
      {},
    );
    assert.equal(s.repair.initContainerName, 'istio-validation');
    assert.equal(s.repair.sidecarAnnotation, 'Sidecar.Istio.io/Status');
    assert.equal(s.repair.nodeName, 'ip-10-0-0-1.ec2.internal');
    const d = buildSettings({}, {});
    assert.equal(d.repair.initContainerName, 'mesh-validation');
    assert.equal(d.repair.sidecarAnnotation, 'sidecar.mesh.io/status');
  });

  it('reports every bad name at once', () => {
    assert.throws(
      () =>
        buildSettings(
          {
            'repair-init-container-name': 'Bad_Name',
            'repair-sidecar-annotation': '!!',
            'repair-node-name': 'UPPER_case',
          },
          {},
        ),
      (e: unknown) => e instanceof ConfigErrors && e.errors.length === 3,
    );
  });
});
