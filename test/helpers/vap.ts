// Evaluates a ValidatingAdmissionPolicy from deploy/ on one admission request with a real CEL
// implementation (@bufbuild/cel), the way the API server's admission does: the request must
// match a resource rule and every matchCondition, the variables are computed in order, and each
// validation must be true. An expression that fails to evaluate refuses the request, as
// failurePolicy: Fail does. The API server evaluates variables lazily and this eagerly, so a
// variable that fails on a request no validation needs it for refuses here but not there: the
// shipped variables are guarded so that none fails.

import { run } from '@bufbuild/cel';

export interface PolicyObject {
  readonly kind: string;
  readonly metadata: { readonly name: string };
  readonly spec: {
    readonly failurePolicy?: string;
    readonly matchConstraints: {
      readonly resourceRules: readonly {
        readonly apiGroups: readonly string[];
        readonly apiVersions: readonly string[];
        readonly operations: readonly string[];
        readonly resources: readonly string[];
      }[];
    };
    readonly matchConditions?: readonly { readonly name: string; readonly expression: string }[];
    readonly variables?: readonly { readonly name: string; readonly expression: string }[];
    readonly validations: readonly { readonly expression: string; readonly message?: string }[];
  };
}

/** An admission request as the policy sees it: `request`, `object` and `oldObject`. */
export interface AdmissionCase {
  readonly operation: 'CREATE' | 'UPDATE' | 'DELETE';
  readonly resource: string;
  readonly subResource?: string;
  readonly name: string;
  readonly namespace?: string;
  readonly username: string;
  readonly extra?: Readonly<Record<string, readonly string[]>>;
  readonly object: unknown;
  readonly oldObject: unknown;
}

export type Verdict =
  { readonly allowed: true; readonly matched: boolean } | { readonly allowed: false; readonly message: string };

/** JSON as CEL sees a Kubernetes object: maps for objects, int for whole numbers. */
function celValue(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(celValue);
  if (v !== null && typeof v === 'object')
    return new Map(Object.entries(v as Record<string, unknown>).map(([k, x]) => [k, celValue(x)]));
  if (typeof v === 'number' && Number.isInteger(v)) return BigInt(v);
  return v;
}

function requestOf(c: AdmissionCase): Record<string, unknown> {
  return {
    uid: '705ab4f5-6393-11e8-b7cc-42010a800002',
    kind: { group: '', version: 'v1', kind: c.resource === 'nodes' ? 'Node' : 'Pod' },
    resource: { group: '', version: 'v1', resource: c.resource },
    subResource: c.subResource ?? '',
    requestKind: { group: '', version: 'v1', kind: c.resource === 'nodes' ? 'Node' : 'Pod' },
    requestResource: { group: '', version: 'v1', resource: c.resource },
    requestSubResource: c.subResource ?? '',
    name: c.name,
    namespace: c.namespace ?? '',
    operation: c.operation,
    userInfo: {
      username: c.username,
      uid: 'b7a4c7d0-0000-4000-8000-000000000001',
      groups: ['system:serviceaccounts', 'system:serviceaccounts:mesh-system', 'system:authenticated'],
      ...(c.extra ? { extra: c.extra } : {}),
    },
    dryRun: false,
  };
}

function truth(expression: string, bindings: Record<string, unknown>): boolean | Error {
  try {
    const v = run(expression, bindings as Parameters<typeof run>[1]);
    return v === true ? true : v === false ? false : new Error(`not a bool: ${String(v)}`);
  } catch (e) {
    return e instanceof Error ? e : new Error(String(e));
  }
}

export function admit(policy: PolicyObject, c: AdmissionCase): Verdict {
  const resource = c.subResource ? `${c.resource}/${c.subResource}` : c.resource;
  const ruleMatches = policy.spec.matchConstraints.resourceRules.some(
    (r) =>
      (r.apiGroups.includes('') || r.apiGroups.includes('*')) &&
      (r.apiVersions.includes('v1') || r.apiVersions.includes('*')) &&
      (r.operations.includes(c.operation) || r.operations.includes('*')) &&
      (r.resources.includes(resource) || r.resources.includes('*')),
  );
  if (!ruleMatches) return { allowed: true, matched: false };
  const bindings: Record<string, unknown> = {
    request: celValue(requestOf(c)),
    object: celValue(c.object),
    oldObject: celValue(c.oldObject),
  };
  for (const m of policy.spec.matchConditions ?? []) {
    const t = truth(m.expression, bindings);
    if (t instanceof Error) return { allowed: false, message: `matchCondition ${m.name} failed: ${t.message}` };
    if (!t) return { allowed: true, matched: false };
  }
  const variables = new Map<string, unknown>();
  for (const v of policy.spec.variables ?? []) {
    try {
      variables.set(v.name, run(v.expression, { ...bindings, variables } as Parameters<typeof run>[1]));
    } catch (e) {
      return { allowed: false, message: `variable ${v.name} failed: ${(e as Error).message}` };
    }
  }
  for (const v of policy.spec.validations) {
    const t = truth(v.expression, { ...bindings, variables });
    if (t instanceof Error) return { allowed: false, message: `expression failed: ${t.message}` };
    if (!t) return { allowed: false, message: v.message ?? `failed expression: ${v.expression}` };
  }
  return { allowed: true, matched: true };
}
