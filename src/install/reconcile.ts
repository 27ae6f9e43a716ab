// One reconcile pass: make the host hold our binaries, the orchconfig and our entry in the
// runtime's CNI config, writing only what differs. Level-triggered and idempotent: every watch
// event and every periodic tick runs the same pass, so a missed event costs at most one period.

import { createHash } from 'node:crypto';
import { constants, type Dirent } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import type { EnvironmentFacts, InstallSettings } from '../config/settings.ts';
import { removeFile, TEMP_MARKER, writeFileAtomic, type WriteOptions } from './atomicfile.ts';
import { BinaryInstaller } from './binaries.ts';
import { refuseUnrunnablePlugin } from './cpucheck.ts';
import { byteOrder, choosePrimary, CniConfigError, isConfigFile, isOurs, libcniVerdict, otherForm, primaryCandidates, PLUGIN_TYPE, standaloneConfig, withOurEntry, withoutOurEntry, type JsonObject } from './cniconfig.ts';
import { renderOrchconfig } from './orchconfig.ts';
import type { PluginTokenSource } from '../orch/tokenrequest.ts';
import { FileCache, type CachedFile } from './filecache.ts';
import { readRegularFile, readRegularFileIfExists, UnsafeFileError } from './safefile.ts';
import { DEFAULT_TEMPLATE, renderEntry } from './template.ts';
import { scope } from '../monitoring/logging.ts';
import { foreignOwned, ownedText, ownNameShadows, planOwned, PRIMARY_GONE_GRACE_MS, shadowedBy, sortsBefore, type OwnedPlan } from './owned.ts';

const log = scope('install');
/** Beside our owned file (hidden): the name of the primary it was made from (holdOwned). */
const OWNED_FROM_SUFFIX = '.mesh-from';
/** Configs after a suspected copy of ours compared with it (failCopyOfOurs). */
const COPY_LOOKUP_MAX = 8;

/** Our conflist in standalone mode, unless --cni-conf-name names another. */
export const STANDALONE_CONF_NAME = 'YY-mesh-cni.conflist';
const CONFIG_MODE = 0o644;

export type ErrorReason =
  | 'net_dir_missing' | 'primary_malformed' | 'template_invalid' | 'token_missing' | 'ca_missing'
  | 'api_host_missing' | 'binaries_failed' | 'write_failed' | 'file_refused' | 'primary_unsupported' | 'orchconfig_name_refused'
  | 'config_shadowed';

export interface Problem {
  readonly reason: ErrorReason;
  readonly message: string;
}

export interface Write {
  readonly file: string;
  readonly kind: 'binary' | 'orchconfig' | 'cni_config';
  readonly action: 'write' | 'remove';
}

export interface Outcome {
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

export interface Skipped {
  readonly file: string;
  /** What is wrong with it; never its contents. */
  readonly reason: string;
}

/** What we replaced, to give the primary CNI's exact bytes back on cleanup. */
interface Original {
  readonly name: string;
  readonly text: string;
  /** A .conf that was a symbolic link (to this): given back as the link, not as a copy. */
  readonly link?: string;
  readonly mode: number;
  readonly uid: number;
  readonly gid: number;
  /** sha256 of what we wrote; the record holds only while the file still has it. */
  readonly written: string;
}

const sha256 = (s: string) => createHash('sha256').update(s).digest('hex');

/**
 * Where the record of a .conf we made a .conflist is kept, beside it in the net dir, so an
 * uninstall after any number of agent restarts (every upgrade is one) can give the .conf back.
 * Hidden, and no config extension: no runtime reads it.
 */
const RECORD_SUFFIX = '.mesh-original';
const originalRecord = (conflist: string) => `.${conflist}${RECORD_SUFFIX}`;
const isOriginalRecord = (name: string) => name.startsWith('.') && name.endsWith(RECORD_SUFFIX);

const isFile = (file: string) => fs.stat(file).then((st) => st.isFile(), () => false);

/**
 * Writes the config `file` (whose text was just read as `expected`). For a symbolic link (a
 * primary CNI that keeps its config elsewhere and links it here) the file it points to is
 * written (followed to the end), so the link stays and the primary CNI's later writes through it
 * still count; the temp file is made beside that target, so the rename is atomic there. Else
 * `file` itself. Returns whether it was written (beforeRename) and the path written.
 *
 * The net dir is writable by others, and the root agent writing through a link they control
 * could overwrite any file (a CNI binary). So a link is followed only into the net dir itself or
 * into a directory outside it that only root may write (no net-dir writer can swap it), that
 * directory is held open by fd from the check to the rename (a path walked again could lead
 * elsewhere), and only to a regular file there that holds `expected` now. A directory made
 * inside the net dir is refused: it can be swapped for a link (renameat2 RENAME_EXCHANGE) between
 * any check and the write. Never for a name taken from a record (those are written in the net dir).
 */
async function writeThrough(file: string, expected: string, netDir: string, data: string, opts: WriteOptions): Promise<{ written: boolean; target: string }> {
  const st = await fs.lstat(file).catch(() => null);
  if (!st?.isSymbolicLink()) return { written: await writeFileAtomic(file, data, opts), target: file };
  const target = await fs.realpath(file);
  const dir = path.dirname(target);
  const net = await fs.realpath(netDir);
  const refuse = (why: string) => new Error(`${file} is a symbolic link to ${target}, ${why}; not writing through the link. Link it to a file in ${netDir} itself or in a directory outside it that only root may write`);
  const rel = path.relative(net, dir);
  if (dir !== net && !rel.startsWith('..') && !path.isAbsolute(rel)) throw refuse('in a directory inside the net dir, which any writer there could swap for a link while we write');
  const dh = await fs.open(dir, constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW);
  try {
    const pinned = `/proc/self/fd/${dh.fd}`;
    if ((await fs.realpath(pinned)) !== dir) throw refuse('whose directory moved while it was opened');
    const dst = await dh.stat();
    if (dir !== net && (dst.uid !== 0 || (dst.mode & 0o022) !== 0)) throw refuse('in a directory not owned by root or writable by group or others, which someone else could swap');
    const at = path.join(pinned, path.basename(target));
    const now = await readRegularFileIfExists(at, { noFollow: true }).catch(() => null);
    if (now?.text !== expected) throw refuse('which is not the regular file holding the CNI config just read through it');
    return { written: await writeFileAtomic(at, data, opts), target };
  } finally {
    await dh.close();
  }
}

/** A record's mode, without the bits no CNI config needs (exec, setuid, group/other write). */
const RECORD_MODE_MASK = 0o644;

/** Makes `file` a symbolic link to `to`, atomically (a temp link renamed over it). */
async function symlinkAtomic(to: string, file: string): Promise<void> {
  const tmp = path.join(path.dirname(file), `.${path.basename(file)}${TEMP_MARKER}${process.pid}-link`);
  await fs.rm(tmp, { force: true });
  await fs.symlink(to, tmp);
  await fs.rename(tmp, file);
}

/** A file's text, null when it does not exist; anything but a regular file of at most 1 MiB is refused (safefile.ts). */
async function readIfExists(file: string): Promise<string | null> {
  return (await readRegularFileIfExists(file))?.text ?? null;
}

/** Whether a config's text holds an entry of ours; a file that does not parse holds none. */
function textHoldsOurEntry(text: string, name: string): boolean {
  try {
    return withoutOurEntry(text, name) !== null;
  } catch {
    return false;
  }
}

/** Whether a config holds an entry of ours, worked out once per content. */
function holdsOurEntry(file: CachedFile, name: string): boolean {
  return file.memo('ours', (t) => {
    try {
      return withoutOurEntry(t, name) !== null;
    } catch {
      // Files that do not parse are not ours to touch.
      return false;
    }
  });
}

export class Reconciler {
  private readonly s: InstallSettings;
  private readonly env: EnvironmentFacts;
  private readonly binaries: BinaryInstaller;
  private readonly originals = new Map<string, Original>();
  /** Other config files as last read (filecache.ts): told of changes by the installer's watch. */
  readonly files = new FileCache();
  /** The conflist of our own in standalone mode (--cni-conf-name, or ours by default). */
  private readonly standaloneName: string;

