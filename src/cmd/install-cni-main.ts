// Bundle entry of install-cni (see scripts/build.ts).
// First, so V8 is set before any of the agent's code runs (see v8flags.ts).
import './v8flags.ts';
import { main } from './install-cni.ts';

// Exit once main is done, even if something still holds the event loop (a request to a
// blackholed API server that timed out but was never torn down): shutdown is over by then,
// and the kubelet would otherwise wait out the grace period and SIGKILL us.
process.exit(await main(process.argv.slice(2), process.env));
