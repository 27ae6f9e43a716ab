// Baseline for the install benchmark: the same reconcile pass, but run by a plain 100 ms polling
// loop instead of watches. Prints its write count on SIGTERM.
import { buildSettings } from '../../../src/config/settings.ts';
import { InstallPass } from '../../../src/install/pass.ts';

const [netDir, binDir, binariesDir, saDir] = process.argv.slice(2) as [string, string, string, string];
const settings = buildSettings(
  {
    'mesh-owned-cni-config': 'false',
    'mounted-cni-net-dir': netDir,
    'mounted-cni-bin-dir': binDir,
    'cni-binaries-dir': binariesDir,
    'service-account-dir': saDir,
  },
  { KUBERNETES_SERVICE_HOST: '198.18.96.1', KUBERNETES_SERVICE_PORT: '443' },
);
const installPass = new InstallPass(settings.install, settings.env);
let writes = 0;
const tick = async () => {
  const out = await installPass.run();
  writes += out.writes.filter((w) => w.kind === 'cni_config' && w.action === 'write').length;
};
await tick();
console.log(`ready ${writes}`);
const timer = setInterval(() => void tick(), 100);
process.on('SIGTERM', () => {
  clearInterval(timer);
  console.log(JSON.stringify({ writes }));
  process.exit(0);
});
