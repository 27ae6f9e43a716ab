// The CNI plugin's credential: a short-lived token of its own service account (pods get only),
// minted by the agent with the TokenRequest API and refreshed well before it expires. The
// orchconfig in the host's CNI net dir holds this token and nothing else: the agent's own token,
// which may watch pods and label them, never leaves the agent's pod, so root on one node (or any
// pod that mounts the net dir) gets a credential that can read pods for an hour, not one that can
// change the cluster.

import path from 'node:path';
import type { KubeConfig } from '@kubernetes/client-node/dist/config.js';
import type { Component } from '../component.ts';
import type { InstallSettings } from '../config/settings.ts';
import { orchKubeConfig, orchLimiter, type OrchClientArgs } from '../orch/client.ts';
import * as metrics from './metrics.ts';
import { readRegularFile, UnsafeFileError } from './safefile.ts';
import { pluginTokenRefusal, serviceAccountOfToken, tokenClaims, TokenRefusedError } from './tokencheck.ts';
import { scope } from '../monitoring/logging.ts';
import { ApiError, toApiError } from '../orch/errors.ts';
import { apiRequest } from '../orch/request.ts';
import type { RequestLimiter } from '../orch/ratelimit.ts';

const log = scope('install');

/** Where the orchconfig's token comes from: the token to write now, or why there is none. */
export interface PluginTokenSource {
  current(): Promise<{ readonly token: string } | { readonly missing: string }>;
  /** `listener` runs whenever the token changed, so the orchconfig is rewritten at once. */
  onChange(listener: () => void): void;
}

export interface MintedToken {
  readonly token: string;
  /** Epoch milliseconds. */
  readonly expiresAt: number;
}

/** One TokenRequest; fails with an ApiError. */
export type Mint = (signal: AbortSignal) => Promise<MintedToken>;

export interface TokenRequestTarget {
  readonly namespace: string;
  readonly serviceAccount: string;
  readonly expirationSeconds: number;
  /** Empty: the API server's default audience. */
  readonly audiences: readonly string[];
  /** The agent's own token, read at each mint (the kubelet rotates it): never to be handed on. */
  readonly agentToken?: () => Promise<string | null>;
}

/**
 * Its expirationTimestamp and the token's exp come from two readings of the API server's clock
 * (the REST handler's and the token generator's), a second or so apart at most.
 */
const EXPIRY_DISAGREEMENT_S = 5;

/**
 * POST .../serviceaccounts/<name>/token. Without audiences the API server binds the token to its
 * own default audience: the one audience it is sure to accept, and the plugin uses the token
 * against that API server and nowhere else. Not bound to the agent's pod: a token that died with
 * the agent's pod would fail every pod start on the node during each agent restart or upgrade.
 */
export function tokenRequestMint(kc: KubeConfig, t: TokenRequestTarget, limiter?: RequestLimiter): Mint {
  const where = `/api/v1/namespaces/${encodeURIComponent(t.namespace)}/serviceaccounts/${encodeURIComponent(t.serviceAccount)}/token`;
  const what = `minting a token for service account ${t.namespace}/${t.serviceAccount} (TokenRequest)`;
  return async (signal) => {
    const spec: Record<string, unknown> = { expirationSeconds: t.expirationSeconds };
    if (t.audiences.length > 0) spec.audiences = t.audiences;
    const answer = await apiRequest<{
      spec?: { expirationSeconds?: unknown };
      status?: { token?: unknown; expirationTimestamp?: unknown };
    }>(kc, 'POST', where, what, {
      body: { apiVersion: 'authentication.k8s.io/v1', kind: 'TokenRequest', spec },
      signal,
      limiter,
    });
    const token = answer?.status?.token;
    if (typeof token !== 'string' || token === '')
      throw new ApiError(what, undefined, 'the answer has no status.token');
    const lifetimeS = await checkMinted(token, answer?.status?.expirationTimestamp, t);
    // Counted from now on our clock: exp is on the server's, and a node clock behind it would
    // refresh only after the token died.
    return { token, expiresAt: Date.now() + lifetimeS * 1000 };
  };
}

/**
 * The answer's token goes to the node's disk: it must be a token of the account asked for
 * (never the agent's own, nor another of its account), for the audiences asked for, living no
 * longer than asked. Its lifetime comes from its own claims (exp - iat, both on the server's
 * clock), which the API server enforces, not from the fields beside it. Throws TokenRefusedError.
 */
