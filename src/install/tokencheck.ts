// What may go into the orchconfig as the plugin's token, minted (TokenRequest) or given
// (--plugin-token-file): one check for both. The orchconfig sits on the node's disk, where root
// on the node or any pod that mounts the net dir can take it, so the token there must be the
// plugin's (pods get) and never the agent's own or another of its account (pods watch, labels).
// Claims are read without verifying the signature: enough to tell whose a token says it is,
// never to trust it (the API server still checks it, and RBAC what it may do).

/** A service-account token is a kilobyte or two; the plugin sends it as a header on every ADD. */
export const PLUGIN_TOKEN_MAX_BYTES = 16 * 1024;

export interface ServiceAccountRef {
  readonly namespace: string;
  readonly name: string;
}

/** The claims the agent reads; absent ones undefined. Null when the token is no JWT. */
export interface TokenClaims {
  readonly sub?: unknown;
  readonly exp?: unknown;
  readonly iat?: unknown;
  readonly aud?: unknown;
}

/** A token refused for the orchconfig: what it is and why, never its bytes. */
export class TokenRefusedError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'TokenRefusedError';
  }
}

export function tokenClaims(token: string): TokenClaims | null {
  const parts = token.split('.');
  if (parts.length !== 3 || parts[1]!.length > 64 * 1024) return null;
  try {
    const claims = JSON.parse(Buffer.from(parts[1]!, 'base64url').toString('utf8')) as unknown;
    return typeof claims === 'object' && claims !== null && !Array.isArray(claims) ? (claims as TokenClaims) : null;
  } catch {
    return null;
  }
}

/**
 * The service account a token says it is of, from its `sub` claim
 * (`system:serviceaccount:<namespace>:<name>`). Null when it is not such a JWT.
 */
export function serviceAccountOfToken(token: string): ServiceAccountRef | null {
  const sub = tokenClaims(token)?.sub;
  const m = typeof sub === 'string' ? /^system:serviceaccount:([^:]+):([^:]+)$/.exec(sub) : null;
  return m ? { namespace: m[1]!, name: m[2]! } : null;
}

const sameAccount = (a: ServiceAccountRef, b: ServiceAccountRef) => a.namespace === b.namespace && a.name === b.name;

export interface PluginTokenRule {
  /** The token the agent itself calls the API server with, if it can be read. */
  readonly agentToken: string | null;
  /**
   * The account the token must be of (minted: the one asked for). Unset (a token the operator
   * gives): any but the agent's own, and one that is no service-account JWT cannot be told.
   */
  readonly account?: ServiceAccountRef;
}

/**
 * Whether `token` is the agent's own (its bytes) or another token of the agent's account (its
 * sub: minted for it, or an earlier agent pod's), which is as powerful: what must never be on
 * the node's disk. Null when it is neither, or when `agentToken` cannot be read.
 */
export function agentTokenMatch(token: string, agentToken: string | null): string | null {
  if (agentToken === null || agentToken === '') return null;
  if (token === agentToken) return "holds the agent's own token";
  const mine = serviceAccountOfToken(agentToken);
  const given = serviceAccountOfToken(token);
  if (mine && given && sameAccount(mine, given))
    return `holds a token of the agent's own service account (${mine.namespace}/${mine.name})`;
  return null;
}

/**
 * Why `token` must not go into the orchconfig ("holds the agent's own token", ...), or null.
 * The caller says whose token it is and what to do.
 */
export function pluginTokenRefusal(token: string, rule: PluginTokenRule): string | null {
  const bytes = Buffer.byteLength(token);
  if (bytes > PLUGIN_TOKEN_MAX_BYTES)
    return `is ${bytes} bytes, more than a service-account token's ${PLUGIN_TOKEN_MAX_BYTES}`;
  // It goes into an HTTP header: a line break there would add headers of its own.
  if (!/^[\x21-\x7e]+$/.test(token)) return 'holds characters no bearer token has (whitespace, control or non-ASCII)';
  const agents = agentTokenMatch(token, rule.agentToken);
  if (agents) return agents;
  const given = serviceAccountOfToken(token);
  const want = rule.account;
  if (want && !given)
    return `is not a token of service account ${want.namespace}/${want.name} (no JWT whose sub is system:serviceaccount:${want.namespace}:${want.name})`;
  if (want && given && !sameAccount(want, given))
    return `holds a token of service account ${given.namespace}/${given.name}, not of ${want.namespace}/${want.name}`;
  return null;
}
