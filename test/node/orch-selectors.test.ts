// Selectors: the start-up check of --repair-field-selectors/--repair-label-selectors
// (src/config/selectors.ts), the query the agent sends (the operator's selectors as typed, joined
// with ours) and the test API server's matchers (test/helpers/selectors.ts), all against our
// fixtures of Kubernetes' own selector cases (fixtures/selectors/README.md says which). A
// test:unit suite (no root, no Debian package); the query through the test API server (HTTPS,
// certificates by openssl) is in orch-selectors-apiserver.test.ts.

import type { V1Pod } from '@kubernetes/client-node';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { describe, it } from 'node:test';
import { ConfigErrors } from '../../src/config/parse.ts';
import {
  escapeFieldValue,
  parseFieldSelector,
  parseLabelSelector,
  POD_SELECTOR_FIELDS,
  SelectorError,
} from '../../src/config/selectors.ts';
import { buildSettings } from '../../src/config/settings.ts';
import { podQuery } from '../../src/repair/controller.ts';
import { matchesFields, matchesLabels, POD_FIELD_VALUES } from '../helpers/selectors.ts';

interface Row {
  readonly from: string;
  readonly selector: string;
  readonly error?: string;
}
interface LabelFixture {
  parse: Array<Row & { parsed?: Array<[string, string, string[]]> }>;
  match: Array<Row & { labels: Record<string, string>; match: boolean }>;
}
interface FieldFixture {
  parse: Array<Row & { parsed?: Array<[string, string, string]> }>;
  escape: Array<{ from: string; value: string; escaped: string }>;
  match: Array<Row & { pod: Record<string, string>; match: boolean }>;
}

const fixture = <T>(name: string): T =>
  JSON.parse(readFileSync(new URL(`fixtures/selectors/${name}`, import.meta.url), 'utf8')) as T;
const labels = fixture<LabelFixture>('labels.json');
const fields = fixture<FieldFixture>('fields.json');
const show = (s: string) => JSON.stringify(s);

/** A pod holding the given selectable fields (`spec.hostNetwork` as the boolean it is). */
function podWith(values: Record<string, string>): V1Pod {
  const pod: Record<string, Record<string, unknown>> = { metadata: {}, spec: {}, status: {} };
  for (const [field, value] of Object.entries(values)) {
    const [part, name] = field.split('.') as [string, string];
    pod[part]![name] = field === 'spec.hostNetwork' ? value === 'true' : value;
  }
  return pod as V1Pod;
}

function assertRefused(parse: () => unknown, kind: string, sel: string, why: string): void {
  assert.throws(parse, (e: unknown) => {
    assert.ok(e instanceof SelectorError, String(e));
    assert.ok(e.message.startsWith(`invalid ${kind} selector ${show(sel)}: `), e.message);
    assert.ok(e.message.includes(why), `${show(e.message)} should say ${show(why)}`);
    return true;
  });
}

describe('label selectors (Kubernetes pkg/labels cases)', () => {
  for (const row of labels.parse) {
    it(`${row.error ? 'refuses' : 'parses'} ${show(row.selector)} (${row.from})`, () => {
      if (row.error !== undefined)
        return assertRefused(() => parseLabelSelector(row.selector), 'label', row.selector, row.error);
      const got = parseLabelSelector(row.selector).map((r) => [r.key, r.op, [...new Set(r.values)].sort()]);
      assert.deepEqual(got, row.parsed);
    });
  }
  for (const row of labels.match) {
    it(`${show(row.selector)} ${row.match ? 'matches' : 'does not match'} ${JSON.stringify(row.labels)} (${row.from})`, () => {
      assert.equal(matchesLabels(parseLabelSelector(row.selector), row.labels), row.match);
    });
  }
});

describe('pod field selectors (Kubernetes pkg/fields cases)', () => {
  for (const row of fields.parse) {
    it(`${row.error ? 'refuses' : 'parses'} ${show(row.selector)} (${row.from})`, () => {
      if (row.error !== undefined)
        return assertRefused(() => parseFieldSelector(row.selector), 'field', row.selector, row.error);
      assert.deepEqual(
        parseFieldSelector(row.selector).map((r) => [r.field, r.op, r.value]),
        row.parsed,
      );
    });
  }
  for (const row of fields.escape) {
    it(`escapes ${show(row.value)} as ${show(row.escaped)}, and back (${row.from})`, () => {
      assert.equal(escapeFieldValue(row.value), row.escaped);
      assert.deepEqual(parseFieldSelector(`spec.nodeName=${row.escaped}`), [
        { field: 'spec.nodeName', op: '=', value: row.value },
      ]);
    });
  }
  for (const row of fields.match) {
    it(`${show(row.selector)} ${row.match ? 'matches' : 'does not match'} ${JSON.stringify(row.pod)} (${row.from})`, () => {
      assert.equal(matchesFields(parseFieldSelector(row.selector), podWith(row.pod)), row.match);
    });
  }

  it('the test API server reads every field the start-up check accepts, and no other', () => {
    assert.deepEqual(Object.keys(POD_FIELD_VALUES).sort(), [...POD_SELECTOR_FIELDS].sort());
  });
});

