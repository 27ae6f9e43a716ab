// The node's iptables flavour (legacy or nft), detected once as the plugin detects it (Kubernetes'
// iptables-wrapper rule, cni-plugin/redirect/iptables.ts detectFlavour), in the agent's netns =
// the host's. Shared by in-place repair (src/repair/) and ambient mode (src/ambient/), which may
// not import each other.

import { detectFlavour, type Flavour, type NetnsRunner } from '../../cni-plugin/redirect/iptables.ts';
import { runOnHost } from './run.ts';

export type { Flavour };

/** The host as a runner for detectFlavour. */
export const hostNetnsRunner: NetnsRunner = { where: 'on this node', run: (argv) => runOnHost(argv) };

/** A function giving the node's flavour: detected on the first call, remembered once it worked. */
export function hostFlavourDetector(runner: NetnsRunner = hostNetnsRunner): () => Promise<Flavour> {
  let once: Promise<Flavour> | undefined;
  return () => {
    once ??= detectFlavour(runner).then((d) => d.flavour);
    // A failed detection is tried again by the next caller rather than remembered.
    once.catch(() => (once = undefined));
    return once;
  };
}