async function checkMinted(token: string, expirationTimestamp: unknown, t: TokenRequestTarget): Promise<number> {
  const refuse = (why: string) =>
    new TokenRefusedError(
      `the TokenRequest answer for service account ${t.namespace}/${t.serviceAccount} ${why}; not written to the node. ` +
        `Find what answers TokenRequests in the API server's place (an admission webhook, an API proxy) and fix it`,
    );
  const agentToken = t.agentToken ? await t.agentToken().catch(() => null) : null;
  const refused = pluginTokenRefusal(token, {
    agentToken,
    account: { namespace: t.namespace, name: t.serviceAccount },
  });
  if (refused) throw refuse(refused);
  const claims = tokenClaims(token)!;
  const { exp, iat, aud } = claims;
  if (typeof exp !== 'number' || typeof iat !== 'number' || !Number.isFinite(exp) || !Number.isFinite(iat))
    throw refuse('has no exp and iat claims (seconds), so how long it lives cannot be told');
  const lifetime = exp - iat;
  if (lifetime <= 0 || lifetime > t.expirationSeconds)
    throw refuse(`lives ${lifetime} s, longer than the ${t.expirationSeconds} s asked for (or not at all)`);
  const stamp = Date.parse(String(expirationTimestamp));
  if (
    expirationTimestamp !== undefined &&
    (Number.isNaN(stamp) || Math.abs(stamp / 1000 - exp) > EXPIRY_DISAGREEMENT_S)
  )
    throw refuse(
      `says status.expirationTimestamp ${JSON.stringify(String(expirationTimestamp)).slice(0, 40)}, which is not the token's exp ${new Date(exp * 1000).toISOString()}`,
    );
  if (t.audiences.length > 0) {
    const got = typeof aud === 'string' ? [aud] : Array.isArray(aud) ? aud.map(String) : [];
    if (got.length !== t.audiences.length || !t.audiences.every((a) => got.includes(a)))
      throw refuse(
        `is for the audiences ${JSON.stringify(got).slice(0, 200)}, not the ${JSON.stringify(t.audiences)} asked for`,
      );
  }
  return lifetime;
}

/** When to refresh: at 50-80% of the lifetime, at random, so a fleet of agents spreads its requests. */
export function refreshDelayMs(lifetimeMs: number, random: number): number {
  return Math.max(0, lifetimeMs) * (0.5 + 0.3 * Math.min(1, Math.max(0, random)));
}

export interface MinterOptions {
  /** "service account mesh-system/mesh-cni-plugin", for messages. */
  readonly account: string;
  readonly now?: () => number;
  readonly random?: () => number;
  /** First retry after a failed refresh; doubles up to retryMaxMs (jittered), never past expiry. */
  readonly retryBaseMs?: number;
  readonly retryMaxMs?: number;
  readonly requestTimeoutMs?: number;
}

/**
 * Keeps a fresh plugin token: mints one at start, refreshes at 50-80% of its lifetime, and on
 * failure keeps the old token (it still works until it expires) and retries with backoff. Ready
 * while it has a token that is neither expired nor past the point where it should already have
 * been replaced (80% of its lifetime): then /readyz says why.
 */
export class PluginTokenMinter implements Component, PluginTokenSource {
  readonly name = 'plugin-token';
  readonly #mint: Mint;
  readonly #o: Required<MinterOptions>;
  #token: MintedToken | null = null;
  #issuedAt = 0;
  #lastError = '';
  /** Why the last answer's token was refused; cleared by the next one taken. */
  #refused = '';
  #failures = 0;
  #timer: NodeJS.Timeout | null = null;
  /** Milliseconds from the last attempt to the next one. */
  #nextInMs: number | null = null;
  #inflight: AbortController | null = null;
  #stopped = false;
  readonly #listeners: (() => void)[] = [];

