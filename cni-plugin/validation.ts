// mesh-validation's check: does outbound traffic in this netns really get redirected? Listen on
// the probe port on loopback (where REDIRECT delivers locally generated traffic), connect to the
// probe address (a documentation address only our probe rule matches) and see whether that very
// connection (same client port) arrives at the listener within the timeout. A connection that
// succeeds but never arrives went somewhere else: not redirected either.

import net from 'node:net';
import { PROBE_ADDRESS_V4, PROBE_ADDRESS_V6, PROBE_PORT } from './redirect/constants.ts';

export interface ProbeOptions {
  readonly timeoutMs: number;
}

export type ProbeResult =
  { readonly ok: true; readonly detail: string } | { readonly ok: false; readonly detail: string };

/** Between two tries of a probe port another check holds. */
const BUSY_RETRY_MS = 50;

/**
 * Listens on host:port. A port in use is tried again until `deadline`: another run of this very
 * check may hold it for a moment (the agent's proof of an in-place repair runs it in the pod's
 * netns while kubelet may be restarting this init container); failing at once would exit 126 and
 * read as "the repair did not hold".
 */
function listen(host: string, port: number, deadline: number): Promise<net.Server | null> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', (e: NodeJS.ErrnoException) => {
      // No IPv6 loopback in this netns: IPv4 alone decides.
      if (host === '::1' && (e.code === 'EADDRNOTAVAIL' || e.code === 'EAFNOSUPPORT')) resolve(null);
      else if (e.code === 'EADDRINUSE' && Date.now() + BUSY_RETRY_MS < deadline)
        setTimeout(() => listen(host, port, deadline).then(resolve, reject), BUSY_RETRY_MS);
      else
        reject(
          new Error(`cannot listen on ${host.includes(':') ? `[${host}]` : host}:${port}: ${e.code ?? e.message}`),
        );
    });
    s.listen({ host, port, exclusive: true }, () => resolve(s));
  });
}

export async function probe(opts: ProbeOptions): Promise<ProbeResult> {
  const port = PROBE_PORT;
  const addresses = [PROBE_ADDRESS_V4, PROBE_ADDRESS_V6];
  const deadline = Date.now() + opts.timeoutMs;
  const arrivedPorts = new Set<number>();
  const waiters = new Map<number, () => void>();
  const sockets = new Set<net.Socket>();
  // Settled, not all: when one listen fails, the one that succeeded is closed again.
  const listening = await Promise.allSettled([listen('127.0.0.1', port, deadline), listen('::1', port, deadline)]);
  const servers = listening.flatMap((r) => (r.status === 'fulfilled' && r.value !== null ? [r.value] : []));
  const failed = listening.find((r) => r.status === 'rejected');
  if (failed) {
    for (const s of servers) s.close();
    return { ok: false, detail: (failed.reason as Error).message };
  }
  for (const s of servers) {
    s.on('connection', (c) => {
      sockets.add(c);
      c.on('error', () => {});
      const p = c.remotePort ?? 0;
      arrivedPorts.add(p);
      waiters.get(p)?.();
    });
  }
  const failures: string[] = [];
  try {
    for (const addr of addresses) {
      const remaining = deadline - Date.now();
      if (remaining <= 0) break;
      const target = `${addr.includes(':') ? `[${addr}]` : addr}:${port}`;
      const outcome = await new Promise<string | null>((resolve) => {
        const c = net.connect({ host: addr, port });
        sockets.add(c);
        let localPort = 0;
        let connected = false;
        const timer = setTimeout(
          () =>
            resolve(
              connected
                ? `connected to ${target} but the connection never reached the local listener on port ${port}: traffic is not redirected`
                : `no connection to ${target} within ${opts.timeoutMs} ms: traffic is not redirected`,
            ),
          remaining,
        );
        const arrived = () => {
          clearTimeout(timer);
          resolve(null);
        };
        c.on('connect', () => {
          connected = true;
          localPort = c.localPort ?? 0;
          if (arrivedPorts.has(localPort)) arrived();
          else waiters.set(localPort, arrived);
        });
        c.on('error', (e: NodeJS.ErrnoException) => {
          clearTimeout(timer);
          resolve(`connecting to ${target} failed: ${e.code ?? e.message}`);
        });
      });
      if (outcome === null)
        return { ok: true, detail: `a connection to ${target} arrived at the local listener on port ${port}` };
      failures.push(outcome);
      // Only an unreachable family (no address, no route) moves on to the next address.
      if (!/ENETUNREACH|EADDRNOTAVAIL|EAFNOSUPPORT|EHOSTUNREACH/.test(outcome)) break;
    }
    return { ok: false, detail: failures.join('; ') || `probe timed out after ${opts.timeoutMs} ms` };
  } finally {
    for (const c of sockets) c.destroy();
    for (const s of servers) s.close();
  }
}
