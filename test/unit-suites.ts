// The suites `npm run test:unit` runs (scripts/test-unit.ts): the ones that need no root and none
// of the Debian packages scripts/setup-host.sh installs (no netns, iptables, podman, containerd,
// kubectl, promtool, python3, zsh/fish, mounts, chown or another uid), so a contributor can run
// them on any Linux with Node. `npm test` still runs every suite, these included.
//
// A suite is listed here by name (test/node/<name>.test.ts), not marked by its file name, so no
// suite is renamed. scripts/test-unit-proof.sh proves the list: it runs `npm run test:unit` as an
// unprivileged user with those packages' files hidden and /usr/sbin off PATH. A suite left out
// runs under `npm test` only; test/node/unit-suites.test.ts checks that every name here exists.

export const UNIT_SUITES: readonly string[] = [
  'ambient-enablement',
  'ambient-informer',
  'ambient-settings',
  'ambient-zds',
  'install-cniconfig',
  'install-owned',
  'install-owned-faults',
  'install-owned-storm',
  'install-plan',
  'install-planted-netdir',
  'install-safefile',
  'install-watchdog',
  'lint-zones',
  'logging',
  'logging-format',
  'monitoring-bounds',
  'monitoring-rundir',
  'orch-parse-errors',
  'orch-request-errors',
  'orch-selectors',
  'orch-workqueue',
  'plugin-orchconfig-file',
  'plugin-poduid',
  'podnetns-cgroup',
  'podnetns-choose',
  'podnetns-zone',
  'repair-detect',
  'settings',
  'shared',
  'unit-suites',
];