  /** The plugin's token for the orchconfig; without one, the service-account token (the installer run alone, in tests). */
  private readonly pluginToken: PluginTokenSource | undefined;

  constructor(settings: InstallSettings, env: EnvironmentFacts, pluginToken?: PluginTokenSource) {
    this.s = settings;
    this.env = env;
    this.pluginToken = pluginToken;
    this.standaloneName = settings.cniConfName || STANDALONE_CONF_NAME;
    this.binaries = new BinaryInstaller(settings.cniBinariesDir, settings.mountedCniBinDir);
  }

  get netDir(): string {
    return this.s.mountedCniNetDir;
  }

  /** Names in the net dir that are ours and never a primary config. */
  ownFiles(): ReadonlySet<string> {
    // Our owned file (--mesh-owned-cni-config) in every mode: a copy of the primary, never one;
    // so are ours under an earlier --mesh-owned-cni-config-filename (earlierOwned).
    return new Set([this.s.orchcfgFileName, this.s.chained ? STANDALONE_CONF_NAME : this.standaloneName, this.s.meshOwnedCniConfigFilename, ...this.earlierOwned]);
  }

  /** Owned files of ours under an earlier --mesh-owned-cni-config-filename, found at each pass's start. */
  private earlierOwned: ReadonlySet<string> = new Set();

  /**
   * One pass. `verify` (the default; false only for a pass brought by watch events) checks every
   * cached config file by its stat identity; else the cache trusts what no event has touched.
   */
  async reconcile(opts: { verify?: boolean } = {}): Promise<Outcome> {
    this.files.startPass(opts.verify ?? true);
    return this.reconcileOnce();
  }

  private async reconcileOnce(): Promise<Outcome> {
    const notReady: string[] = [];
    const problems: Problem[] = [];
    const writes: Write[] = [];
    const fail = (reason: ErrorReason, message: string) => {
      problems.push({ reason, message });
      notReady.push(message);
    };

    this.earlierOwned = await this.findEarlierOwned(await fs.readdir(this.netDir).catch(() => [] as string[]));
    const misnamed = await this.orchconfigSortsFirst();
    if (misnamed) {
      fail('orchconfig_name_refused', misnamed);
      return { notReady, problems, primary: null, writes };
    }

    try {
      await refuseUnrunnablePlugin(path.join(this.s.cniBinariesDir, PLUGIN_TYPE), this.s.cpuinfoPath);
      for (const name of await this.binaries.sync()) writes.push({ file: path.join(this.s.mountedCniBinDir, name), kind: 'binary', action: 'write' });
    } catch (e) {
      fail('binaries_failed', (e as Error).message);
    }

    const netDirExists = await fs.stat(this.netDir).then((st) => st.isDirectory(), () => false);
    if (!netDirExists) {
      fail('net_dir_missing', `CNI net dir ${this.netDir} does not exist; waiting for it`);
      return { notReady, problems, primary: null, writes };
    }

    await this.syncOrchconfig(writes, fail);

    let entry: JsonObject | null = null;
    try {
      entry = await this.entry();
    } catch (e) {
      fail('template_invalid', (e as Error).message);
    }
    let primary: string | null = null;
    const skipped: Skipped[] = [];
    const notes: string[] = [];
    const unspellable = await unspellableConfigNames(this.netDir);
    // An entry the runtime cannot run would fail every pod of the node, excluded namespaces
    // too: put it in only once the plugin and its orchconfig are on the node (one already there
    // stays, failing pods closed, rather than letting them start unredirected).
    const plugin = path.join(this.s.mountedCniBinDir, PLUGIN_TYPE);
    const orchconfig = path.join(this.netDir, this.s.orchcfgFileName);
    const missing: string[] = [];
    if (!(await isFile(plugin))) missing.push(plugin);
    if (!(await isFile(orchconfig))) missing.push(orchconfig);
    if (entry && missing.length > 0) {
      notReady.push(`not adding our entry to the CNI config until ${missing.join(' and ')} ${missing.length > 1 ? 'are' : 'is'} in place`);
    } else if (entry && unspellable.length > 0) {
      // fs.readdir gives such a name as U+FFFD, which may collapse it with another and orders
      // it wrongly: the agent cannot judge which file the runtime reads first.
      fail('primary_unsupported', `${this.netDir} holds ${unspellable.length > 1 ? 'config files whose names are' : 'a config file whose name is'} not valid UTF-8 (${unspellable.join(', ')}): the runtime may load it, and the agent cannot name or order it; not installing until it is renamed or removed`);
    } else if (entry) {
      try {
        primary = !this.s.chained ? await this.syncStandalone(entry, writes)
          : this.s.meshOwnedCniConfig ? await this.syncOwned(entry, writes, notReady, fail, skipped, notes)
          : await this.syncChained(entry, writes, notReady, fail, skipped);
      } catch (e) {
        fail('write_failed', `cannot update the CNI config in ${this.netDir}: ${(e as Error).message}`);
      }
    }
    return { notReady, problems, primary, writes, skipped, notes };
  }

  /**
   * Why the orchconfig's name must not be used with the primary config there now: it holds a
   * token, and a runtime that reads the dir in order must meet the primary first. The primary is
   * known only at run time, so this is asked before every pass touches anything.
   */
  private async orchconfigSortsFirst(): Promise<string | null> {
    if (!this.s.chained) return null;
    const names = await fs.readdir(this.netDir).catch(() => null);
    if (!names) return null;
    // The first candidate by name: the primary is it or a later one (findPrimary).
    const first = choosePrimary(names, { confName: this.s.cniConfName, ownFiles: this.ownFiles() });
    if (first === null || byteOrder(this.s.orchcfgFileName, first) > 0) return null;
    return `--orchcfg-file-name ${this.s.orchcfgFileName} sorts before the CNI config ${first} in ${this.netDir}, which the runtime may take as the primary; not installing. Give a name that sorts after it (byte order), as the default ZZZ-mesh-cni-orchconfig does`;
  }

