// One reconcile pass: make the host hold our binaries, the orchconfig and our entry in the
// runtime's CNI config, writing only what differs. Level-triggered and idempotent: every watch
// event and every periodic tick runs the same pass, so a missed event costs at most one period.
//
// The pass is the I/O around a pure planner: binaries (binaries.ts) and the orchconfig
// (orchconfigsync.ts) are kept in place here; for the CNI config the planner (plan.ts) reads the
// net dir through a view (netdirview.ts) and plans the writes, removals and reports, which the
// applier (apply.ts) carries out in order. What a pass must remember for the next (records.ts
// originals, the primary our owned file was made from) is kept here between passes.

import fs from 'node:fs/promises';
import path from 'node:path';
import type { EnvironmentFacts, InstallSettings } from '../config/settings.ts';
import type { OrchconfigSettings } from './orchconfigsync.ts';
import type { PluginTokenSource } from './tokenrequest.ts';
import { applySteps, type Applied, type MutableMemory, type Problem, type Write } from './apply.ts';
import { BinaryInstaller, type CheckedBinaries } from './binaries.ts';
import { refuseUnrunnablePlugin } from './cpucheck.ts';
import { CniConfigError, PLUGIN_TYPE, type JsonObject } from './cniconfig.ts';
import { FileCache } from './filecache.ts';
import { netDirView, unspellableConfigNames } from './netdirview.ts';
import { syncOrchconfig } from './orchconfigsync.ts';
import { planCleanup, planConfig, planPrelude } from './plan.ts';
import {
  emptyMemory,
  PlanContext,
  STANDALONE_CONF_NAME,
  type ErrorReason,
  type PlanSettings,
  type Skipped,
} from './plancontext.ts';
import { readRegularFile } from './safefile.ts';
import { DEFAULT_TEMPLATE, renderEntry, type AmbientEntryValues } from './template.ts';

export type { ErrorReason, Problem, Skipped, Write };
export { STANDALONE_CONF_NAME, unspellableConfigNames };

/** What one install pass found and did: readiness, problems, the primary and the writes. */
export interface PassReport {
  /** Why not ready; empty when binaries, orchconfig and config are all in place. */
  readonly notReady: readonly string[];
  /** Errors among them (waiting for a primary CNI is not one). */
  readonly problems: readonly Problem[];
  readonly primary: string | null;
  readonly writes: readonly Write[];
  /** Config files passed over for the primary because the runtime would not load them either. */
  readonly skipped?: readonly Skipped[];
  /** Worth knowing while ready (on /readyz as notes): a config sorting before our owned file. */
  readonly notes?: readonly string[];
}

/** What one pass reads of the settings: the dirs and names, the plugin's entry, and the orchconfig's. */
export type PassSettings = OrchconfigSettings &
  Pick<
    InstallSettings,
    | 'chained'
    | 'cniConfName'
    | 'meshOwnedCniConfig'
    | 'meshOwnedCniConfigFilename'
    | 'cniNetDir'
    | 'cniBinDir'
    | 'mountedCniBinDir'
    | 'cniBinariesDir'
    | 'cniNetworkConfig'
    | 'cniNetworkConfigFile'
    | 'pluginLogLevel'
    | 'logUdsAddress'
    | 'podLookupUdsAddress'
    | 'excludeNamespaces'
    | 'cpuinfoPath'
  >;
/** What our entry names of the agent's surroundings: the API server, this node and its address. */
export type EntryEnv = Pick<EnvironmentFacts, 'orchServiceHost' | 'orchServicePort' | 'nodeName' | 'hostIp'>;

const isFile = (file: string) =>
  fs.stat(file).then(
    (st) => st.isFile(),
    () => false,
  );

export class InstallPass {
  readonly #s: PassSettings;
  readonly #env: EntryEnv;
  readonly #binaries: BinaryInstaller;
  /** What passes remember between them (plancontext.ts Memory), changed only by applied steps. */
  readonly #memory: MutableMemory = { ...emptyMemory(), originals: new Map() };
  /** Other config files as last read (filecache.ts): told of changes by the installer's watch. */
  readonly files = new FileCache();

