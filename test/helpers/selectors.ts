// Selector matching for the test API server, as the real one matches (k8s.io/apimachinery
// labels.Requirement.Matches, fields hasTerm/notHasTerm over the pod's selectable fields). The
// agent never matches: it sends the operator's selectors and the API server filters. Requirements
// come from the agent's own start-up parser (src/config/selectors.ts); both are checked against
// Kubernetes' selector cases in test/node/orch-selectors.test.ts.

import type { V1Pod } from '@kubernetes/client-node';
import type { FieldRequirement, LabelRequirement } from '../../src/config/selectors.ts';

export {
  parseFieldSelector,
  parseLabelSelector,
  type FieldRequirement,
  type LabelRequirement,
} from '../../src/config/selectors.ts';

/** A label value read as Go's strconv.ParseInt(v, 10, 64) would, else undefined. */
function int64(v: string): bigint | undefined {
  if (!/^[+-]?\d+$/.test(v)) return undefined;
  const n = BigInt(v);
  return n >= -(2n ** 63n) && n < 2n ** 63n ? n : undefined;
}

export function matchesLabels(
  reqs: readonly LabelRequirement[],
  labels: Readonly<Record<string, string>> | undefined,
): boolean {
  const l = labels ?? {};
  return reqs.every((r) => {
    const has = Object.hasOwn(l, r.key);
    const v = l[r.key];
    switch (r.op) {
      case 'exists':
        return has;
      case '!exists':
        return !has;
      case '=':
      case 'in':
        return has && r.values.includes(v!);
      case '!=':
      case 'notin':
        return !has || !r.values.includes(v!);
      case 'gt':
      case 'lt': {
        const n = has ? int64(v!) : undefined;
        const bound = int64(r.values[0] ?? '');
        if (n === undefined || bound === undefined) return false;
        return r.op === 'gt' ? n > bound : n < bound;
      }
    }
  });
}

/** Each selectable pod field's value (pkg/registry/core/pod ToSelectableFields). */
export const POD_FIELD_VALUES: Readonly<Record<string, (pod: V1Pod) => string>> = {
  'metadata.name': (p) => p.metadata?.name ?? '',
  'metadata.namespace': (p) => p.metadata?.namespace ?? '',
  'spec.nodeName': (p) => p.spec?.nodeName ?? '',
  'spec.restartPolicy': (p) => p.spec?.restartPolicy ?? '',
  'spec.schedulerName': (p) => p.spec?.schedulerName ?? '',
  'spec.serviceAccountName': (p) => p.spec?.serviceAccountName ?? '',
  'spec.hostNetwork': (p) => String(p.spec?.hostNetwork ?? false),
  'status.phase': (p) => p.status?.phase ?? '',
  'status.podIP': (p) => p.status?.podIP ?? '',
  'status.nominatedNodeName': (p) => p.status?.nominatedNodeName ?? '',
};

export function matchesFields(reqs: readonly FieldRequirement[], pod: V1Pod): boolean {
  return reqs.every((r) => {
    const get = POD_FIELD_VALUES[r.field];
    const v = get ? get(pod) : '';
    return r.op === '=' ? v === r.value : v !== r.value;
  });
}
