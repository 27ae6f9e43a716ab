// Who is on the other end of a loopback TCP connection: the kernel's socket table
// (/proc/net/tcp and tcp6, of the agent's own netns) lists the client's socket with its owner's
// uid. Its local port is the port our connection came from, its remote port is ours; addresses
// are left out (their hex spelling differs between the two files and IPv4-mapped addresses).
// On a host-network pod this is the node's netns, so a user on the node is named by uid.

import { readFileSync } from 'node:fs';

const TABLES = ['/proc/net/tcp', '/proc/net/tcp6'];

/** The uid owning the socket at `clientPort` connected to our `serverPort`; undefined if not found. */
export function loopbackPeerUid(clientPort: number, serverPort: number): number | undefined {
  for (const table of TABLES) {
    let text: string;
    try {
      text = readFileSync(table, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid ...
      const f = line.trim().split(/\s+/);
      if (f.length < 8) continue;
      const local = Number.parseInt(f[1]!.split(':')[1] ?? '', 16);
      const remote = Number.parseInt(f[2]!.split(':')[1] ?? '', 16);
      if (local === clientPort && remote === serverPort) return Number(f[7]);
    }
  }
  return undefined;
}
