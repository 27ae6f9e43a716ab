// Bundle entry of install-cni (see scripts/build.ts).
import { main } from './install-cni.ts';

process.exitCode = await main(process.argv.slice(2), process.env);
