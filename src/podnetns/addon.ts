// The agent's one native addon (src/ambient/native/seqpacket.c -> seqpacket.node): ambient's
// seqpacket sockets and the netns owner ioctl (userns.ts) are both in it, so one place says
// where it is and loads it. It lives here, not in src/ambient/, because the import zones let
// src/podnetns/ import only its own files, and ambient may import from here.

import { constants as osConstants } from 'node:os';
import { fileURLToPath } from 'node:url';

// Bundled, the agent sits beside native/ (dist/, /opt/mesh-cni/ in the image); run from source
// (tests, scripts), the addon is the build's dist/native/. One place each, nothing searched.
export const ADDON_PATH = fileURLToPath(
  new URL(
    import.meta.url.endsWith('.ts') ? '../../dist/native/seqpacket.node' : './native/seqpacket.node',
    import.meta.url,
  ),
);
let exports: object | undefined;

/**
 * The addon's exports, loaded on first use (an agent that needs neither never opens the file).
 * Throws dlopen's own error: each caller says what it needed the addon for.
 */
export function loadAddon(): object {
  if (exports) return exports;
  const mod = { exports: {} };
  process.dlopen(mod, ADDON_PATH, osConstants.dlopen.RTLD_NOW);
  exports = mod.exports;
  return exports;
}