describe('the pod query: the operator selectors as typed, joined with ours', () => {
  it('sends the operator selectors as typed, after this node', () => {
    assert.deepEqual(
      podQuery({
        nodeName: 'node-a',
        fieldSelectors: 'status.phase!=Failed,metadata.namespace==prod,',
        labelSelectors: 'app  in (web,api), !canary',
      }),
      {
        fieldSelector: 'spec.nodeName=node-a,status.phase!=Failed,metadata.namespace==prod,',
        labelSelector: 'app  in (web,api), !canary',
      },
    );
  });

  it('sends only what is set', () => {
    assert.deepEqual(podQuery({ nodeName: '', fieldSelectors: '', labelSelectors: '' }), {
      fieldSelector: '',
      labelSelector: '',
    });
    assert.deepEqual(podQuery({ nodeName: 'node-a', fieldSelectors: '', labelSelectors: '' }), {
      fieldSelector: 'spec.nodeName=node-a',
      labelSelector: '',
    });
    assert.deepEqual(podQuery({ nodeName: '', fieldSelectors: 'status.phase=Running', labelSelectors: 'app' }), {
      fieldSelector: 'status.phase=Running',
      labelSelector: 'app',
    });
  });

  it('escapes the node name as a field value', () => {
    assert.equal(
      podQuery({ nodeName: 'n=1,2\\', fieldSelectors: 'status.phase=Running', labelSelectors: '' }).fieldSelector,
      'spec.nodeName=n\\=1\\,2\\\\,status.phase=Running',
    );
  });
});

describe('start-up check of the selector flags', () => {
  const refused = (flags: Record<string, string>, env: Record<string, string>, re: RegExp) =>
    assert.throws(
      () => buildSettings(flags, env),
      (e: unknown) => e instanceof ConfigErrors && re.test(e.message),
      JSON.stringify({ flags, env }),
    );

  it('keeps what the API server would take, as typed', () => {
    const s = buildSettings(
      { 'repair-field-selectors': 'status.phase!=Failed,', 'repair-label-selectors': 'app  in (web,api)' },
      {},
    );
    assert.equal(s.repair.fieldSelectors, 'status.phase!=Failed,');
    assert.equal(s.repair.labelSelectors, 'app  in (web,api)');
  });

  it('refuses what the API server would refuse, naming the flag and why', () => {
    refused(
      { 'repair-field-selectors': ' spec.nodeName=n1' },
      {},
      /--repair-field-selectors.*field label not supported: " spec.nodeName"/,
    );
    refused(
      { 'repair-field-selectors': 'metadata.name=a\\!b' },
      {},
      /--repair-field-selectors.*invalid escape sequence \\!/,
    );
    refused({}, { REPAIR_LABEL_SELECTORS: 'rack>-4' }, /env REPAIR_LABEL_SELECTORS.*"-4" is not a valid label value/);
    refused({ 'repair-label-selectors': 'tier\u000b=web' }, {}, /--repair-label-selectors.*not a valid label key/);
  });

  // The watch selects spec.nodeName=<node> and the operator's terms are ANDed to it: a term on
  // spec.nodeName that contradicts it would make a watch of no pod, a repair that never repairs.
  it('refuses a spec.nodeName term that contradicts the node the watch selects already', () => {
    const other = /--repair-field-selectors.*spec\.nodeName=node-b selects no pod of this agent's node node-a/;
    refused({ 'repair-field-selectors': 'status.phase=Running,spec.nodeName=node-b' }, { NODE_NAME: 'node-a' }, other);
    const self = /env REPAIR_FIELD_SELECTORS.*spec\.nodeName!=node-a selects no pod of this agent's node node-a/;
    refused({}, { NODE_NAME: 'node-a', REPAIR_FIELD_SELECTORS: 'spec.nodeName!=node-a' }, self);
    const flags = { 'repair-node-name': 'node-a', 'repair-field-selectors': 'spec.nodeName==node-b' };
    refused(flags, {}, /node-b selects no pod/);
    // What agrees with the node, or any spec.nodeName term with no node (all nodes), is kept.
    const kept = (sel: string, env: Record<string, string>) =>
      buildSettings({ 'repair-field-selectors': sel }, env).repair.fieldSelectors;
    assert.equal(kept('spec.nodeName=node-a', { NODE_NAME: 'node-a' }), 'spec.nodeName=node-a');
    assert.equal(kept('spec.nodeName!=node-b', { NODE_NAME: 'node-a' }), 'spec.nodeName!=node-b');
    assert.equal(kept('spec.nodeName=node-b', {}), 'spec.nodeName=node-b');
  });
});
