// Ambient mode's settings (docs/flags.md "ambient"): the flags, their env settings and defaults,
// and the one-line refusals of bad values; --ebpf-enabled stays refused with the reason.

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { DEFAULT_ENABLEMENT_SELECTORS } from '../../cni-plugin/shared/enablement.ts';
import { ConfigErrors } from '../../src/config/parse.ts';
import { buildSettings } from '../../src/config/settings.ts';
import { ambientArgs } from '../../src/partargs.ts';

const NODE = { NODE_NAME: 'node-1' };

describe('ambient settings', () => {
  it('has the defaults of the brief', () => {
    const a = buildSettings({}, NODE).ambient;
    assert.equal(a.enabled, false);
    assert.equal(a.ztunnelUdsAddress, '/var/run/ztunnel/ztunnel.sock');
    assert.equal(a.pluginEventUdsAddress, '/var/run/mesh-cni/pluginevent.sock');
    assert.deepEqual(a.enablementSelectors, DEFAULT_ENABLEMENT_SELECTORS);
    assert.equal(a.dnsCapture, false);
    assert.equal(a.reconcilePodRulesOnStartup, true);
    assert.equal(a.hostProbeSnatIp, '169.254.7.127');
    assert.equal(a.hostProbeSnatIpv6, 'fd16:9254:7127:1337:ffff:ffff:ffff:ffff');
    assert.equal(a.ipv6, true);
    assert.equal(a.hostRoot, '/host');
    assert.equal(a.kubeletUid, undefined, 'unset: found at start (src/ambient/kubeletuid.ts)');
  });

  it('takes every flag, and its env setting named like it', () => {
    const selector = '[{"podSelector":{"matchLabels":{"team":"blue"}}}]';
    const flags = {
      'ambient-enabled': 'true',
      'ztunnel-uds-address': '/run/zt/zt.sock',
      'pluginevent-uds-address': '/run/m/pe.sock',
      'ambient-enablement-selector': selector,
      'ambient-dns-capture': 'true',
      'ambient-reconcile-pod-rules-on-startup': 'false',
      'ambient-ipv6': 'false',
      'host-probe-snat-ip': '169.254.9.9',
      'host-probe-snat-ipv6': 'FD00:0:0::9',
      'host-root': '/',
      'kubelet-uid': '4242',
    };
    const env = {
      AMBIENT_ENABLED: 'true',
      ZTUNNEL_UDS_ADDRESS: '/run/zt/zt.sock',
      PLUGINEVENT_UDS_ADDRESS: '/run/m/pe.sock',
      AMBIENT_ENABLEMENT_SELECTOR: selector,
      AMBIENT_DNS_CAPTURE: 'true',
      AMBIENT_RECONCILE_POD_RULES_ON_STARTUP: 'false',
      AMBIENT_IPV6: 'false',
      HOST_PROBE_SNAT_IP: '169.254.9.9',
      HOST_PROBE_SNAT_IPV6: 'FD00:0:0::9',
      HOST_ROOT: '/',
      KUBELET_UID: '4242',
    };
    const want = {
      enabled: true,
      enablementSelectors: [{ podSelector: { matchLabels: { team: 'blue' } } }],
      pluginEventUdsAddress: '/run/m/pe.sock',
      ztunnelUdsAddress: '/run/zt/zt.sock',
      dnsCapture: true,
      reconcilePodRulesOnStartup: false,
      hostProbeSnatIp: '169.254.9.9',
      hostProbeSnatIpv6: 'fd00::9',
      ipv6: false,
      hostRoot: '/',
      kubeletUid: 4242,
    };
    assert.deepEqual({ ...buildSettings(flags, NODE).ambient }, want);
    assert.deepEqual({ ...buildSettings({}, { ...NODE, ...env }).ambient }, want);
  });

  it("hands --kubelet-uid to ambient mode's slice (the probe rule's uid, src/ambient/kubeletuid.ts)", () => {
    assert.equal(ambientArgs(buildSettings({ 'kubelet-uid': '0' }, NODE)).kubeletUid, 0);
    assert.equal(ambientArgs(buildSettings({}, { ...NODE, KUBELET_UID: ' 7 ' })).kubeletUid, 7);
    assert.equal(ambientArgs(buildSettings({}, { ...NODE, KUBELET_UID: '' })).kubeletUid, undefined);
  });

  it('reads the selector as YAML too, with matchExpressions', () => {
    const yaml = [
      '- podSelector:',
      '    matchExpressions:',
      '      - {key: app, operator: In, values: [cart, shop]}',
      '  namespaceSelector:',
      '    matchLabels: {mesh.io/dataplane-mode: ambient}',
      '- namespaceSelector:',
      '    matchExpressions: [{key: legacy, operator: DoesNotExist}]',
    ].join('\n');
    const a = buildSettings({ 'ambient-enablement-selector': yaml }, NODE).ambient;
    assert.deepEqual(a.enablementSelectors, [
      {
        podSelector: { matchExpressions: [{ key: 'app', operator: 'In', values: ['cart', 'shop'] }] },
        namespaceSelector: { matchLabels: { 'mesh.io/dataplane-mode': 'ambient' } },
      },
      { namespaceSelector: { matchExpressions: [{ key: 'legacy', operator: 'DoesNotExist' }] } },
    ]);
  });

  const bad: [Record<string, string>, Record<string, string>, RegExp][] = [
    // Ambient mode watches the node's pods: without NODE_NAME it cannot.
    [{ 'ambient-enabled': 'true' }, {}, /^invalid value "true" for --ambient-enabled: needs NODE_NAME/m],
    [{}, { AMBIENT_ENABLED: 'yes please' }, /env AMBIENT_ENABLED/],
    [{ 'ebpf-enabled': 'true' }, NODE, /--ebpf-enabled.*removed from Istio in 1\.21 and ztunnel no longer consumes it/],
    [{}, { ...NODE, EBPF_ENABLED: 'true' }, /env EBPF_ENABLED.*Istio in 1\.21/],
    [{ 'ambient-enablement-selector': '{podSelector: {}}' }, NODE, /--ambient-enablement-selector.*expected a list/],
    [{ 'ambient-enablement-selector': '[' }, NODE, /--ambient-enablement-selector.*not YAML or JSON/],
    [
      { 'ambient-enablement-selector': '[{podSelecter: {}}]' },
      NODE,
      /--ambient-enablement-selector.*\[0\]: unknown field "podSelecter"/,
    ],
    [
      { 'ambient-enablement-selector': '[{podSelector: {matchExpressions: [{key: a, operator: Has}]}}]' },
      NODE,
      /\[0\]\.podSelector\.matchExpressions\[0\]\.operator: expected one of In, NotIn, Exists, DoesNotExist/,
    ],
    [
      { 'ambient-enablement-selector': '[{podSelector: {matchExpressions: [{key: a, operator: In}]}}]' },
      NODE,
      /In needs at least one value/,
    ],
    [
      { 'ambient-enablement-selector': '[{namespaceSelector: {matchLabels: {"bad key!": x}}}]' },
      NODE,
      /\[0\]\.namespaceSelector: "bad key!" is not a label key/,
    ],
    [
      { 'ambient-enablement-selector': '[{podSelector: {matchLabels: {a: "-x-"}}}]' },
      NODE,
      /"-x-" is not a label value/,
    ],
    [{ 'host-probe-snat-ip': '169.254.7' }, NODE, /"169\.254\.7" for --host-probe-snat-ip: expected an IPv4 address/],
    [{ 'host-probe-snat-ip': 'fd00::1' }, NODE, /--host-probe-snat-ip.*IPv4/],
    [{}, { ...NODE, HOST_PROBE_SNAT_IPV6: '169.254.7.127' }, /env HOST_PROBE_SNAT_IPV6.*IPv6/],
    [{ 'host-probe-snat-ipv6': 'fe80::1%eth0' }, NODE, /--host-probe-snat-ipv6: expected an IPv6 address/],
    [{ 'host-probe-snat-ipv6': 'fd00::1]/x' }, NODE, /--host-probe-snat-ipv6: expected an IPv6 address/],
    [{ 'host-probe-snat-ipv6': 'fd00::1::2' }, NODE, /--host-probe-snat-ipv6: expected an IPv6 address/],
    [{ 'ambient-dns-capture': 'maybe' }, NODE, /--ambient-dns-capture/],
    [{ 'kubelet-uid': 'kubelet' }, NODE, /"kubelet" for --kubelet-uid: expected a whole number from 0 to 4294967294/],
    [{}, { ...NODE, KUBELET_UID: '-1' }, /env KUBELET_UID: expected a whole number from 0 to 4294967294/],
    [{ 'kubelet-uid': '4294967295' }, NODE, /--kubelet-uid: expected a whole number/],
  ];
  for (const [flags, env, re] of bad) {
    it(`refuses ${JSON.stringify({ ...flags, ...env })} in one line`, () => {
      assert.throws(
        () => buildSettings(flags, env),
        (e: unknown) => {
          assert.ok(e instanceof ConfigErrors, String(e));
          assert.match(e.message, re);
          return true;
        },
      );
    });
  }

  // Bounded (the plugin reads the list from its config on every ADD, and each pod
  // decision walks it): at most 100 selectors, 64 KiB of text.
  it('refuses a selector list of more than 100 selectors or 64 KiB', () => {
    const many = Array.from({ length: 101 }, (_, i) => ({ podSelector: { matchLabels: { app: `a${i}` } } }));
    const cases: [string, RegExp][] = [
      [JSON.stringify(many), /--ambient-enablement-selector.*101 selectors: at most 100/],
      [`[{podSelector: {matchLabels: {app: a}}}]${' '.repeat(65_536)}`, /65[0-9]{3} bytes: at most 65536/],
    ];
    for (const [value, re] of cases) {
      assert.throws(
        () => buildSettings({ 'ambient-enablement-selector': value }, NODE),
        (e: unknown) => e instanceof ConfigErrors && re.test(e.message),
      );
    }
    assert.equal(
      buildSettings({ 'ambient-enablement-selector': JSON.stringify(many.slice(1)) }, NODE).ambient.enablementSelectors
        .length,
      100,
    );
  });

  it('is off and refuses nothing without NODE_NAME when not enabled', () => {
    assert.equal(buildSettings({}, {}).ambient.enabled, false);
  });
});