  private async syncOrchconfig(writes: Write[], fail: (r: ErrorReason, m: string) => void): Promise<void> {
    const target = path.join(this.netDir, this.s.orchcfgFileName);
    if (!this.env.orchServiceHost) {
      fail('api_host_missing', 'KUBERNETES_SERVICE_HOST is not set, so the orchconfig cannot name the API server');
      return;
    }
    let token: string;
    if (this.pluginToken) {
      // The plugin's own token (minted by the agent, or --plugin-token-file), never the agent's.
      const got = await this.pluginToken.current();
      if ('missing' in got) {
        fail('token_missing', got.missing);
        await this.dropAgentTokenOrchconfig(target, writes);
        return;
      }
      token = got.token;
    } else {
      const t = await this.serviceAccountToken(fail);
      if (t === null) return;
      token = t;
    }
    let caPem: string | undefined;
    if (!this.s.skipTlsVerify) {
      const caFile = this.s.orchCaFile || path.join(this.s.serviceAccountDir, 'ca.crt');
      let ca: string | null;
      try {
        ca = await readIfExists(caFile);
      } catch (e) {
        fail(e instanceof UnsafeFileError ? 'file_refused' : 'ca_missing', `cannot read the CA file: ${(e as Error).message}`);
        return;
      }
      if (ca === null) {
        fail('ca_missing', `CA file ${caFile} is missing; give --orch-ca-file or --skip-tls-verify`);
        return;
      }
      caPem = ca;
    }
    const text = renderOrchconfig({ host: this.env.orchServiceHost, port: this.env.orchServicePort, token: token.trim(), caPem, skipTlsVerify: this.s.skipTlsVerify });
    try {
      // Not through a link (O_NOFOLLOW): one planted here is replaced, and the file it points
      // to neither read nor chmodded. A wrong mode is mended by writing the file again.
      const now = await readRegularFileIfExists(target, { noFollow: true }).catch(() => null);
      if (now?.text !== text || Number(now.stat.mode & 0o7777n) !== this.s.orchconfigMode) {
        await writeFileAtomic(target, text, { mode: this.s.orchconfigMode });
        writes.push({ file: target, kind: 'orchconfig', action: 'write' });
      }
    } catch (e) {
      fail('write_failed', `cannot write orchconfig ${target}: ${(e as Error).message}`);
    }
  }

  /**
   * No plugin token to be had (minting failing): an orchconfig that holds the agent's own
   * service-account token (written by a version before the plugin had a token of its own) goes,
   * for that token must not stay on the node's disk. Until a token is minted, a plugin ADD the
   * agent's pod lookup cannot answer then fails closed (CNI error 11, try again later). Any other
   * orchconfig (an earlier plugin token, maybe still valid) stays.
   */
  private async dropAgentTokenOrchconfig(target: string, writes: Write[]): Promise<void> {
    const own = await readRegularFile(path.join(this.s.serviceAccountDir, 'token')).then((r) => r.text.trim(), () => '');
    if (own === '') return;
    const now = await readRegularFileIfExists(target, { noFollow: true }).then((r) => r?.text ?? null, () => null);
    if (now !== null && now.includes(own) && (await removeFile(target))) writes.push({ file: target, kind: 'orchconfig', action: 'remove' });
  }

  private async serviceAccountToken(fail: (r: ErrorReason, m: string) => void): Promise<string | null> {
    const tokenFile = path.join(this.s.serviceAccountDir, 'token');
    let token: string | null;
    try {
      token = await readIfExists(tokenFile);
    } catch (e) {
      fail(e instanceof UnsafeFileError ? 'file_refused' : 'token_missing', `cannot read the service-account token: ${(e as Error).message}`);
      return null;
    }
    if (token === null || token.trim() === '') {
      fail('token_missing', `service-account token ${tokenFile} is ${token === null ? 'missing' : 'empty'}; the orchconfig cannot be written until it appears`);
      return null;
    }
    return token;
  }

  /** Our plugin entry from the template; read every pass, so a changed ConfigMap takes effect. */
  private async entry(): Promise<JsonObject> {
    let template = DEFAULT_TEMPLATE;
    let source = 'the default template';
    if (this.s.cniNetworkConfig) {
      template = this.s.cniNetworkConfig;
      source = '--cni-network-config';
    } else if (this.s.cniNetworkConfigFile) {
      source = this.s.cniNetworkConfigFile;
      try {
        template = (await readRegularFile(this.s.cniNetworkConfigFile)).text;
      } catch (e) {
        throw new CniConfigError(`cannot read the CNI network config template ${source}: ${(e as Error).message}`);
      }
    }
    return renderEntry(template, {
      kubeconfigFilepath: path.join(this.s.cniNetDir, this.s.orchcfgFileName),
      logLevel: this.s.pluginLogLevel,
      logUdsAddress: this.s.logUdsAddress,
      podLookupUdsAddress: this.s.podLookupUdsAddress,
      orchServiceHost: this.env.orchServiceHost,
      orchServicePort: this.env.orchServicePort,
      nodeName: this.env.nodeName,
      hostIp: this.env.hostIp,
      cniNetDir: this.s.cniNetDir,
      cniBinDir: this.s.cniBinDir,
      excludeNamespaces: this.s.excludeNamespaces,
    }, source);
  }

