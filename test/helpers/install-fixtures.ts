// The plugin entry the installer fixtures in test/node/fixtures/install/ were made with.

import { DEFAULT_TEMPLATE, renderEntry, type TemplateValues } from '../../src/install/template.ts';

export const FIXTURE_VALUES: TemplateValues = {
  kubeconfigFilepath: '/etc/cni/net.d/ZZZ-mesh-cni-orchconfig',
  logLevel: 'warn',
  logUdsAddress: '/var/run/mesh-cni/log.sock',
  podLookupUdsAddress: '/var/run/mesh-cni/pods.sock',
  orchServiceHost: '198.18.96.1',
  orchServicePort: '443',
  nodeName: 'node-1',
  hostIp: '198.18.96.10',
  cniNetDir: '/etc/cni/net.d',
  cniBinDir: '/opt/cni/bin',
  excludeNamespaces: ['mesh-system', 'kube-system'],
};

export const FIXTURE_ENTRY = renderEntry(DEFAULT_TEMPLATE, FIXTURE_VALUES, 'the default template');

// The conformance cases in test/node/fixtures/install-conformance/: a net dir (in/), files that
// appear after the first pass (later/), flags; what the dir holds after install and after
// uninstall, without the orchconfig and our hidden records.

import { cpSync, existsSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { buildSettings } from '../../src/config/settings.ts';
import { Installer } from '../../src/install/installer.ts';
import { makeHostTree } from './hosttree.ts';
import { installerArgs } from '../../src/partargs.ts';

export interface ConformanceCase {
  readonly reference: string;
  readonly note?: string;
  readonly flags?: Record<string, string>;
  readonly ready: boolean;
  /** A regular expression the not-ready reasons match. */
  readonly reason?: string;
}

export interface ConformanceRun {
  readonly notReady: readonly string[];
  readonly installed: Record<string, string>;
  readonly uninstalled: Record<string, string>;
}

/** The config files of a dir (no dotfiles, no orchconfig), name -> text; a subdir's as `sub/name`. */
export function dirFiles(dir: string, leaveOut: readonly string[] = []): Record<string, string> {
  if (!existsSync(dir)) return {};
  const out: Record<string, string> = {};
  for (const d of readdirSync(dir, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1))) {
    if (d.name.startsWith('.') || leaveOut.includes(d.name)) continue;
    if (d.isDirectory())
      for (const [n, t] of Object.entries(dirFiles(path.join(dir, d.name)))) out[`${d.name}/${n}`] = t;
    else out[d.name] = readFileSync(path.join(dir, d.name), 'utf8');
  }
  return out;
}

export async function runConformanceCase(caseDir: string): Promise<ConformanceRun> {
  const c = JSON.parse(readFileSync(path.join(caseDir, 'case.json'), 'utf8')) as ConformanceCase;
  const tree = await makeHostTree();
  try {
    if (existsSync(path.join(caseDir, 'in'))) cpSync(path.join(caseDir, 'in'), tree.netDir, { recursive: true });
    // The entry written with the paths a node has; the default orchconfig name, which sorts
    // before the reference's lower-case file names (bridge.conf) and is never read as a config.
    const flags = {
      'reconcile-interval': '1h',
      ...tree.flags,
      'log-uds-address': '/var/run/mesh-cni/log.sock',
      'pod-lookup-uds-address': '/var/run/mesh-cni/pods.sock',
      ...c.flags,
    };
    const settings = buildSettings(flags, tree.env);
    const orchconfig = settings.install.orchcfgFileName;
    const installer = new Installer(installerArgs(settings), {
      decideCleanup: async () => ({ cleanup: true, why: 'conformance case' }),
    });
    let stopped = false;
    try {
      await installer.start();
      await installer.settled();
      if (existsSync(path.join(caseDir, 'later'))) {
        cpSync(path.join(caseDir, 'later'), tree.netDir, { recursive: true });
        installer.schedule('periodic');
        await installer.settled();
      }
      const notReady = installer.notReadyReasons();
      const installed = dirFiles(tree.netDir, [orchconfig]);
      await installer.stop('SIGTERM');
      stopped = true;
      return { notReady, installed, uninstalled: dirFiles(tree.netDir, [orchconfig]) };
    } finally {
      if (!stopped) await installer.stop('SIGTERM');
    }
  } finally {
    await tree.remove();
  }
}
