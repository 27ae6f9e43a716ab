// Which pods are ambient (enrolled into the node proxy instead of a sidecar): the enablement
// selectors of --ambient-enablement-selector and the rules around them. Pure and shared: the
// agent's informer (src/ambient/) and the plugin's ADD decide with the same code, so a pod the
// plugin sends to the agent is one the agent keeps, and the other way round.
//
// As Istio's cni/pkg/util/enablement_selector.go, with our names: a selector is a pair of
// Kubernetes label selectors (matchLabels + matchExpressions); an absent or empty one matches
// everything; a pod is ambient when any pair matches its labels and its namespace's labels.
// Deliberate differences (docs/ambient.md "How pods are selected"): a pod labelled
// mesh.io/dataplane-mode=none is never ambient, whatever the selectors say (Istio leaves that to
// the default selector), the namespaces of --exclude-namespaces never are (Istio: PR #59471), and
// a sidecar pod is one the sidecar path redirects (shared/sidecar.ts), not one that merely
// carries the sidecar status annotation (Istio's podHasSidecar).

import { isSidecarPod, type SidecarPodLike } from './sidecar.ts';

export const DATAPLANE_MODE_LABEL = 'mesh.io/dataplane-mode';
export const DATAPLANE_MODE_AMBIENT = 'ambient';
export const DATAPLANE_MODE_NONE = 'none';
/** Set by the agent on an enrolled pod (pods/status): `enabled`, or `pending` while ztunnel has not taken it. */
export const REDIRECTION_ANNOTATION = 'ambient.mesh.io/redirection';

export type SelectorOperator = 'In' | 'NotIn' | 'Exists' | 'DoesNotExist';
const OPERATORS: readonly SelectorOperator[] = ['In', 'NotIn', 'Exists', 'DoesNotExist'];

export interface SelectorExpression {
  readonly key: string;
  readonly operator: SelectorOperator;
  readonly values?: readonly string[];
}

/** A Kubernetes label selector (metav1.LabelSelector); empty or absent matches everything. */
export interface LabelSelector {
  readonly matchLabels?: Readonly<Record<string, string>>;
  readonly matchExpressions?: readonly SelectorExpression[];
}

export interface EnablementSelector {
  readonly podSelector?: LabelSelector;
  readonly namespaceSelector?: LabelSelector;
}

/**
 * The default: a pod labelled mesh.io/dataplane-mode=ambient, or any pod (not labelled none) of
 * a namespace labelled so.
 */
export const DEFAULT_ENABLEMENT_SELECTORS: readonly EnablementSelector[] = [
  { podSelector: { matchLabels: { [DATAPLANE_MODE_LABEL]: DATAPLANE_MODE_AMBIENT } } },
  {
    podSelector: {
      matchExpressions: [{ key: DATAPLANE_MODE_LABEL, operator: 'NotIn', values: [DATAPLANE_MODE_NONE] }],
    },
    namespaceSelector: { matchLabels: { [DATAPLANE_MODE_LABEL]: DATAPLANE_MODE_AMBIENT } },
  },
];

type Labels = Readonly<Record<string, string>> | undefined;

/** metav1.LabelSelectorAsSelector then Matches: every matchLabels pair and every expression hold. */
export function labelSelectorMatches(sel: LabelSelector | undefined, labels: Labels): boolean {
  if (!sel) return true;
  const have = labels ?? {};
  for (const [k, v] of Object.entries(sel.matchLabels ?? {})) {
    if (!Object.hasOwn(have, k) || have[k] !== v) return false;
  }
  for (const e of sel.matchExpressions ?? []) {
    const present = Object.hasOwn(have, e.key);
    const values = e.values ?? [];
    const ok =
      e.operator === 'Exists'
        ? present
        : e.operator === 'DoesNotExist'
          ? !present
          : e.operator === 'In'
            ? present && values.includes(have[e.key]!)
            : !present || !values.includes(have[e.key]!);
    if (!ok) return false;
  }
  return true;
}

/** The pod fields the decision reads (a V1Pod fits): the sidecar decision's, namespace, hostNetwork. */
export interface PodLike extends SidecarPodLike {
  readonly metadata?: SidecarPodLike['metadata'] & { readonly namespace?: string };
  readonly spec?: SidecarPodLike['spec'] & { readonly hostNetwork?: boolean };
}

export interface AmbientRules {
  /** Namespaces never enrolled (--exclude-namespaces). */
  readonly excludeNamespaces?: readonly string[];
}

/**
 * Whether the pod should be enrolled: not on the host network, no sidecar, not labelled
 * dataplane-mode=none, not in an excluded namespace, and one selector pair matches.
 * `namespaceLabels` undefined: the namespace is not known (yet), matched as having no labels.
 */
export function isAmbientPod(
  pod: PodLike,
  namespaceLabels: Labels,
  selectors: readonly EnablementSelector[],
  rules: AmbientRules = {},
): boolean {
  if (neverAmbient(pod)) return false;
  const labels = pod.metadata?.labels ?? {};
  if (labels[DATAPLANE_MODE_LABEL] === DATAPLANE_MODE_NONE) return false;
  if ((rules.excludeNamespaces ?? []).includes(pod.metadata?.namespace ?? '')) return false;
  return selectors.some(
    (s) => labelSelectorMatches(s.podSelector, labels) && labelSelectorMatches(s.namespaceSelector, namespaceLabels),
  );
}