  /**
   * The primary config and its text, found as the runtime finds it: the first candidate libcni
   * would load; those it would not are passed over into `skipped`. A file we will not read (not
   * a regular file, too big) or one whose plugins list goes on in a directory is not passed
   * over: the runtime may well load it, and our entry in a later file would then be ignored.
   * Null text: such a file (said through `fail`), or the file vanished.
   */
  private async findPrimary(names: readonly string[], skipped: Skipped[], fail: (r: ErrorReason, m: string) => void): Promise<{ name: string; text: string | null; said?: boolean } | null> {
    const explicit = this.s.cniConfName !== '';
    // libcni's ConfFiles leaves directories out whatever their name (lstat: a link to one is
    // still a candidate, refused below as not a regular file): no runtime reads them.
    const isDir = async (n: string) => (await fs.lstat(path.join(this.netDir, n)).catch(() => null))?.isDirectory() === true;
    const dirs = new Set<string>();
    for (const n of names) if ((isConfigFile(n) || n === this.s.cniConfName) && (await isDir(n))) dirs.add(n);
    for (const name of primaryCandidates(names.filter((n) => !dirs.has(n)), { confName: this.s.cniConfName, ownFiles: this.ownFiles() })) {
      const file = path.join(this.netDir, name);
      let text: string | null;
      try {
        text = await readIfExists(file);
      } catch (e) {
        if (!(e instanceof UnsafeFileError)) throw e;
        fail('file_refused', `primary CNI config ${e.message}; leaving it untouched until it changes`);
        return { name, text: null, said: true };
      }
      if (text === null) return { name, text: null };
      const verdict = libcniVerdict(text, name);
      if (!verdict.ok) {
        // A named primary is taken as it is; what is wrong with it is said when it is parsed.
        if (explicit) return { name, text };
        skipped.push({ file: name, reason: verdict.reason });
        continue;
      }
      if (verdict.pluginDir !== undefined) {
        const dir = path.join(this.netDir, verdict.pluginDir);
        let listing: Dirent[];
        try {
          listing = await fs.readdir(dir, { withFileTypes: true });
        } catch (e) {
          // As libcni: a missing dir adds no plugins, any other error fails the load. A path
          // error (not a directory, a link loop, too long) fails it for every reader, so that
          // file is passed over as the runtime does; another error (EACCES, EIO) may be ours
          // alone, and the runtime may load the file: stop here.
          const code = (e as NodeJS.ErrnoException).code ?? '';
          const everyReader = ['ENOTDIR', 'ELOOP', 'ENAMETOOLONG'].includes(code);
          if (code === 'ENOENT') listing = [];
          else if (everyReader && !explicit) {
            skipped.push({ file: name, reason: `the directory its "name" names, where libcni looks for more of its plugins, cannot be listed by any reader (${code}), so it fails to load` });
            continue;
          } else {
            fail(everyReader ? 'primary_unsupported' : 'file_refused', `${name} in ${this.netDir}: cannot read the directory its "name" names, where libcni looks for more of its plugins (${code || (e as Error).message}); not installing until it can be read`);
            return { name, text: null, said: true };
          }
        }
        const more = listing.filter((d) => !d.isDirectory() && path.extname(d.name) === '.conf');
        if (more.length > 0) {
          fail('primary_unsupported', `${name} in ${this.netDir} takes ${more.length} more plugin config(s) from the directory its "name" names after its own list, so an entry of ours there would not run last; not installing. Move them into its "plugins" list`);
          return { name, text: null, said: true };
        }
        if (!verdict.listed) {
          if (explicit) return { name, text };
          skipped.push({ file: name, reason: 'no "plugins" list, and no plugin .conf files in the directory its "name" names' });
          continue;
        }
      }
      return { name, text };
    }
    return null;
  }

  private async syncChained(entry: JsonObject, writes: Write[], notReady: string[], fail: (r: ErrorReason, m: string) => void, skipped: Skipped[]): Promise<string | null> {
    const names = await fs.readdir(this.netDir);
    const found = await this.findPrimary(names, skipped, fail);
    const primary = found?.name ?? null;
    if (found && found.text !== null && !found.said) await this.failCopyOfOurs(found.name, found.text, names, fail);
    let primaryAfter: string | null = null;
    const passedOver = skipped.length > 0 ? `; passed over, as the runtime would: ${skipped.map((k) => `${k.file}: ${k.reason}`).join('; ')}` : '';
    if (found === null && skipped.length > 0) {
      // Maybe a file caught half-written: an error, retried on the backoff, said if it stays.
      fail('primary_malformed', `waiting for a primary CNI config the runtime can load in ${this.netDir}${passedOver}`);
    } else if (found === null) {
      notReady.push(this.s.cniConfName
        ? `waiting for the primary CNI config ${this.s.cniConfName}${otherForm(this.s.cniConfName) ? ` (or ${otherForm(this.s.cniConfName)})` : ''} in ${this.netDir}`
        : `waiting for a primary CNI config (.conf, .conflist or .json) in ${this.netDir}${passedOver}`);
    } else {
      const file = path.join(this.netDir, found.name);
      const text = found.text;
      if (found.said) {
        // Said through fail(); the other files are still looked at below.
      } else if (text === null) {
        notReady.push(`primary CNI config ${file} vanished while being read; retrying`);
      } else {
        try {
          const rewrite = withOurEntry(text, found.name, entry);
          primaryAfter = rewrite?.fileName ?? found.name;
          if (rewrite) {
            const st = await fs.stat(file);
            const link = (await fs.lstat(file)).isSymbolicLink() ? await fs.readlink(file) : undefined;
            // A .conf made a .conflist is a new file; else the primary is edited where it is.
            // The primary CNI may rewrite its file while ours is being written: then what we
            // computed is stale, and putting it in place would undo their change.
            const unchanged = async () => (await readIfExists(file).catch(() => null)) === text;
            const opts = { mode: st.mode & 0o7777, uid: st.uid, gid: st.gid, beforeRename: unchanged };
            const replaced = path.join(this.netDir, rewrite.fileName);
            const { written, target } = rewrite.replaces ? { written: await writeFileAtomic(replaced, rewrite.text, opts), target: replaced } : await writeThrough(file, text, this.netDir, rewrite.text, opts);
            if (!written) {
              notReady.push(`primary CNI config ${file} changed while our entry was being added; doing it again`);
              return primaryAfter;
            }
            writes.push({ file: target, kind: 'cni_config', action: 'write' });
            const original = { ...(await this.originalFor(found.name, text, st, rewrite.text)), ...(rewrite.replaces && link !== undefined ? { link } : {}) };
            this.originals.set(rewrite.fileName, original);
            // A .conf given back from the .conflist we made needs its record on disk, kept up to
            // date with what we wrote (every restart with another entry rewrites the conflist).
            if (original.name !== rewrite.fileName) {
              await writeFileAtomic(path.join(this.netDir, originalRecord(rewrite.fileName)), JSON.stringify(original), { mode: 0o600 });
            }
            if (rewrite.replaces) {
              // Recorded before the .conf goes, so no kill in between loses its bytes. The
              // runtime reads the .conf first while both exist: the conflist, then the removal.
              await removeFile(file);
              writes.push({ file, kind: 'cni_config', action: 'remove' });
            }
          }
        } catch (e) {
          if (!(e instanceof CniConfigError)) throw e;
          fail('primary_malformed', `${e.message} (in ${this.netDir}); leaving it untouched until it changes`);
        }
      }
    }
    // Our entry belongs only in the file the runtime reads: take it out of every other one (the
    // old primary when a new file took first place).
    await this.takeOutAllBut(names, new Set([primary, primaryAfter, ...this.ownFiles()]), writes);
    // Switched from --mesh-owned-cni-config: our file goes only now that the entry is in the
    // primary, so the runtime never reads a config without it.
    if (primaryAfter !== null && !this.s.meshOwnedCniConfig) await this.removeOwned(writes);
    if (primaryAfter !== null) await this.removeEarlierOwned(writes);
    if (primaryAfter !== null) await this.failOwnNamesShadowing(names, primaryAfter, entry, writes, fail);
    return primaryAfter;
  }