  constructor(mint: Mint, o: MinterOptions) {
    this.#mint = mint;
    this.#o = {
      now: Date.now,
      random: Math.random,
      retryBaseMs: 1000,
      retryMaxMs: 60_000,
      requestTimeoutMs: 10_000,
      ...o,
    };
  }

  /**
   * Mints the first token, waiting for it at most `waitMs` (the installer writes the orchconfig
   * when it comes); a failure is retried in the background and shown on /readyz.
   */
  async start(waitMs = 3000): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([this.#refresh(), new Promise((resolve) => (timer = setTimeout(resolve, waitMs)))]);
    clearTimeout(timer);
  }

  onChange(listener: () => void): void {
    this.#listeners.push(listener);
  }

  async current(): Promise<{ token: string } | { missing: string }> {
    if (this.#token) return { token: this.#token.token };
    return {
      missing: `the plugin's token is not minted yet (${this.#o.account})${this.#lastError ? `: ${this.#lastError}` : ''}; the orchconfig is written once it is`,
    };
  }

  async #refresh(): Promise<void> {
    if (this.#stopped) return;
    const abort = new AbortController();
    this.#inflight = abort;
    const timer = setTimeout(() => abort.abort(), this.#o.requestTimeoutMs);
    try {
      const t = await this.#mint(abort.signal);
      if (this.#stopped) return;
      this.#token = t;
      this.#issuedAt = this.#o.now();
      this.#lastError = '';
      this.#refused = '';
      this.#failures = 0;
      metrics.pluginTokenRefreshes.inc();
      metrics.pluginTokenExpiry.set(t.expiresAt / 1000);
      const delay = refreshDelayMs(t.expiresAt - this.#issuedAt, this.#o.random());
      log.info("minted the plugin's token", {
        account: this.#o.account,
        expires: new Date(t.expiresAt).toISOString(),
        refreshInSeconds: Math.round(delay / 1000),
      });
      this.#arm(delay);
      for (const l of this.#listeners) l();
    } catch (e) {
      if (this.#stopped) return;
      const refused = e instanceof TokenRefusedError;
      const err = refused ? e : toApiError(`minting the plugin's token (${this.#o.account})`, e);
      this.#failures++;
      this.#lastError = err.message;
      this.#refused = refused ? err.message : '';
      metrics.pluginTokenRefreshFailures.inc({ reason: refused ? 'refused' : (err as ApiError).reason });
      // Backoff with jitter (50-100% of the step), and never later than the old token's expiry
      // (once it expired, the backoff alone: a failing API server is not asked every second).
      const step = Math.min(this.#o.retryMaxMs, this.#o.retryBaseMs * 2 ** Math.min(20, this.#failures - 1));
      let delay = step * (0.5 + 0.5 * this.#o.random());
      const left = this.#token ? this.#token.expiresAt - this.#o.now() : 0;
      if (left > 0) delay = Math.min(delay, left);
      log.error(
        refused
          ? 'refused the token the API server answered for the plugin; the old one stays in the orchconfig until it expires'
          : "cannot mint the plugin's token; the old one stays in the orchconfig until it expires",
        {
          error: err.message,
          attempt: this.#failures,
          retryInMs: Math.round(delay),
          oldTokenExpires: this.#token ? new Date(this.#token.expiresAt).toISOString() : null,
        },
      );
      this.#arm(delay);
    } finally {
      clearTimeout(timer);
      if (this.#inflight === abort) this.#inflight = null;
    }
  }

  #arm(delayMs: number): void {
    this.#nextInMs = delayMs;
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = setTimeout(() => void this.#refresh(), delayMs);
  }

  notReadyReasons(): readonly string[] {
    // A refused answer is not a late one: something hands out tokens that must not reach the
    // node, and that is said at once, whatever token is still in use.
    if (this.#refused) return [this.#refused];
    const t = this.#token;
    if (!t) return [`no token for the plugin yet (${this.#o.account})${this.#lastError ? `: ${this.#lastError}` : ''}`];
    const now = this.#o.now();
    const why = this.#lastError ? `; refreshing failed ${this.#failures} time(s), last: ${this.#lastError}` : '';
    if (now >= t.expiresAt)
      return [
        `the plugin's token (${this.#o.account}) expired at ${new Date(t.expiresAt).toISOString()}; pods on this node cannot be checked by the plugin${why}`,
      ];
    // Past 80% of its lifetime the token should have been replaced already.
    if (now >= this.#issuedAt + 0.8 * (t.expiresAt - this.#issuedAt)) {
      return [
        `the plugin's token (${this.#o.account}) expires at ${new Date(t.expiresAt).toISOString()}, in ${Math.round((t.expiresAt - now) / 1000)} s${why || '; refreshing it is late'}`,
      ];
    }
    return [];
  }

  status(): Record<string, unknown> {
    return {
      account: this.#o.account,
      expires: this.#token ? new Date(this.#token.expiresAt).toISOString() : null,
      issued: this.#token ? new Date(this.#issuedAt).toISOString() : null,
      failures: this.#failures,
      lastError: this.#lastError || null,
      nextAttemptInMs: this.#nextInMs === null ? null : Math.round(this.#nextInMs),
    };
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#timer) clearTimeout(this.#timer);
    this.#inflight?.abort();
  }
}

/**
 * A token the operator provides (--plugin-token-file), read on every pass. The agent's own token
 * is refused even under another name: it must never reach the node's disk.
 */
export function fileTokenSource(file: string, agentTokenFile: string): PluginTokenSource {
  return {
    async current() {
      let token: string;
      try {
        // A regular file of bounded size only (safefile.ts): a FIFO there would hold every pass.
        token = (await readRegularFile(file)).text.trim();
      } catch (e) {
        if (e instanceof UnsafeFileError) return { missing: `the plugin's token file cannot be used: ${e.message}` };
        return {
          missing: `the plugin's token file ${file} cannot be read: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`,
        };
      }
      if (token === '') return { missing: `the plugin's token file ${file} is empty` };
      const agentToken = await readRegularFile(agentTokenFile).then(
        (r) => r.text.trim(),
        () => null,
      );
      const refused = pluginTokenRefusal(token, { agentToken });
      if (refused) {
        return {
          missing: `the plugin's token file ${file} ${refused}; not written to the node (the agent's own token is ${agentTokenFile}); give a token of the plugin's account`,
        };
      }
      return { token };
    },
    onChange() {},
  };
}

export { serviceAccountOfToken } from './tokencheck.ts';

/** What the plugin's token source reads of the settings: minted (TokenRequest) or from --plugin-token-file. */
export interface PluginTokenArgs extends Pick<
  InstallSettings,
  'pluginTokenFile' | 'pluginServiceAccount' | 'pluginTokenExpirationMs' | 'pluginTokenAudiences' | 'serviceAccountDir'
> {
  /** POD_NAMESPACE: the agent's namespace, where the plugin's account is; empty: the service account's. */
  readonly podNamespace: string;
  /** The agent's own credentials (never written for the plugin) and how it mints. */
  readonly orch: OrchClientArgs;
}

/** The token the agent itself calls the API server with: --orchconfig's user's, else its service account's. */
async function agentOwnToken(args: PluginTokenArgs): Promise<string | null> {
  if (args.orch.orchconfig) {
    try {
      return orchKubeConfig(args.orch).getCurrentUser()?.token ?? null;
    } catch {
      return null;
    }
  }
  return readRegularFile(path.join(args.serviceAccountDir, 'token')).then(
    (r) => r.text.trim(),
    () => null,
  );
}

/**
 * Refuses a --plugin-service-account that is the account the agent runs as: minting for it would
 * write the agent's own rights (pods watch, labels) to the node's disk, stopped only by RBAC's
 * resourceNames. A token that is not a service-account JWT cannot be told: RBAC still stands.
 */
async function refuseOwnAccount(args: PluginTokenArgs): Promise<void> {
  const token = await agentOwnToken(args);
  const own = token === null ? null : serviceAccountOfToken(token);
  if (!own) return;
  const namespace = await agentNamespace(args).catch(() => own.namespace);
  const name = args.pluginServiceAccount;
  if (own.namespace === namespace && own.name === name) {
    throw new Error(
      `--plugin-service-account ${name} is the agent's own service account (${namespace}/${name}): its token would be written to the node's disk; name the plugin's own account (mesh-cni-plugin in deploy/)`,
    );
  }
}

/** The agent's own namespace: POD_NAMESPACE (downward API), else its service-account dir's. */
async function agentNamespace(args: PluginTokenArgs): Promise<string> {
  if (args.podNamespace) return args.podNamespace;
  const file = path.join(args.serviceAccountDir, 'namespace');
  const ns = await readRegularFile(file).then(
    (r) => r.text.trim(),
    () => '',
  );
  if (ns === '')
    throw new ApiError(
      "finding the agent's namespace",
      undefined,
      `POD_NAMESPACE is not set and ${file} is missing or empty; set POD_NAMESPACE from metadata.namespace`,
    );
  return ns;
}

/** The agent's source of the plugin's token: --plugin-token-file if given, else a minter. */
export async function startPluginToken(s: PluginTokenArgs): Promise<PluginTokenSource & Component> {
  if (s.pluginTokenFile) {
    const source = fileTokenSource(s.pluginTokenFile, path.join(s.serviceAccountDir, 'token'));
    return {
      ...source,
      name: 'plugin-token',
      notReadyReasons: () => [],
      status: () => ({ file: s.pluginTokenFile }),
      stop: async () => {},
    };
  }
  await refuseOwnAccount(s);
  let mint: Mint | undefined;
  let namespace = s.podNamespace;
  const minter = new PluginTokenMinter(
    async (signal) => {
      if (!mint) {
        // Worked out on first use, so a missing namespace or API server shows on /readyz, retried.
        namespace = await agentNamespace(s);
        let kc: KubeConfig;
        try {
          kc = orchKubeConfig(s.orch);
        } catch (e) {
          throw new ApiError('reaching the API server', undefined, (e as Error).message);
        }
        mint = tokenRequestMint(
          kc,
          {
            namespace,
            serviceAccount: s.pluginServiceAccount,
            expirationSeconds: Math.round(s.pluginTokenExpirationMs / 1000),
            audiences: s.pluginTokenAudiences,
            agentToken: () => agentOwnToken(s),
          },
          orchLimiter(s.orch),
        );
      }
      return mint(signal);
    },
    { account: `service account ${namespace || '<agent namespace>'}/${s.pluginServiceAccount}` },
  );
  await minter.start();
  return minter;
}
