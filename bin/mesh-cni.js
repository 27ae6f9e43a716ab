#!/usr/bin/env node
// mesh-cni from source: Node 24 runs the TypeScript directly; nodes get dist/bin/mesh-cni.
import '../cni-plugin/main.ts';