  /**
   * A file at one of our own names sorting before `target` (the file holding our entry) that
   * the runtime loads, with no entry of ours (owned.ts ownNameShadows): config_shadowed. Left
   * out as a primary, so nothing else would say that the runtime reads it instead of ours.
   */
  private async failOwnNamesShadowing(names: readonly string[], target: string, entry: JsonObject, writes: Write[], fail: (r: ErrorReason, m: string) => void): Promise<void> {
    const own = this.ownFiles();
    for (const name of [...names].sort(byteOrder)) {
      if (name === target || !own.has(name) || !isConfigFile(name) || !sortsBefore(name, target)) continue;
      // Gone since the listing (our own removeOwned), or not a regular file: nothing the runtime loads.
      const file = path.join(this.netDir, name);
      const text = await readIfExists(file).catch(() => null);
      if (text === null || !libcniVerdict(text, name).ok || textHoldsOurEntry(text, name)) continue;
      // A byte-exact copy of a config still there (a rollback copy of ours): removing it loses
      // nothing, and `target` holds our entry, so the runtime then reads that.
      if (await this.copyOfConfig(name, text, target, entry)) {
        if (await removeFile(file)) writes.push({ file, kind: 'cni_config', action: 'remove' });
        await removeFile(this.recordFor(name));
        continue;
      }
      fail('config_shadowed', ownNameShadows(name, target, this.netDir, await this.recordedFrom(name)));
    }
  }

  /**
   * Whether `text`, at our name `name` with no entry of ours, is a byte-exact copy of a config
   * still in the dir: the one its hidden record names (ours was made from it, then a version
   * without the owned file took our entry out), else `fallback`; as that config is, without our
   * entry, or as ours made from it without our entry. Removing or overwriting it loses nothing.
   */
  private async copyOfConfig(name: string, text: string, fallback: string | null, entry: JsonObject): Promise<boolean> {
    const from = [await this.recordedFrom(name), fallback].filter((n): n is string => n !== null && n !== name);
    for (const other of new Set(from)) {
      const otherText = await readIfExists(path.join(this.netDir, other)).catch(() => null);
      if (otherText === null) continue;
      const forms: (() => string | null)[] = [
        () => otherText,
        () => withoutOurEntry(otherText, other),
        () => withoutOurEntry(ownedText(withoutOurEntry(otherText, other) ?? otherText, other, entry), name),
      ];
      for (const form of forms) {
        try {
          if (form() === text) return true;
        } catch {
          // Not a config we can read that way: not a copy in that form.
        }
      }
    }
    return false;
  }

  /**
   * Owned files of ours under another name (an earlier --mesh-owned-cni-config-filename): a
   * .conflist with the hidden record we keep beside ours (recordFor), holding an entry of ours,
   * a regular file in our file's mode (no group or other bits). Known for good, whatever the
   * primary does since: never taken for the primary, removed once the entry is in place.
   */
  private async findEarlierOwned(names: readonly string[]): Promise<Set<string>> {
    const out = new Set<string>();
    const present = new Set(names);
    for (const record of names) {
      if (!record.startsWith('.') || !record.endsWith(OWNED_FROM_SUFFIX)) continue;
      const name = record.slice(1, -OWNED_FROM_SUFFIX.length);
      if (name === this.s.meshOwnedCniConfigFilename || path.extname(name) !== '.conflist' || !present.has(name)) continue;
      const st = await fs.lstat(path.join(this.netDir, name)).catch(() => null);
      if (!st?.isFile() || (st.mode & 0o077) !== 0) continue;
      const text = await readIfExists(path.join(this.netDir, name)).catch(() => null);
      if (text !== null && textHoldsOurEntry(text, name)) out.add(name);
    }
    return out;
  }

  /** Our owned files under earlier names gone, with their records: only once the entry is in the file the runtime reads. */
  private async removeEarlierOwned(writes: Write[]): Promise<void> {
    for (const name of this.earlierOwned) {
      const file = path.join(this.netDir, name);
      if (await removeFile(file)) writes.push({ file, kind: 'cni_config', action: 'remove' });
      await removeFile(this.recordFor(name));
    }
    this.earlierOwned = new Set();
  }

  private async syncStandalone(entry: JsonObject, writes: Write[]): Promise<string> {
    const name = this.standaloneName;
    const file = path.join(this.netDir, name);
    const text = standaloneConfig(entry, name);
    if ((await readIfExists(file).catch(() => null)) !== text) {
      await writeFileAtomic(file, text, { mode: CONFIG_MODE });
      writes.push({ file, kind: 'cni_config', action: 'write' });
    }
    // ownFiles() holds our conflist in standalone mode.
    await this.takeOutAllBut(await fs.readdir(this.netDir), this.ownFiles(), writes);
    if (name !== this.s.meshOwnedCniConfigFilename) await this.removeOwned(writes);
    await this.removeEarlierOwned(writes);
    return name;
  }

  /** The primary our owned file was last made from (for the message once it is gone). */
  private ownedFrom: string | null = null;
  /** When the primary ours was made from was first seen gone (holdOwned). */
  private ownedFromGoneSince: number | null = null;

