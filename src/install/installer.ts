// The installer component: runs a reconcile pass at start, on every watched change and
// periodically; serialises passes (one at a time, the triggers that arrive meanwhile merged into
// one follow-up pass); reports readiness; on stop, cleans up or leaves everything in place.

import fs from 'node:fs/promises';
import path from 'node:path';
import type { Component } from '../component.ts';
import type { InstallSettings } from '../config/settings.ts';
import type { LogLevel } from '../config/flags.ts';
import { scope } from '../monitoring/logging.ts';
import { isOwnWrite, removeStaleTemps, TEMP_MARKER } from './atomicfile.ts';
import * as metrics from './metrics.ts';
import { InstallPass, type EntryEnv, type PassReport, type PassSettings } from './pass.ts';
import { entryLogLevel, type AmbientEntryValues } from './template.ts';
import type { CleanupDecision } from './uninstall.ts';
import { DirWatcher, type Trigger } from './watch.ts';
import { watchdogReasons } from './watchdog.ts';
import type { PluginTokenSource } from './tokenrequest.ts';
import type { CheckedBinaries } from './binaries.ts';

const log = scope('install');

// A pass that found a problem is retried on this backoff as well as on the next change: a
// primary CNI that writes its file in place can be caught half-written, and the watch may
// report the whole write as a single event.
const RETRY_MIN_MS = 5;
const TEMP_NAME = new RegExp(`[^\\s/'"]*${TEMP_MARKER.replaceAll('.', '\\.')}[\\w-]+`, 'g');
const RETRY_MAX_MS = 5000;
const PACE_BURST = 10;
const PACE_EVERY_MS = 20;
const WATCH_TRIGGERS: ReadonlySet<Trigger> = new Set<Trigger>(['net_dir', 'bin_dir', 'token', 'ca', 'template']);

/** What the installer reads of the settings: what a pass reads, how often it runs, what it watches, our entry's extras. */
export interface InstallerArgs
  extends PassSettings, Pick<InstallSettings, 'reconcileIntervalMs' | 'reconcileTimeoutMs' | 'pluginTokenFile'> {
  /** The level the agent's own `cni` log scope was started at (--log_output_level): the plugin sends what it prints. */
  readonly cniScopeLevel: LogLevel;
  /** The API server, this node and its address, as our entry names them. */
  readonly env: EntryEnv;
  /** Ambient mode's keys of our entry; undefined: ambient mode is off. */
  readonly ambient: AmbientEntryValues | undefined;
}

export interface InstallerOptions {
  /** Decides uninstall vs restart on stop: the agent's one decision (uninstall.ts decideCleanup), shared with ambient mode. */
  readonly decideCleanup: () => Promise<CleanupDecision>;
  /** The plugin's token for the orchconfig (the agent always passes one); else the service-account token. */
  readonly pluginToken?: PluginTokenSource;
  /** The agent's comparison of the installed binaries, begun at its start (binaries.ts checkInstalledBinaries). */
  readonly binaryCheck?: Promise<CheckedBinaries>;
  /** The agent chose native nftables for the node (nftbackend.ts): our entry says so. */
  readonly nativeNftables?: boolean;
}

export class Installer implements Component {
  readonly name = 'install';
  readonly #s: InstallerArgs;
  readonly #installPass: InstallPass;
  readonly #watcher: DirWatcher;
  readonly #decide: () => Promise<CleanupDecision>;
  #running: Promise<void> | null = null;
  #pending: Trigger | null = null;
  #timer: NodeJS.Timeout | null = null;
  #stopped = false;
  #last: PassReport | null = null;
  #lastAt: Date | null = null;
  #lastReported = '';
  #passes = 0;
  #retryTimer: NodeJS.Timeout | null = null;
  #retryDelayMs = RETRY_MIN_MS;
  #lastMalformed = false;
  /** When the pass running now started (null: none runs), for the watchdog. */
  #runningSince: number | null = null;
  readonly #startedAt = Date.now();
  #verifyPending = true;
  #paceTokens = PACE_BURST;
  #lastPassWrote = false;
  #paceAt = 0;

