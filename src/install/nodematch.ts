// Whether our DaemonSet still targets this node, decided as the DaemonSet controller decides
// where a daemon pod runs: the template's nodeName, its nodeSelector, its required node affinity,
// and its tolerations (with the ones the controller adds to every daemon pod) against the node's
// NoSchedule and NoExecute taints. A node it no longer targets gets no new agent after this one
// stops, which is what --cleanup-on-exit=auto takes for an uninstall (docs/installer.md "install-cni: the
// installer", "Stopping").
//
// Pure: the pod template and the node in, a verdict out. One rule differs from Kubernetes' on
// purpose, everywhere: what Kubernetes would count as "no match" because it cannot read it (an
// unknown operator, a Gt with two values, no terms at all; the API server refuses all of these
// on write) is `unsure` here, never `not_targeted`: an uninstall needs positive evidence, and a
// misread selector must not take the plugin off a node the DaemonSet still runs on.

import type {
  V1Node,
  V1NodeSelector,
  V1NodeSelectorRequirement,
  V1PodSpec,
  V1Taint,
  V1Toleration,
} from '@kubernetes/client-node';

export type NotTargetedReason = 'node_name' | 'node_selector' | 'node_affinity' | 'untolerated_taint';

export type TargetVerdict =
  | { readonly kind: 'targets' }
  | { readonly kind: 'not_targeted'; readonly reason: NotTargetedReason; readonly why: string }
  | { readonly kind: 'unsure'; readonly why: string };

/** A match that may be unreadable: Kubernetes counts that as no match, we as "cannot tell". */
export type Match = boolean | { readonly unsure: string };

/**
 * The DaemonSet controller's answer for a node (its NodeShouldRunDaemonPod's "should run"): a
 * node where a new daemon pod would not be placed gets no agent after this one.
 */
export function daemonSetTargetsNode(template: V1PodSpec | undefined, node: V1Node): TargetVerdict {
  if (!template) return { kind: 'unsure', why: 'the DaemonSet has no pod template spec' };
  const name = node.metadata?.name ?? '';
  if (template.nodeName && template.nodeName !== name)
    return {
      kind: 'not_targeted',
      reason: 'node_name',
      why: `the DaemonSet's pod template names node ${template.nodeName}`,
    };
  if (!matchesLabelSet(template.nodeSelector, node.metadata?.labels))
    return {
      kind: 'not_targeted',
      reason: 'node_selector',
      why: `node ${name} no longer has the labels of the DaemonSet's nodeSelector ${JSON.stringify(template.nodeSelector)}`,
    };
  const required = template.affinity?.nodeAffinity?.requiredDuringSchedulingIgnoredDuringExecution;
  if (required) {
    const m = matchNodeSelector(required, node);
    if (typeof m !== 'boolean') return { kind: 'unsure', why: `the DaemonSet's required node affinity: ${m.unsure}` };
    if (!m)
      return {
        kind: 'not_targeted',
        reason: 'node_affinity',
        why: `node ${name} no longer matches the DaemonSet's required node affinity`,
      };
  }
  const t = untoleratedTaint(node.spec?.taints ?? [], daemonPodTolerations(template), SCHEDULING_EFFECTS);
  if (t === undefined) return { kind: 'targets' };
  if ('unsure' in t) return { kind: 'unsure', why: t.unsure };
  return {
    kind: 'not_targeted',
    reason: 'untolerated_taint',
    why: `node ${name} has taint ${describeTaint(t.taint)}, which the DaemonSet does not tolerate`,
  };
}

/** A nodeSelector map: every key with exactly that value (an empty or absent map selects every node). */
export function matchesLabelSet(
  selector: Readonly<Record<string, string>> | undefined,
  labels: Readonly<Record<string, string>> | undefined,
): boolean {
  return Object.entries(selector ?? {}).every(([k, v]) => Object.hasOwn(labels ?? {}, k) && labels![k] === v);
}

/**
 * Required node affinity: its terms ORed, each term's expressions and fields ANDed; an empty term
 * selects nothing. A term that cannot be read counts only when no other term matches.
 */
export function matchNodeSelector(selector: V1NodeSelector, node: V1Node): Match {
  const terms = selector.nodeSelectorTerms ?? [];
  if (terms.length === 0) return { unsure: 'it has no nodeSelectorTerms' };
  let unsure: string | undefined;
  for (const [i, term] of terms.entries()) {
    const exprs = term.matchExpressions ?? [];
    const fields = term.matchFields ?? [];
    if (exprs.length === 0 && fields.length === 0) continue;
    const m = allOf([
      ...exprs.map((r) => () => matchLabelRequirement(r, node.metadata?.labels ?? {})),
      ...fields.map((r) => () => matchFieldRequirement(r, node.metadata?.name ?? '')),
    ]);
    if (m === true) return true;
    if (m !== false) unsure ??= `term ${i}: ${m.unsure}`;
  }
  return unsure === undefined ? false : { unsure };
}

/** ANDed requirements: unreadable wins over a plain no, as Kubernetes fails the whole term on a parse error. */
function allOf(reqs: readonly (() => Match)[]): Match {
  let result: Match = true;
  for (const r of reqs) {
    const m = r();
    if (typeof m !== 'boolean') return m;
    if (!m) result = false;
  }
  return result;
}