  /**
   * --mesh-owned-cni-config (owned.ts): our own file, the primary's network with our entry
   * last, sorting before the primary, which is never edited. The runtime reads ours; a primary
   * rewritten meanwhile leaves ours as it was, with our entry, until it is made again from the
   * new text. Returns the file the runtime reads with our entry.
   */
  private async syncOwned(entry: JsonObject, writes: Write[], notReady: string[], fail: (r: ErrorReason, m: string) => void, skipped: Skipped[], notes: string[]): Promise<string | null> {
    const ownedName = this.s.meshOwnedCniConfigFilename;
    const owned = path.join(this.netDir, ownedName);
    const names = await fs.readdir(this.netDir);
    const found = await this.findPrimary(names, skipped, fail);
    let current: string | null;
    try {
      current = await readIfExists(owned);
    } catch (e) {
      if (!(e instanceof UnsafeFileError)) throw e;
      fail('file_refused', foreignOwned(ownedName, this.netDir, `is not a file we write (${e.message})`));
      return null;
    }
    // A rollback copy at our name (ours with our entry taken out by a version without this
    // mode): a byte-exact copy of a config still there, so overwriting it loses nothing.
    if (current !== null && !textHoldsOurEntry(current, ownedName) && (await this.copyOfConfig(ownedName, current, found?.name ?? null, entry))) current = null;
    const kept = current !== null ? ownedName : null;
    // A restarted agent: which primary ours was made from, as the run before recorded it.
    if (this.ownedFrom === null && current !== null) this.ownedFrom = await this.recordedOwnedFrom();
    if (found?.said) return kept;
    if (found && found.text !== null && (await this.failCopyOfOurs(found.name, found.text, names, fail))) return kept;
    if (found && sortsBefore(found.name, ownedName)) {
      // The runtime reads that file, not ours: fail closed, our entry goes into it as without
      // this mode; ours stays (with our entry) for when that file is gone. Ready once it is
      // in (the runtime reads our entry), with a note; whatever stops it is said by syncChained.
      const plan = planOwned({ ownedName, primary: { name: found.name, text: '', mode: 0 }, current: null }, entry, this.netDir);
      skipped.length = 0;
      const into = await this.syncChained(entry, writes, notReady, fail, skipped);
      if (plan.action === 'shadowed') notes.push(plan.note);
      return into;
    }
    // A file at our name that we did not write (no entry of ours: another program's, the
    // primary's own when the names are equal): never overwritten; uninstall leaves it too.
    if (current !== null && !textHoldsOurEntry(current, ownedName)) {
      fail('file_refused', foreignOwned(ownedName, this.netDir, undefined, await this.recordedFrom(ownedName)));
      return null;
    }
    if (this.holdOwned(found?.name ?? null, names, current !== null, skipped, notReady, fail)) return ownedName;
    const primaryFile = found ? path.join(this.netDir, found.name) : '';
    const st = found && found.text !== null ? await fs.stat(primaryFile).catch(() => null) : null;
    if (found && (found.text === null || st === null)) {
      notReady.push(`primary CNI config ${primaryFile} vanished while being read; retrying`);
      return kept;
    }
    // With --cni-conf-name, a config the runtime loads may sort before ours: not a primary, but
    // what the runtime reads instead of ours.
    const shadowed = found && this.s.cniConfName !== '' ? shadowedBy(await this.validBefore(names, ownedName, found.name), ownedName, this.netDir) : null;
    if (shadowed) fail('config_shadowed', shadowed);
    const curMode = current !== null ? ((await fs.stat(owned).catch(() => null))?.mode ?? 0) : 0;
    let plan: OwnedPlan;
    try {
      plan = planOwned({
        ownedName,
        primary: found && st ? { name: found.name, text: found.text!, mode: st.mode } : null,
        current: current !== null ? { text: current, mode: curMode } : null,
        madeFrom: this.ownedFrom,
      }, entry, this.netDir);
    } catch (e) {
      if (!(e instanceof CniConfigError)) throw e;
      fail('primary_malformed', `${e.message} (in ${this.netDir}); leaving it untouched until it changes${kept ? `, and our ${ownedName} as it is` : ''}`);
      return kept;
    }
    notReady.push(...plan.notReady);
    // No primary: maybe one caught half-written (an error, retried on the backoff).
    const passedOver = skipped.length > 0 ? `; passed over, as the runtime would: ${skipped.map((k) => `${k.file}: ${k.reason}`).join('; ')}` : '';
    if (found === null && skipped.length > 0) fail('primary_malformed', `waiting for a primary CNI config the runtime can load in ${this.netDir}${passedOver}${kept ? `; keeping our ${ownedName} as it is` : ''}`);
    if (plan.action === 'wait' || plan.action === 'shadowed') {
      if (skipped.length === 0) notReady.push(`waiting for a primary CNI config (.conf, .conflist or .json) in ${this.netDir} to make our ${ownedName} from`);
      return null;
    }
    if (plan.action === 'write') {
      const text = found!.text;
      // The primary rewritten while ours was being made: ours would be stale; the runtime
      // keeps reading our previous version (with our entry) and the change's event runs again.
      const unchanged = async () => (await readIfExists(primaryFile).catch(() => null)) === text;
      if (!(await writeFileAtomic(owned, plan.text, { mode: plan.mode, beforeRename: unchanged }))) {
        const again = `primary CNI config ${primaryFile} changed while our ${ownedName} was being made from it; doing it again`;
        // Ours already holds our entry (a file at our name without one is refused above), so
        // the runtime still reads a network with mesh-cni: no reason to be not ready. The
        // change's own watch event brings the pass that makes ours again (a storm of rewrites
        // made /readyz flap otherwise). Without a file of ours yet, the runtime reads the primary.
        if (kept === null) notReady.push(again);
        else log.debug(again);
        return kept;
      }
      writes.push({ file: owned, kind: 'cni_config', action: 'write' });
    }
    if (plan.from !== null) await this.rememberOwnedFrom(plan.from);
    await this.removeEarlierOwned(writes);
    // Ours is in place with our entry: an entry anywhere else (the primary's, from a run
    // without this mode) goes, the primary given back byte for byte.
    await this.takeOutAllBut(await fs.readdir(this.netDir), this.ownFiles(), writes);
    await this.failOwnNamesShadowing(names, ownedName, entry, writes, fail);
    return ownedName;
  }

  /**
   * Whether to keep ours as it is (not ready) rather than make it from `found`, a file sorting
   * after the primary ours was made from: that one still exists but does not load now (caught
   * half-written), or has just vanished (a primary CNI that deletes, then writes). Following
   * the next file would give pods another network, and report ready. A file sorting before it
   * is what the runtime reads, so it is followed; one gone for PRIMARY_GONE_GRACE_MS is too.
   */
  private holdOwned(found: string | null, names: readonly string[], haveOurs: boolean, skipped: readonly Skipped[], notReady: string[], fail: (r: ErrorReason, m: string) => void): boolean {
    const from = this.ownedFrom;
    const ownedName = this.s.meshOwnedCniConfigFilename;
    if (from !== null && !names.includes(from)) this.ownedFromGoneSince ??= Date.now();
    else this.ownedFromGoneSince = null;
    if (from === null || found === null || !haveOurs || found === from || sortsBefore(found, from)) return false;
    const bad = skipped.find((k) => k.file === from);
    if (bad) {
      // As a half-written primary without --mesh-owned-cni-config: an error said if it stays, retried.
      fail('primary_malformed', `the primary CNI config ${from} our ${ownedName} was made from cannot be loaded now (${bad.reason}); keeping ours as it is, not following ${found}, which sorts after it, until ${from} loads again or is gone`);
      return true;
    }
    if (names.includes(from)) return false;
    const left = PRIMARY_GONE_GRACE_MS - (Date.now() - (this.ownedFromGoneSince ?? Date.now()));
    if (left <= 0) return false;
    notReady.push(`the primary CNI config ${from} our ${ownedName} was made from is gone from ${this.netDir}; keeping ours as it is, and following ${found}, which sorts after it, only if ${from} is not back within ${PRIMARY_GONE_GRACE_MS} ms`);
    return true;
  }

