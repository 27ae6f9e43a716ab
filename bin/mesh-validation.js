#!/usr/bin/env node
// mesh-validation from source: Node 24 runs the TypeScript directly; the image ships dist/.
import '../cni-plugin/validation-main.ts';
