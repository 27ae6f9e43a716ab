#!/usr/bin/env node
// install-cni from source: Node 24 runs the TypeScript directly; the image ships dist/.
import '../src/cmd/install-cni-main.ts';