  /**
   * Whether `name`, taken for the primary, is an owned file of ours under another name (an
   * earlier --mesh-owned-cni-config-filename): exactly what we would make from a config after
   * it, with its entry of ours. The runtime reads it, and a change of that config would never
   * reach pods: config_shadowed, left for the operator to remove (we cannot be sure we wrote
   * it). Looked for only in a file of ours' mode (no group or other bits) holding our entry, so
   * a pass with a primary of 0644 reads nothing more. Found only while that config is as it was.
   */
  private async failCopyOfOurs(name: string, text: string, names: readonly string[], fail: (r: ErrorReason, m: string) => void): Promise<boolean> {
    const st = await fs.stat(path.join(this.netDir, name)).catch(() => null);
    if (st === null || (st.mode & 0o077) !== 0 || path.extname(name) !== '.conflist' || !textHoldsOurEntry(text, name)) return false;
    let entry: JsonObject | undefined;
    try {
      entry = ((JSON.parse(text) as { plugins: JsonObject[] }).plugins).findLast((p) => isOurs(p));
    } catch {
      return false;
    }
    if (entry === undefined) return false;
    const later = primaryCandidates(names, { confName: this.s.cniConfName, ownFiles: this.ownFiles() }).filter((n) => sortsBefore(name, n)).slice(0, COPY_LOOKUP_MAX);
    for (const other of later) {
      const otherText = await readIfExists(path.join(this.netDir, other)).catch(() => null);
      if (otherText === null || textHoldsOurEntry(otherText, other)) continue;
      let made: string;
      try {
        made = ownedText(otherText, other, entry);
      } catch {
        continue;
      }
      if (made !== text) continue;
      fail('config_shadowed', `${name} in ${this.netDir} is a copy of ${other} with our entry, as our owned config file under another name (an earlier --mesh-owned-cni-config-filename) would be; the runtime reads it, so a change of ${other} would never reach pods. It is not known as ours, so it is left as it is: remove it`);
      return true;
    }
    return false;
  }

  /** Configs the runtime would load that sort before ours, but the named primary (--cni-conf-name). */
  private async validBefore(names: readonly string[], ownedName: string, primary: string): Promise<string[]> {
    const out: string[] = [];
    for (const name of [...names].sort(byteOrder)) {
      if (!sortsBefore(name, ownedName) || !isConfigFile(name) || name === primary || this.ownFiles().has(name)) continue;
      const text = await readIfExists(path.join(this.netDir, name)).catch(() => null);
      if (text !== null && libcniVerdict(text, name).ok) out.push(name);
    }
    return out;
  }

  /**
   * Our owned file gone (a run without --mesh-owned-cni-config, uninstall). Only a file that
   * holds an entry of ours: a file of that name we never wrote is not ours to remove.
   */
  private async removeOwned(writes: Write[]): Promise<void> {
    const name = this.s.meshOwnedCniConfigFilename;
    const file = path.join(this.netDir, name);
    const text = await readIfExists(file).catch(() => null);
    if (text === null) return;
    let ours: boolean;
    try {
      ours = withoutOurEntry(text, name) !== null;
    } catch {
      return;
    }
    if (ours && (await removeFile(file))) writes.push({ file, kind: 'cni_config', action: 'remove' });
    if (ours) await this.forgetOwnedFrom();
  }

  /** Where the name of the primary our owned file was made from is kept, for a restarted agent. Hidden, no config extension. */
  private ownedFromRecord(): string {
    return this.recordFor(this.s.meshOwnedCniConfigFilename);
  }

  /** The hidden record beside an owned file of ours named `name`. */
  private recordFor(name: string): string {
    return path.join(this.netDir, `.${name}${OWNED_FROM_SUFFIX}`);
  }

  /**
   * The primary our owned file was made from, as a run before this one recorded it. The net dir
   * may be writable by others: a record is only a config file name in this dir, and the worst
   * a planted one does is keep ours as it is, not ready, or for PRIMARY_GONE_GRACE_MS.
   */
  private async recordedOwnedFrom(): Promise<string | null> {
    return this.recordedFrom(this.s.meshOwnedCniConfigFilename);
  }

  private async recordedFrom(owned: string): Promise<string | null> {
    const text = await readRegularFileIfExists(this.recordFor(owned), { noFollow: true }).then((r) => r?.text ?? null, () => null);
    const name = text?.trim() ?? '';
    const ok = isConfigFile(name) && !name.includes('/') && !name.startsWith('.') && name !== owned;
    return ok ? name : null;
  }

  private async rememberOwnedFrom(from: string): Promise<void> {
    if (from === this.ownedFrom) return;
    this.ownedFrom = from;
    await writeFileAtomic(this.ownedFromRecord(), `${from}\n`, { mode: 0o600 });
  }

  private async forgetOwnedFrom(): Promise<void> {
    this.ownedFrom = null;
    await removeFile(this.ownedFromRecord());
  }

  /** Our entry out of every config file in `names` but those in `keep`. */
  private async takeOutAllBut(names: readonly string[], keep: ReadonlySet<string | null>, writes: Write[]): Promise<void> {
    this.files.keepOnly(new Set(names.map((n) => path.join(this.netDir, n))));
    const others = names.filter((n) => !keep.has(n) && isConfigFile(n));
    await this.files.warm(others.map((n) => path.join(this.netDir, n)));
    for (const name of others) {
      // Known to hold no entry of ours: no await, no I/O (thousands of files, pass after pass).
      const known = this.files.peek(path.join(this.netDir, name));
      if (known && !holdsOurEntry(known, name)) continue;
      await this.takeOut(name, writes);
    }
  }

  /** Whether `file` may hold an entry of ours, worked out once per content (filecache.ts). */
  private async mayHoldOurEntry(file: string, name: string): Promise<boolean> {
    const cached = await this.files.read(file).catch((e: unknown) => {
      if (e instanceof UnsafeFileError) return null;
      throw e;
    });
    return cached !== null && holdsOurEntry(cached, name);
  }

  /**
   * Takes our entry out of one config file: back to the primary CNI's exact bytes (and a .conf
   * back from the .conflist we made) when the file is still as we wrote it, else by splicing.
   * Files that do not parse are not ours to touch.
   */
  private async takeOut(name: string, writes: Write[]): Promise<void> {
    const file = path.join(this.netDir, name);
    // Most files hold no entry of ours, pass after pass: that is known from the cache.
    if (!(await this.mayHoldOurEntry(file, name))) return;
    // About to write: from what is there now, not from the cache.
    // A FIFO, device or oversized file never held an entry of ours: not ours to touch.
    const text = await readIfExists(file).catch((e: unknown) => {
      if (e instanceof UnsafeFileError) return null;
      throw e;
    });
    if (text === null) return;
    let without: string | null;
    try {
      without = withoutOurEntry(text, name);
    } catch {
      return;
    }
    if (without === null) return;
    const st = await fs.stat(file);
    const original = this.originals.get(name) ?? (await this.recordedOriginal(name, st));
    this.originals.delete(name);
    await removeFile(path.join(this.netDir, originalRecord(name)));
    if (original && original.written === sha256(text)) {
      const back = path.join(this.netDir, original.name);
      if (original.link !== undefined && original.name !== name) await symlinkAtomic(original.link, back);
      // The .conf we made this conflist from: written in the net dir itself (a link found there
      // now is replaced, not followed). Only the file itself, edited in place, may be a link.
      else if (original.name !== name) await writeFileAtomic(back, original.text, { mode: original.mode, uid: original.uid, gid: original.gid });
      else await writeThrough(back, text, this.netDir, original.text, { mode: original.mode, uid: original.uid, gid: original.gid });
      writes.push({ file: back, kind: 'cni_config', action: 'write' });
      if (original.name !== name) {
        await removeFile(file);
        writes.push({ file, kind: 'cni_config', action: 'remove' });
      }
      return;
    }
    const rest = (JSON.parse(without) as { plugins: unknown[] }).plugins;
    if (rest.length === 0) {
      // Nothing but our entry: a conflist of ours, not the primary CNI's.
      await removeFile(file);
      writes.push({ file, kind: 'cni_config', action: 'remove' });
    } else {
      await writeThrough(file, text, this.netDir, without, { mode: st.mode & 0o7777, uid: st.uid, gid: st.gid });
      writes.push({ file, kind: 'cni_config', action: 'write' });
    }
  }

