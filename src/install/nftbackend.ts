// The redirect backend as a part of the agent: the node probed once at start (nftprobe.ts), the
// backend decided (nfthost.ts) before the installer writes our entry, the choice and its why in
// the start log and ControlZ, and /readyz not ready when --native-nftables=true and the node
// cannot. Nothing is probed with --native-nftables=false.

import type { Component } from '../component.ts';
import type { NativeNftablesMode } from '../config/flags.ts';
import { scope } from '../monitoring/logging.ts';
import { decideBackend, type BackendChoice } from './nfthost.ts';
import { probeNftHost } from './nftprobe.ts';

const log = scope('install');

/** What the part reads: the mode asked for and where nft is looked for. */
export interface NftBackendArgs {
  readonly mode: NativeNftablesMode;
  /** The agent's PATH dirs, then the sbin dirs, as its runner searches them. */
  readonly dirs: readonly string[];
}

export interface NftBackendPart extends Component {
  readonly choice: BackendChoice;
}

export async function startNftBackend(args: NftBackendArgs): Promise<NftBackendPart> {
  const facts = args.mode === 'false' ? null : await probeNftHost({ dirs: args.dirs });
  const choice = decideBackend(args.mode, facts);
  const fields = { mode: args.mode, backend: choice.backend, why: choice.why };
  if (choice.notReady === null) log.info('redirect backend', fields);
  else log.warn('redirect backend', fields);
  return {
    name: 'nftables',
    choice,
    notReadyReasons: () => (choice.notReady === null ? [] : [`nftables: ${choice.notReady}`]),
    status: () => ({ ...fields, ...(facts ? { facts } : {}) }),
    stop: async () => {},
  };
}