  /** How many times an installed binary was read to compare it with its source: for tests and benchmarks. */
  get binaryCompares(): number {
    return this.#binaries.reads;
  }
  readonly #plan: PlanSettings;
  /** The plugin's token for the orchconfig; without one, the service-account token (run alone, in tests). */
  readonly #pluginToken: PluginTokenSource | undefined;
  /** Ambient mode's keys of our entry (the plugin's ambient branch); undefined: ambient off. */
  readonly #ambient: AmbientEntryValues | undefined;
  /** A check of the installed binaries begun before the first pass (useBinaryCheck), until that pass takes it. */
  #binaryCheck: Promise<CheckedBinaries> | undefined;
  /** Our entry says native_nftables: true (the agent's backend choice, useNativeNftables). */
  #nativeNftables = false;

  constructor(settings: PassSettings, env: EntryEnv, pluginToken?: PluginTokenSource, ambient?: AmbientEntryValues) {
    this.#s = settings;
    this.#env = env;
    this.#pluginToken = pluginToken;
    this.#ambient = ambient;
    this.#plan = {
      netDir: settings.mountedCniNetDir,
      chained: settings.chained,
      owned: settings.meshOwnedCniConfig,
      ownedName: settings.meshOwnedCniConfigFilename,
      confName: settings.cniConfName,
      orchcfgName: settings.orchcfgFileName,
      standaloneName: settings.cniConfName || STANDALONE_CONF_NAME,
    };
    this.#binaries = new BinaryInstaller(settings.cniBinariesDir, settings.mountedCniBinDir);
  }

  get netDir(): string {
    return this.#s.mountedCniNetDir;
  }

  /**
   * The agent's early comparison of the installed binaries with their sources
   * (checkInstalledBinaries of the same dirs): the next pass waits for it, inside the pass (so a
   * check stuck on a file system is the pass's to time out) and knows what it found.
   */
  useBinaryCheck(check: Promise<CheckedBinaries>): void {
    this.#binaryCheck = check;
  }

  /** Our entry tells the plugin to redirect with native nftables (the agent decided so at start). */
  useNativeNftables(): void {
    this.#nativeNftables = true;
  }

  #context(): PlanContext {
    return new PlanContext(this.#plan, netDirView(this.netDir, this.files), this.#memory, Date.now());
  }

  /**
   * One pass. `verify` (the default; false only for a pass brought by watch events) checks every
   * cached config file by its stat identity; else the cache trusts what no event has touched.
   */
  async run(opts: { verify?: boolean } = {}): Promise<PassReport> {
    this.files.startPass(opts.verify ?? true);
    const out: Applied = { writes: [], problems: [], notReady: [], notes: [], groupErrors: [] };
    const { notReady, problems, writes } = out;
    const fail = (reason: ErrorReason, message: string) => {
      problems.push({ reason, message });
      notReady.push(message);
    };

    const ctx = this.#context();
    await planPrelude(ctx);

    try {
      const early = this.#binaryCheck;
      this.#binaryCheck = undefined;
      if (early) this.#binaries.know(await early);
      await refuseUnrunnablePlugin(path.join(this.#s.cniBinariesDir, PLUGIN_TYPE), this.#s.cpuinfoPath);
      for (const name of await this.#binaries.sync())
        writes.push({ file: path.join(this.#s.mountedCniBinDir, name), kind: 'binary', action: 'write' });
    } catch (e) {
      fail('binaries_failed', (e as Error).message);
    }

    const netDirExists = await fs.stat(this.netDir).then(
      (st) => st.isDirectory(),
      () => false,
    );
    if (!netDirExists) {
      fail('net_dir_missing', `CNI net dir ${this.netDir} does not exist; waiting for it`);
      return { notReady, problems, primary: null, writes };
    }

    await syncOrchconfig(this.#s, this.#env, this.#pluginToken, writes, fail);

    let entry: JsonObject | null = null;
    try {
      entry = await this.#entry();
    } catch (e) {
      fail('template_invalid', (e as Error).message);
    }
    const unspellable = await unspellableConfigNames(this.netDir);
    // An entry the runtime cannot run would fail every pod of the node, excluded namespaces
    // too: put it in only once the plugin and its orchconfig are on the node (one already there
    // stays, failing pods closed, rather than letting them start unredirected).
    const plugin = path.join(this.#s.mountedCniBinDir, PLUGIN_TYPE);
    const orchconfig = path.join(this.netDir, this.#s.orchcfgFileName);
    const missing: string[] = [];
    if (!(await isFile(plugin))) missing.push(plugin);
    if (!(await isFile(orchconfig))) missing.push(orchconfig);
    if (entry && missing.length > 0) {
      notReady.push(
        `not adding our entry to the CNI config until ${missing.join(' and ')} ` +
          `${missing.length > 1 ? 'are' : 'is'} in place`,
      );
      return { notReady, problems, primary: null, writes, skipped: [], notes: [] };
    }
    if (entry && unspellable.length > 0) {
      // fs.readdir gives such a name as U+FFFD, which may collapse it with another and orders
      // it wrongly: the agent cannot judge which file the runtime reads first.
      fail(
        'primary_unsupported',
        `${this.netDir} holds ` +
          `${unspellable.length > 1 ? 'config files whose names are' : 'a config file whose name is'} not valid UTF-8 ` +
          `(${unspellable.join(', ')}): the runtime may load it, and the agent cannot name or order it; not installing ` +
          `until it is renamed or removed`,
      );
      return { notReady, problems, primary: null, writes, skipped: [], notes: [] };
    }
    if (!entry) return { notReady, problems, primary: null, writes, skipped: [], notes: [] };
    // Planned at the time the dir is read: the owned-mode grace (planmodes.ts holdOwned) counts
    // from when a primary is seen gone, not from the pass's start, which the binaries' copy and
    // the orchconfig may precede by seconds.
    const planCtx = this.#context();
    planCtx.earlierOwned = ctx.earlierOwned;
    const plan = await planConfig(planCtx, entry);
    let primary = plan.primary;
    let error: Error | undefined;
    try {
      await applySteps(plan.steps, this.netDir, this.#memory, out);
    } catch (e) {
      error = e as Error;
    }
    if (out.stoppedWith) primary = out.stoppedWith.primary;
    // Where planning stopped lies after every step: not reached when a step stopped the pass.
    else error ??= plan.error;
    if (error) {
      primary = null;
      fail('write_failed', `cannot update the CNI config in ${this.netDir}: ${error.message}`);
    }
    return { notReady, problems, primary, writes, skipped: plan.skipped, notes: out.notes };
  }

  /** Our plugin entry from the template; read every pass, so a changed ConfigMap takes effect. */
  async #entry(): Promise<JsonObject> {
    let template = DEFAULT_TEMPLATE;
    let source = 'the default template';
    if (this.#s.cniNetworkConfig) {
      template = this.#s.cniNetworkConfig;
      source = '--cni-network-config';
    } else if (this.#s.cniNetworkConfigFile) {
      source = this.#s.cniNetworkConfigFile;
      try {
        template = (await readRegularFile(this.#s.cniNetworkConfigFile)).text;
      } catch (e) {
        throw new CniConfigError(`cannot read the CNI network config template ${source}: ${(e as Error).message}`);
      }
    }
    return renderEntry(
      template,
      {
        kubeconfigFilepath: path.join(this.#s.cniNetDir, this.#s.orchcfgFileName),
        logLevel: this.#s.pluginLogLevel,
        logUdsAddress: this.#s.logUdsAddress,
        podLookupUdsAddress: this.#s.podLookupUdsAddress,
        orchServiceHost: this.#env.orchServiceHost,
        orchServicePort: this.#env.orchServicePort,
        nodeName: this.#env.nodeName,
        hostIp: this.#env.hostIp,
        cniNetDir: this.#s.cniNetDir,
        cniBinDir: this.#s.cniBinDir,
        excludeNamespaces: this.#s.excludeNamespaces,
        ...(this.#ambient ? { ambient: this.#ambient } : {}),
        nativeNftables: this.#nativeNftables,
      },
      source,
    );
  }

  /**
   * Uninstall: our entry out of every config, our conflist and orchconfig gone. The binaries
   * stay: the runtime runs DEL with the config it cached at ADD, so every pod started while we
   * were installed still runs mesh-cni on its DEL, and a missing binary would stop that DEL
   * before the IPAM and port-mapping plugins after it free the pod's lease and mappings. With
   * its orchconfig gone the plugin passes DEL through.
   */
  async cleanup(): Promise<Write[]> {
    const out: Applied = { writes: [], problems: [], notReady: [], notes: [], groupErrors: [] };
    const plan = await planCleanup(this.#context());
    // Each group on its own (plan.ts): all failures are said.
    await applySteps(plan.steps, this.netDir, this.#memory, out);
    const errors = out.groupErrors;
    if (errors.length > 0) {
      throw new Error(
        `the uninstall in ${this.netDir} left ${errors.length} step(s) undone (the others were done: ` +
          `${out.writes.length} file(s) written or removed): ${errors.join('; ')}. Remove what is named by hand`,
      );
    }
    return out.writes;
  }
}
