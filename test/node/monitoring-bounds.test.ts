// The monitoring port listens on every address, and ControlZ may: a client that opens many
// connections, or sends its headers a byte at a time, must not keep /readyz (the kubelet's
// probe) from an answer or hold a connection for ever. Real sockets on loopback.

import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';
import { HTTP_BOUNDS } from '../../src/monitoring/httpbounds.ts';
import { serveControlz, type ControlzServer } from '../../src/monitoring/ctrlz.ts';
import {
  startMonitoringServer,
  MONITORING_MAX_CONNECTIONS,
  type MonitoringServer,
} from '../../src/monitoring/server.ts';
import { request } from '../helpers/observability.ts';

interface Held {
  readonly socket: net.Socket;
  closed: boolean;
}

/** Opens a connection that sends the start of a request and never ends its headers. */
async function holdPartial(port: number): Promise<Held> {
  const socket = net.connect(port, '127.0.0.1');
  const held: Held = { socket, closed: false };
  socket.on('error', () => {});
  socket.on('close', () => (held.closed = true));
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', resolve);
    socket.once('error', reject);
  });
  socket.write('GET /readyz HTTP/1.1\r\nhost: 127.0.0.1\r\n');
  return held;
}

/** Resolves once `held` is closed by the server; rejects after `ms` (the test's own bound). */
function closedWithin(held: Held, ms: number): Promise<void> {
  if (held.closed) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`connection still open after ${ms} ms`)), ms);
    held.socket.once('close', () => {
      clearTimeout(t);
      resolve();
    });
  });
}

/** A client sending header bytes one at a time, for ever: only the server can end it. */
function trickle(port: number): Held {
  const socket = net.connect(port, '127.0.0.1');
  const held: Held = { socket, closed: false };
  socket.on('error', () => {});
  const timer = setInterval(() => socket.write('x'), 200);
  socket.on('close', () => {
    held.closed = true;
    clearInterval(timer);
  });
  socket.once('connect', () => socket.write('GET /readyz HTTP/1.1\r\nx-slow: '));
  return held;
}

async function exercise(port: number, path: string, max: number): Promise<void> {
  const held: Held[] = [];
  try {
    for (let i = 0; i < max + 8; i++) held.push(await holdPartial(port));
    const r = await request(`http://127.0.0.1:${port}${path}`);
    assert.equal(r.status, 200);
    // Room was made by closing the oldest: the first ones are gone, the newest still held.
    await Promise.all(held.slice(0, 8).map((h) => closedWithin(h, 5000)));
    assert.equal(held.at(-1)?.closed, false);
  } finally {
    for (const h of held) h.socket.destroy();
  }
}

describe('monitoring server bounds', () => {
  let server: MonitoringServer;
  before(async () => {
    server = await startMonitoringServer({
      port: 0,
      host: '127.0.0.1',
      readiness: { notReady: () => [], notes: () => [] },
    });
  });
  after(() => server.close());

  it(`answers /readyz while more than ${MONITORING_MAX_CONNECTIONS} connections sit on partial headers, closing the oldest`, async () => {
    await exercise(server.port, '/readyz', MONITORING_MAX_CONNECTIONS);
  });

  it(`cuts a client that trickles its headers (headers timeout ${HTTP_BOUNDS.headersTimeoutMs} ms)`, async () => {
    await closedWithin(trickle(server.port), 20_000);
  });

  it('refuses headers over the size bound', async () => {
    const r = await request(`http://127.0.0.1:${server.port}/readyz`, {
      headers: { 'x-big': 'a'.repeat(HTTP_BOUNDS.maxHeaderSize) },
    }).catch((e: Error) => ({ status: 0, error: e }));
    assert.ok(r.status === 431 || r.status === 0, `status ${r.status}`);
  });
});

describe('ControlZ bounds', () => {
  let server: ControlzServer;
  before(async () => {
    server = await serveControlz('127.0.0.1', 0, { components: () => [] });
  });
  after(() => server.close());

  it('answers while its connection cap is full of partial headers, closing the oldest', async () => {
    await exercise(server.port, '/api/components', HTTP_BOUNDS.ctrlzMaxConnections);
  });

  it('cuts a client that trickles its headers', async () => {
    await closedWithin(trickle(server.port), 20_000);
  });
});