/** One matchExpressions requirement against the node's labels (Kubernetes' labels.Requirement). */
export function matchLabelRequirement(r: V1NodeSelectorRequirement, labels: Readonly<Record<string, string>>): Match {
  const values = r.values ?? [];
  const has = Object.hasOwn(labels, r.key);
  const value = labels[r.key];
  switch (r.operator) {
    case 'In':
    case 'NotIn':
      if (values.length === 0) return { unsure: `${r.key} ${r.operator} has no values` };
      return r.operator === 'In' ? has && values.includes(value!) : !has || !values.includes(value!);
    case 'Exists':
    case 'DoesNotExist':
      if (values.length !== 0) return { unsure: `${r.key} ${r.operator} has values` };
      return r.operator === 'Exists' ? has : !has;
    case 'Gt':
    case 'Lt': {
      const bound = values.length === 1 ? parseInt64(values[0]!) : undefined;
      if (bound === undefined) return { unsure: `${r.key} ${r.operator} needs exactly one integer value` };
      const v = has ? parseInt64(value!) : undefined;
      if (v === undefined) return false;
      return r.operator === 'Gt' ? v > bound : v < bound;
    }
    default:
      return { unsure: `unknown operator ${JSON.stringify(r.operator)}` };
  }
}

/** One matchFields requirement: only metadata.name, In or NotIn one value (the API server allows nothing else). */
export function matchFieldRequirement(r: V1NodeSelectorRequirement, nodeName: string): Match {
  if (r.key !== 'metadata.name') return { unsure: `unknown field ${JSON.stringify(r.key)}` };
  const values = r.values ?? [];
  if ((r.operator !== 'In' && r.operator !== 'NotIn') || values.length !== 1)
    return { unsure: `metadata.name ${r.operator} needs operator In or NotIn and exactly one value` };
  return r.operator === 'In' ? nodeName === values[0] : nodeName !== values[0];
}

/**
 * Go's strconv.ParseInt(s, 10, 64): an optional sign, decimal digits, within int64 (label
 * values). `canonical`: as toleration values are read, "0" or no sign but `-`, no leading zero.
 */
export function parseInt64(s: string, canonical = false): bigint | undefined {
  if (!(canonical ? /^(0|-?[1-9][0-9]*)$/ : /^[+-]?[0-9]+$/).test(s)) return undefined;
  const v = BigInt(s);
  return v >= -(2n ** 63n) && v < 2n ** 63n ? v : undefined;
}

/** The taint effects that keep a daemon pod off a node (PreferNoSchedule does not). */
export const SCHEDULING_EFFECTS: ReadonlySet<string> = new Set(['NoSchedule', 'NoExecute']);

/**
 * Whether a toleration tolerates a taint (Kubernetes' Toleration.ToleratesTaint): an empty effect
 * matches every effect, an empty key (with Exists) every key, Exists every value, Equal (or no
 * operator) the same value. tolerationSeconds is not looked at, as the controller does not.
 * Gt/Lt (numeric, behind a feature gate): tolerated when the comparison holds, whether or not the
 * cluster has the gate on; we cannot see it, and "tolerated" only keeps the plugin.
 */
export function toleratesTaint(t: V1Toleration, taint: V1Taint): Match {
  if (t.effect && t.effect !== taint.effect) return false;
  if (t.key && t.key !== taint.key) return false;
  switch (t.operator ?? '') {
    case '':
    case 'Equal':
      return (t.value ?? '') === (taint.value ?? '');
    case 'Exists':
      return true;
    case 'Gt':
    case 'Lt': {
      const bound = parseInt64(t.value ?? '', true);
      const v = parseInt64(taint.value ?? '', true);
      if (bound === undefined || v === undefined) return false;
      return t.operator === 'Gt' ? v > bound : v < bound;
    }
    default:
      return { unsure: `toleration operator ${JSON.stringify(t.operator)} is unknown here` };
  }
}

/**
 * The first taint with one of `effects` that no toleration tolerates (Kubernetes'
 * FindMatchingUntoleratedTaint), or `unsure` when a toleration we cannot read might; undefined
 * when every such taint is tolerated.
 */
export function untoleratedTaint(
  taints: readonly V1Taint[],
  tolerations: readonly V1Toleration[],
  effects: ReadonlySet<string>,
): { readonly taint: V1Taint } | { readonly unsure: string } | undefined {
  let unsure: string | undefined;
  for (const taint of taints) {
    if (!effects.has(taint.effect)) continue;
    const answers = tolerations.map((t) => toleratesTaint(t, taint));
    if (answers.includes(true)) continue;
    const maybe = answers.find((a): a is { unsure: string } => typeof a !== 'boolean');
    if (maybe) unsure ??= `taint ${describeTaint(taint)}: ${maybe.unsure}`;
    else return { taint };
  }
  return unsure === undefined ? undefined : { unsure };
}

/**
 * The tolerations the DaemonSet controller gives every daemon pod on top of the template's
 * (AddOrUpdateDaemonPodTolerations): a node that is not ready, unreachable, under disk, memory or
 * PID pressure, cordoned (unschedulable: drained nodes keep their daemon pods) and, for a
 * host-network pod, without a network, keeps its daemon pods.
 */
export function daemonPodTolerations(template: V1PodSpec): V1Toleration[] {
  const exists = (key: string, effect: string): V1Toleration => ({ key, operator: 'Exists', effect });
  return [
    ...(template.tolerations ?? []),
    exists('node.kubernetes.io/not-ready', 'NoExecute'),
    exists('node.kubernetes.io/unreachable', 'NoExecute'),
    exists('node.kubernetes.io/disk-pressure', 'NoSchedule'),
    exists('node.kubernetes.io/memory-pressure', 'NoSchedule'),
    exists('node.kubernetes.io/pid-pressure', 'NoSchedule'),
    exists('node.kubernetes.io/unschedulable', 'NoSchedule'),
    ...(template.hostNetwork ? [exists('node.kubernetes.io/network-unavailable', 'NoSchedule')] : []),
  ];
}

function describeTaint(t: V1Taint): string {
  return `${t.key}${t.value ? `=${t.value}` : ''}:${t.effect}`;
}