  constructor(s: InstallerArgs, opts: InstallerOptions) {
    this.#s = s;
    // The plugin sends what the agent's `cni` scope was started to print (template.ts). With
    // ambient mode on, our entry tells the plugin so, and where the agent takes its ADDs.
    const pluginLogLevel = entryLogLevel(s.pluginLogLevel, s.cniScopeLevel);
    this.#installPass = new InstallPass({ ...s, pluginLogLevel }, s.env, opts.pluginToken, s.ambient);
    if (opts.binaryCheck) this.#installPass.useBinaryCheck(opts.binaryCheck);
    if (opts.nativeNftables) this.#installPass.useNativeNftables();
    // A new token goes into the orchconfig at once.
    opts.pluginToken?.onChange(() => this.schedule('token'));
    this.#decide = opts.decideCleanup;
    const dirs: { dir: string; trigger: Trigger }[] = [
      { dir: s.mountedCniNetDir, trigger: 'net_dir' },
      { dir: s.mountedCniBinDir, trigger: 'bin_dir' },
      { dir: s.serviceAccountDir, trigger: 'token' },
    ];
    if (s.orchCaFile) dirs.push({ dir: path.dirname(s.orchCaFile), trigger: 'ca' });
    if (s.pluginTokenFile) dirs.push({ dir: path.dirname(s.pluginTokenFile), trigger: 'token' });
    if (s.cniNetworkConfigFile) dirs.push({ dir: path.dirname(s.cniNetworkConfigFile), trigger: 'template' });
    this.#watcher = new DirWatcher(
      dirs,
      (trigger, file) => {
        // Our own temp files come and go with every write we make: not a change to react to.
        if (file !== null && path.basename(file).includes(TEMP_MARKER)) return;
        if (file === null) this.#installPass.files.unsure();
        else this.#installPass.files.changed(file);
        // The event of our own write (the file is still as we left it): no pass to run for it.
        if (file !== null && isOwnWrite(file)) return;
        this.schedule(trigger);
      },
      (dir, e) => {
        this.#installPass.files.unsure();
        log.warn('watch failed; the periodic reconcile still covers it', { dir, error: e.message });
      },
    );
  }

  async start(): Promise<void> {
    const s = this.#s;
    for (const dir of [s.mountedCniNetDir, s.mountedCniBinDir]) {
      const stale = await removeStaleTemps(dir);
      if (stale.removed.length > 0)
        log.info('removed temp files left by an earlier run', { dir, files: stale.removed });
      // Said once, at start-up: nothing of ours, so left for the operator.
      for (const s of stale.skipped)
        log.warn(`left ${path.join(dir, s.name)} in place: ${s.why}`, { dir, file: s.name });
    }
    log.info('installing mesh-cni', {
      mode: s.chained ? 'chained' : 'standalone',
      ownedConfig: s.chained && s.meshOwnedCniConfig ? s.meshOwnedCniConfigFilename : null,
      netDir: s.mountedCniNetDir,
      binDir: s.mountedCniBinDir,
      binariesFrom: s.cniBinariesDir,
    });
    this.#watcher.refresh();
    this.schedule('startup');
    // A first pass stuck in a file system call must not hold the agent's start (and with it
    // SIGTERM handling): readiness says it is stuck.
    if (!(await within(this.#running, s.reconcileTimeoutMs))) {
      log.error('the first reconcile pass is still running; starting anyway, /readyz says it is stuck', {
        afterMs: s.reconcileTimeoutMs,
      });
    }
    this.#timer = setInterval(() => this.schedule('periodic'), s.reconcileIntervalMs);
  }

  /** Runs a pass now, or right after the one running (triggers meanwhile merge into one). */
  schedule(trigger: Trigger): void {
    if (this.#stopped) return;
    // Passes a watch event brings trust the file cache for what no event touched; any other
    // (periodic, start-up, retry) checks it, so a missed event costs at most one period.
    if (!WATCH_TRIGGERS.has(trigger)) this.#verifyPending = true;
    if (this.#running) {
      this.#pending = trigger;
      return;
    }
    this.#running = this.#loop(trigger)
      .catch((e: unknown) =>
        log.error('reconcile loop failed; the next trigger runs it again', { error: (e as Error).message }),
      )
      .finally(() => {
        this.#running = null;
      });
  }

  /** How many times an installed binary was read to compare it with its source (binaries.ts). */
  get binaryCompares(): number {
    return this.#installPass.binaryCompares;
  }

  /** Resolves once no pass is running or pending: for tests and benchmarks. */
  async settled(): Promise<void> {
    while (this.#running) await this.#running;
  }

  async #loop(first: Trigger): Promise<void> {
    let trigger: Trigger | null = first;
    while (trigger && !this.#stopped) {
      await this.#pace();
      if (this.#stopped) break;
      // Every trigger up to here is covered by the pass below; later ones bring one more.
      this.#pending = null;
      this.#runningSince = Date.now();
      try {
        await this.#pass(trigger);
      } finally {
        this.#runningSince = null;
      }
      trigger = this.#pending;
    }
  }

  /**
   * A file rewritten every millisecond would otherwise run passes back to back. A token bucket:
   * up to PACE_BURST passes at once, then one per PACE_EVERY_MS. Triggers that come while a pass
   * waits merge into it, so the last change is always followed by a pass. Only passes after one
   * that changed nothing wait: a pass that had to repair something (a primary CNI rewriting its
   * file without our entry) is followed at once.
   */
  async #pace(): Promise<void> {
    if (this.#lastPassWrote) return;
    const now = performance.now();
    this.#paceTokens = Math.min(PACE_BURST, this.#paceTokens + (now - this.#paceAt) / PACE_EVERY_MS);
    this.#paceAt = now;
    if (this.#paceTokens < 1) {
      const wait = (1 - this.#paceTokens) * PACE_EVERY_MS;
      await new Promise((r) => setTimeout(r, wait));
      this.#paceTokens = 1;
      this.#paceAt = performance.now();
    }
    this.#paceTokens -= 1;
  }

  async #pass(trigger: Trigger): Promise<void> {
    metrics.reconciles.inc({ trigger });
    const end = metrics.reconcileDuration.startTimer();
    let outcome: PassReport;
    try {
      const verify = this.#verifyPending;
      this.#verifyPending = false;
      outcome = await this.#installPass.run({ verify });
    } catch (e) {
      outcome = {
        notReady: [`reconcile failed: ${(e as Error).message}`],
        problems: [{ reason: 'write_failed', message: (e as Error).message }],
        primary: this.#last?.primary ?? null,
        writes: [],
      };
    }
    end();
    this.#passes++;
    this.#lastPassWrote = outcome.writes.length > 0;
    this.#last = outcome;
    this.#lastAt = new Date();
    for (const w of outcome.writes) {
      metrics.writes.inc({ kind: w.kind, action: w.action });
      log.info(w.action === 'write' ? 'wrote' : 'removed', { file: w.file, kind: w.kind, trigger });
    }
    for (const p of outcome.problems) metrics.errors.inc({ reason: p.reason });
    metrics.installs.inc({ result: installResult(outcome) });
    metrics.installReady.set(outcome.notReady.length === 0 ? 1 : 0);
    // A malformed primary seen once may be a write in progress: say so only if it stays.
    const malformed = outcome.problems.some((p) => p.reason === 'primary_malformed');
    if (!malformed || this.#lastMalformed) this.#report(outcome);
    this.#lastMalformed = malformed;
    // A pass that was running when stop() came must not arm a retry or a watch again.
    if (this.#stopped) return;
    this.#retryOnProblems(outcome);
    // A symlinked primary is edited in its target, which the primary CNI rewrites there: watch
    // that directory too, for as long as that is the primary we follow.
    const targetDir = await this.#linkTargetDir(outcome.primary);
    if (this.#stopped) return;
    this.#watcher.follow(targetDir, 'net_dir');
    // A directory deleted and recreated needs a new watch. Every pass looks (a stat per dir):
    // triggers merge while a pass runs, so no one kind of pass can be relied on to come. A new
    // watch brings one more pass, for what changed before it was armed.
    if (this.#watcher.refresh()) {
      this.#installPass.files.unsure();
      this.schedule('net_dir');
    }
  }

  /** The directory a symlinked primary's link resolves into (to its end); null: not a link. */
  async #linkTargetDir(primary: string | null): Promise<string | null> {
    if (primary === null) return null;
    const file = path.join(this.#s.mountedCniNetDir, primary);
    const st = await fs.lstat(file).catch(() => null);
    if (!st?.isSymbolicLink()) return null;
    const target = await fs.realpath(file).catch(() => null);
    return target === null ? null : path.dirname(target);
  }

  #retryOnProblems(outcome: PassReport): void {
    if (this.#retryTimer) clearTimeout(this.#retryTimer);
    this.#retryTimer = null;
    if (outcome.problems.length === 0) {
      this.#retryDelayMs = RETRY_MIN_MS;
      return;
    }
    this.#retryTimer = setTimeout(() => this.schedule('retry'), this.#retryDelayMs);
    this.#retryDelayMs = Math.min(this.#retryDelayMs * 2, RETRY_MAX_MS);
  }

  /** Logs what changed since the last pass only: a problem that persists is said once. */
  #report(outcome: PassReport): void {
    // Errors about a write name our temp file, whose name is new every pass: not a change.
    const key = JSON.stringify([outcome.notReady.map((m) => m.replace(TEMP_NAME, '<temp>')), outcome.primary]);
    if (key === this.#lastReported) return;
    this.#lastReported = key;
    if (outcome.notReady.length === 0) {
      log.info('mesh-cni is installed and ready', { primary: outcome.primary });
      return;
    }
    const problems = new Set(outcome.problems.map((p) => p.message));
    for (const reason of outcome.notReady) {
      if (problems.has(reason)) log.error(reason);
      else log.info(reason);
    }
  }

  notReadyReasons(): readonly string[] {
    const last = this.#last ? this.#last.notReady : ['the installer has not run yet'];
    // The last pass's answer only counts while passes still run and finish (watchdog.ts).
    const s = this.#s;
    const stuck = watchdogReasons({
      now: Date.now(),
      runningSince: this.#runningSince,
      lastFinished: this.#lastAt?.getTime() ?? null,
      started: this.#startedAt,
      intervalMs: s.reconcileIntervalMs,
      timeoutMs: s.reconcileTimeoutMs,
    });
    return stuck.length > 0 ? [...stuck, ...last] : last;
  }

  /** The config files passed over for the primary, each with why: worth knowing while ready. */
  notes(): readonly string[] {
    return [
      ...(this.#last?.skipped ?? []).map(
        (k) => `passed over ${path.join(this.#s.mountedCniNetDir, k.file)}, as the runtime would: ${k.reason}`,
      ),
      ...(this.#last?.notes ?? []),
    ];
  }

  status(): Record<string, unknown> {
    const s = this.#s;
    return {
      ready: this.#last?.notReady.length === 0,
      mode: s.chained ? 'chained' : 'standalone',
      // Our own config file (--mesh-owned-cni-config), which the runtime reads; null: the splice.
      ownedConfig: s.chained && s.meshOwnedCniConfig ? s.meshOwnedCniConfigFilename : null,
      primaryConfig: this.#last?.primary ?? null,
      // Config files before the primary that the runtime would not load either, with why.
      skipped: this.#last?.skipped ?? [],
      netDir: s.mountedCniNetDir,
      binDir: s.mountedCniBinDir,
      lastReconcile: this.#lastAt?.toISOString() ?? null,
      reconciles: this.#passes,
      notReady: this.#last?.notReady ?? [],
      errors: this.#last?.problems.map((p) => p.message) ?? [],
    };
  }

  async stop(signal: NodeJS.Signals): Promise<void> {
    this.#stopped = true;
    if (this.#timer) clearInterval(this.#timer);
    if (this.#retryTimer) clearTimeout(this.#retryTimer);
    this.#watcher.close();
    const timeoutMs = this.#s.reconcileTimeoutMs;
    if (!(await within(this.settled(), timeoutMs))) {
      // Uninstalling beside a pass that may still write would race it; the plugin keeps working
      // with everything left in place, which is the state of a restart.
      log.error('a reconcile pass is still running; not waiting for it, and leaving mesh-cni installed as it is', {
        signal,
        runningForMs: Date.now() - (this.#runningSince ?? Date.now()),
      });
      return;
    }
    const decision = await this.#decide();
    if (!decision.cleanup) {
      log.info('leaving mesh-cni installed', { signal, why: decision.why });
      return;
    }
    log.info('uninstalling mesh-cni from this node', { signal, why: decision.why });
    const cleanup = this.#installPass.cleanup();
    if (!(await within(cleanup, timeoutMs))) {
      log.error('the uninstall did not finish in time; stopping without it', { signal, afterMs: timeoutMs });
      return;
    }
    const done = await cleanup;
    for (const w of done) {
      metrics.writes.inc({ kind: w.kind, action: w.action });
      log.info(w.action === 'write' ? 'restored' : 'removed', { file: w.file, kind: w.kind });
    }
    metrics.installReady.set(0);
  }
}

/** What one pass counts as in mesh_cni_installs_total (metrics.ts INSTALL_RESULTS). */
function installResult(outcome: PassReport): metrics.InstallResult {
  if (outcome.notReady.length === 0) return 'success';
  return outcome.problems[0]?.reason ?? 'not_ready';
}

/** Whether `p` settles within `ms` (it goes on running either way). */
async function within(p: Promise<unknown> | null, ms: number): Promise<boolean> {
  if (!p) return true;
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), ms)));
  try {
    return await Promise.race([
      p.then(
        () => true,
        () => true,
      ),
      late,
    ]);
  } finally {
    clearTimeout(timer);
  }
}
