// mesh-cni entry point: the container runtime runs it once per pod and command. Reads CNI_* env
// and stdin, prints a result or a CNI error object on stdout, exits 0 or 1. Bundled to
// dist/mesh-cni.cjs and built into the single executable dist/bin/mesh-cni.

import { main } from './invoke.ts';

// Built as a startup snapshot (SEA useSnapshot), main runs when the snapshot is deserialized.
// node:v8 (it loads Node's streams) only while building one: never on a call (docs/design.md
// "Start-up time").
const maybeBuildingSnapshot = process.execArgv.some(
  (a) => a === '--build-snapshot' || a.startsWith('--experimental-sea-config'),
);
const v8 = maybeBuildingSnapshot ? process.getBuiltinModule('node:v8') : null;
if (v8?.startupSnapshot?.isBuildingSnapshot()) v8.startupSnapshot.setDeserializeMainFunction(() => void main());
else void main();
