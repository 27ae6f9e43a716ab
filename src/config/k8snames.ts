// The name rules the API server applies (k8s.io/apimachinery's IsDNS1123Label,
// IsDNS1123Subdomain and IsQualifiedName), so a flag naming a container, an annotation or a node
// that Kubernetes would never accept is refused at start-up, with the rule, instead of matching
// nothing for the agent's whole life. Each check returns what is wrong, or undefined.

const LABEL = '[a-z0-9]([-a-z0-9]*[a-z0-9])?';
const DNS1123_LABEL = new RegExp(`^${LABEL}$`);
const DNS1123_SUBDOMAIN = new RegExp(`^${LABEL}(\\.${LABEL})*$`);
const NAME_PART = /^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$/;

export const DNS1123_LABEL_RULE =
  'a DNS-1123 label: at most 63 lower-case letters, digits and -, starting and ending with a letter or digit';
export const DNS1123_SUBDOMAIN_RULE =
  'a DNS-1123 subdomain: at most 253 lower-case letters, digits, - and ., each dot-separated part ' +
  'starting and ending with a letter or digit';
export const QUALIFIED_NAME_RULE =
  'a qualified name: [prefix/]name, the name at most 63 letters, digits, -, _ and ., starting and ending ' +
  'with a letter or digit, the prefix a DNS-1123 subdomain';

/** A container's name, a namespace's, a port's: what the API server takes as a DNS-1123 label. */
export function dns1123LabelProblem(value: string): string | undefined {
  if (value.length > 63) return `${value.length} characters, more than 63`;
  if (DNS1123_LABEL.test(value)) return undefined;
  // Kubernetes says the same of a name that is a subdomain but not a label.
  if (DNS1123_SUBDOMAIN.test(value)) return 'has a dot';
  return 'has a character other than a-z, 0-9 and -, or starts or ends with -';
}

/** A node's name, most objects' names, a qualified name's prefix: a DNS-1123 subdomain. */
export function dns1123SubdomainProblem(value: string): string | undefined {
  if (value.length > 253) return `${value.length} characters, more than 253`;
  if (DNS1123_SUBDOMAIN.test(value)) return undefined;
  return 'has a character other than a-z, 0-9, - and ., or a part that is empty or starts or ends with -';
}

/** A label key, and (case aside: see annotationKeyProblem) an annotation key. */
export function qualifiedNameProblem(value: string): string | undefined {
  const parts = value.split('/');
  if (parts.length > 2) return 'has more than one /';
  const name = parts.length === 2 ? parts[1]! : parts[0]!;
  if (parts.length === 2) {
    const prefix = parts[0]!;
    if (prefix === '') return 'the prefix before / is empty';
    const why = dns1123SubdomainProblem(prefix);
    if (why !== undefined) return `the prefix ${JSON.stringify(prefix)} is not a DNS-1123 subdomain: ${why}`;
  }
  if (name === '') return 'the name is empty';
  if (name.length > 63) return `the name has ${name.length} characters, more than 63`;
  if (!NAME_PART.test(name))
    return `the name ${JSON.stringify(name)} has a character other than letters, digits, -, _ and ., or does not start and end with a letter or digit`;
  return undefined;
}

/**
 * An annotation key: the API server checks it as a qualified name after lower-casing it, so
 * `Example.com/Status` is a key a pod can carry (and must then be matched as written).
 */
export function annotationKeyProblem(value: string): string | undefined {
  return qualifiedNameProblem(value.toLowerCase());
}
