// V8 settings of the agent process, set before any of the agent's own code runs (the entry
// imports this module first), so they need no command line and hold however Node is started.
//
// The agent is an idle control loop: it waits on a watch and a few sockets, and its hot paths
// (JSON of the API server, sockets, TLS) run in C++. V8's optimizing compilers (Maglev,
// TurboFan) made it no faster there, but each one that kicked in paged ~2-7 MiB of its own
// machine code in from the node binary and kept it resident for the process's life, and
// whether they kicked in varied from start to start (docs/design.md "Memory"). Ignition and
// Sparkplug (the interpreter and the baseline compiler) remain.
//
// Set at run time, not on the command line, so the bundle's code cache (made with the plain
// flags, scripts/compile-cache.ts) is still taken: V8 checks a code cache against the flags it
// was made with, and these are changed only after the bundle is compiled.

import { setFlagsFromString } from 'node:v8';

/** What the agent sets, in this order. */
export const AGENT_V8_FLAGS: readonly string[] = ['--no-opt', '--no-maglev'];

for (const flag of AGENT_V8_FLAGS) setFlagsFromString(flag);