  /**
   * What to give back on uninstall once `text` (now in `name`) is replaced by `written`. Never
   * a text with an entry of ours (one of an earlier version or run, or another log level):
   * the record a run before us left, while the file is still as that run wrote it, else the
   * text with every entry of ours taken out.
   */
  private async originalFor(name: string, text: string, st: { mode: number; uid: number; gid: number }, written: string): Promise<Original> {
    const prior = this.originals.get(name) ?? (await this.recordedOriginal(name, st));
    if (prior && prior.written === sha256(text)) return { ...prior, written: sha256(written) };
    let clean = text;
    try {
      clean = withoutOurEntry(text, name) ?? text;
    } catch {
      // withOurEntry parsed it already; keep the text as it came.
    }
    return { name, text: clean, mode: st.mode & 0o7777, uid: st.uid, gid: st.gid, written: sha256(written) };
  }

  /**
   * The record a previous run of the agent left for the conflist `name` (owned as `owner`), if
   * any and if it reads. The record sits in the net dir, which others can write, so it is taken
   * as a claim: only for the .conf this conflist was made from (the one record we write), with
   * a config file's mode bits at most, and an owner that is the conflist's or root.
   */
  private async recordedOriginal(name: string, owner: { uid: number; gid: number }): Promise<Original | undefined> {
    const text = await readRegularFileIfExists(path.join(this.netDir, originalRecord(name)), { noFollow: true }).then((r) => r?.text ?? null, () => null);
    if (text === null) return undefined;
    try {
      const o = JSON.parse(text) as Partial<Original>;
      const ok = path.extname(name) === '.conflist' && o.name === otherForm(name) && typeof o.text === 'string' && typeof o.written === 'string' &&
        typeof o.mode === 'number' && typeof o.uid === 'number' && typeof o.gid === 'number' && (o.link === undefined || typeof o.link === 'string');
      if (!ok) return undefined;
      const r = o as Original;
      const known = (id: number, own: number) => id === own || id === 0;
      const uid = known(r.uid, owner.uid) ? r.uid : owner.uid;
      const gid = known(r.gid, owner.gid) ? r.gid : owner.gid;
      return { ...r, mode: r.mode & RECORD_MODE_MASK, uid, gid };
    } catch {
      return undefined;
    }
  }

  /**
   * Uninstall: our entry out of every config, our conflist and orchconfig gone. The binaries
   * stay: the runtime runs DEL with the config it cached at ADD, so every pod started while we
   * were installed still runs mesh-cni on its DEL, and a missing binary would stop that DEL
   * before the IPAM and port-mapping plugins after it free the pod's lease and mappings. With
   * its orchconfig gone the plugin passes DEL through.
   */
  async cleanup(): Promise<Write[]> {
    const writes: Write[] = [];
    // Each step on its own: one that fails (a directory planted at a record's name, a file we
    // may not write) must not leave the rest of the uninstall undone. All failures are said.
    const errors: string[] = [];
    const step = async (what: string, fn: () => Promise<unknown>) => {
      try {
        await fn();
      } catch (e) {
        errors.push(`${what}: ${(e as Error).message}`);
      }
    };
    const names = await fs.readdir(this.netDir).catch(() => [] as string[]);
    // Our owned file first: taking the entry out of it would leave a copy of the primary. So
    // are ours under earlier names, known by their records.
    if (this.s.chained || this.standaloneName !== this.s.meshOwnedCniConfigFilename) await step(`removing our ${this.s.meshOwnedCniConfigFilename}`, () => this.removeOwned(writes));
    await step('removing ours under earlier names', async () => {
      this.earlierOwned = await this.findEarlierOwned(names);
      await this.removeEarlierOwned(writes);
    });
    for (const name of names) {
      if (!isConfigFile(name)) continue;
      if (name === this.s.meshOwnedCniConfigFilename && (this.s.chained || this.standaloneName !== name)) continue;
      if (!this.s.chained && name === this.standaloneName) {
        await step(`removing ${name}`, async () => {
          if (await removeFile(path.join(this.netDir, name))) writes.push({ file: path.join(this.netDir, name), kind: 'cni_config', action: 'remove' });
        });
        continue;
      }
      await step(`taking our entry out of ${name}`, () => this.takeOut(name, writes));
    }
    // Records of files no longer as we wrote them are no use to anyone now.
    for (const name of names) if (isOriginalRecord(name)) await step(`removing ${name}`, () => removeFile(path.join(this.netDir, name)));
    const orchconfig = path.join(this.netDir, this.s.orchcfgFileName);
    await step(`removing ${this.s.orchcfgFileName}`, async () => {
      if (await removeFile(orchconfig)) writes.push({ file: orchconfig, kind: 'orchconfig', action: 'remove' });
    });
    if (errors.length > 0) {
      throw new Error(`the uninstall in ${this.netDir} left ${errors.length} step(s) undone (the others were done: ${writes.length} file(s) written or removed): ${errors.join('; ')}. Remove what is named by hand`);
    }
    return writes;
  }
}

/**
 * Config-file names in `dir` that are not valid UTF-8 (listed as bytes, as libcni sees them),
 * each escaped (`0\x80.conflist`); empty when the dir cannot be listed.
 */
export async function unspellableConfigNames(dir: string): Promise<string[]> {
  const raw = await fs.readdir(dir, { encoding: 'buffer' }).catch(() => [] as Buffer[]);
  return raw
    .filter((b) => !Buffer.from(b.toString('utf8')).equals(b) && isConfigFile(b.toString('latin1')))
    .sort(Buffer.compare)
    .map((b) => [...b].map((c) => (c >= 0x20 && c < 0x7f && c !== 0x5c ? String.fromCharCode(c) : `\\x${c.toString(16).padStart(2, '0')}`)).join(''));
}
