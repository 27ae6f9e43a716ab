// A PATH on which the agent finds no working firewall program: each of iptables's, ipset's and
// nft's names is a stub that fails. An empty PATH no longer does this, since the agent's host
// runner searches the sbin dirs after its PATH (a container's PATH may lack them): a test that
// wants ambient mode's dataplane unable to start must not let it program this machine's own
// netns (MESH_POSTRT, the probe ipsets) instead.

import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const FAMILIES = ['iptables', 'ip6tables'];
const VARIANTS = ['', '-nft', '-legacy'];
const SUFFIXES = ['', '-save', '-restore'];
const NAMES = [
  ...FAMILIES.flatMap((f) => VARIANTS.flatMap((v) => SUFFIXES.map((s) => `${f}${v}${s}`))),
  'xtables-nft-multi',
  'xtables-legacy-multi',
  'ipset',
  'nft',
];

let dir: string | undefined;

/** The PATH value (one dir of failing stubs, removed when the test process exits). */
export function noFirewallPath(): string {
  if (dir !== undefined) return dir;
  const d = mkdtempSync(path.join(os.tmpdir(), 'mesh-cni-nofirewall-'));
  for (const name of NAMES) {
    const file = path.join(d, name);
    writeFileSync(file, `#!/bin/sh\necho "${name}: not on this test's PATH" >&2\nexit 1\n`);
    chmodSync(file, 0o755);
  }
  process.once('exit', () => rmSync(d, { recursive: true, force: true }));
  dir = d;
  return d;
}