/**
 * A host-network pod or a sidecar pod (the sidecar path redirects it): never ambient, whatever
 * its labels, its namespace's or the selectors say, so never enrolled by the agent either (its
 * redirection annotation, which its owner can write, is not the agent's). A pod that claims a
 * sidecar the sidecar path does not take is not one: it is decided as any other pod, so none
 * falls between the two paths with no redirection.
 */
export function neverAmbient(pod: PodLike): boolean {
  return pod.spec?.hostNetwork === true || isSidecarPod(pod);
}

/**
 * Whether a namespace's labels alone make any selector match (a selector with a namespace part):
 * a relabel that flips this changes which of its pods are ambient (Istio's MatchesNamespace).
 */
export function namespaceSelected(selectors: readonly EnablementSelector[], namespaceLabels: Labels): boolean {
  return selectors.some(
    (s) => isNonEmpty(s.namespaceSelector) && labelSelectorMatches(s.namespaceSelector, namespaceLabels),
  );
}

function isNonEmpty(sel: LabelSelector | undefined): boolean {
  return (
    sel !== undefined && (Object.keys(sel.matchLabels ?? {}).length > 0 || (sel.matchExpressions ?? []).length > 0)
  );
}

/** Selectors in one list, at most: the plugin reads them on every ADD and each pod decision walks them. */
export const MAX_ENABLEMENT_SELECTORS = 100;

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/**
 * Checks the shape of a parsed selector list (from YAML or JSON) and returns it typed; throws an
 * Error saying what is wrong and where (`[1].podSelector.matchExpressions[0].operator: ...`).
 * Label key and value syntax is the caller's (the agent checks it as the API server does).
 */
export function parseEnablementSelectors(value: unknown): EnablementSelector[] {
  if (!Array.isArray(value)) throw new Error('expected a list of {podSelector, namespaceSelector}');
  if (value.length > MAX_ENABLEMENT_SELECTORS)
    throw new Error(`${value.length} selectors: at most ${MAX_ENABLEMENT_SELECTORS} (use matchExpressions with In)`);
  return value.map((item, i) => {
    const at = `[${i}]`;
    if (!isObject(item)) throw new Error(`${at}: expected an object with podSelector and/or namespaceSelector`);
    for (const k of Object.keys(item)) {
      if (k !== 'podSelector' && k !== 'namespaceSelector')
        throw new Error(`${at}: unknown field ${JSON.stringify(k)}; expected podSelector and/or namespaceSelector`);
    }
    const out: { podSelector?: LabelSelector; namespaceSelector?: LabelSelector } = {};
    if (item.podSelector != null) out.podSelector = labelSelector(`${at}.podSelector`, item.podSelector);
    if (item.namespaceSelector != null)
      out.namespaceSelector = labelSelector(`${at}.namespaceSelector`, item.namespaceSelector);
    return out;
  });
}

function labelSelector(at: string, v: unknown): LabelSelector {
  if (!isObject(v)) throw new Error(`${at}: expected a label selector {matchLabels, matchExpressions}`);
  for (const k of Object.keys(v)) {
    if (k !== 'matchLabels' && k !== 'matchExpressions')
      throw new Error(`${at}: unknown field ${JSON.stringify(k)}; expected matchLabels and/or matchExpressions`);
  }
  const out: { matchLabels?: Record<string, string>; matchExpressions?: SelectorExpression[] } = {};
  if (v.matchLabels != null) {
    if (!isObject(v.matchLabels)) throw new Error(`${at}.matchLabels: expected a map of label key to value`);
    for (const [k, val] of Object.entries(v.matchLabels)) {
      if (typeof val !== 'string') throw new Error(`${at}.matchLabels.${k}: expected a string value`);
    }
    out.matchLabels = { ...(v.matchLabels as Record<string, string>) };
  }
  if (v.matchExpressions != null) {
    if (!Array.isArray(v.matchExpressions)) throw new Error(`${at}.matchExpressions: expected a list`);
    out.matchExpressions = v.matchExpressions.map((e: unknown, j) => expression(`${at}.matchExpressions[${j}]`, e));
  }
  return out;
}

function expression(at: string, e: unknown): SelectorExpression {
  if (!isObject(e)) throw new Error(`${at}: expected {key, operator, values}`);
  if (typeof e.key !== 'string' || e.key === '') throw new Error(`${at}.key: expected a label key`);
  if (!OPERATORS.includes(e.operator as SelectorOperator))
    throw new Error(`${at}.operator: expected one of ${OPERATORS.join(', ')}, got ${JSON.stringify(e.operator)}`);
  const operator = e.operator as SelectorOperator;
  const values = e.values ?? [];
  if (!Array.isArray(values) || values.some((x) => typeof x !== 'string'))
    throw new Error(`${at}.values: expected a list of strings`);
  // As metav1.LabelSelectorAsSelector: In/NotIn need values, Exists/DoesNotExist take none.
  if ((operator === 'In' || operator === 'NotIn') && values.length === 0)
    throw new Error(`${at}.values: ${operator} needs at least one value`);
  if ((operator === 'Exists' || operator === 'DoesNotExist') && values.length > 0)
    throw new Error(`${at}.values: ${operator} takes no values`);
  return values.length > 0 ? { key: e.key, operator, values: [...(values as string[])] } : { key: e.key, operator };
}
