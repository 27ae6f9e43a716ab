// Flags + env + defaults -> one validated, typed, frozen Settings object. Nothing else in the
// agent reads process.env: the entry point passes it here once.

import { existsSync } from 'node:fs';
import { isIPv4 } from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse as parseYaml } from 'yaml';
import {
  CLEANUP_MODES,
  CTRLZ_WRITE_MODES,
  FLAGS,
  LIST_MODES,
  LOG_LEVELS,
  LOG_SCOPES,
  SCOPES,
  scopesAt,
  type CleanupMode,
  type CtrlzWriteMode,
  type FlagSpec,
  type ListMode,
  type LogLevel,
  type LogScope,
  type NativeNftablesMode,
} from './flags.ts';
import { byteOrder, CONFIG_EXTENSIONS, DEFAULT_OWNED_NAME, TEMP_MARKER } from './cnifiles.ts';
import {
  ConfigError,
  ConfigErrors,
  MAX_TIMER_MS,
  parseBool,
  parseDuration,
  parseEnum,
  parseFileMode,
  parseInt10,
  parseList,
} from './parse.ts';
import { isLabelKey, isLabelValue, parseFieldSelector, parseLabelSelector } from './selectors.ts';
import {
  annotationKeyProblem,
  dns1123LabelProblem,
  dns1123SubdomainProblem,
  DNS1123_LABEL_RULE,
  DNS1123_SUBDOMAIN_RULE,
  QUALIFIED_NAME_RULE,
} from './k8snames.ts';
import {
  DEFAULT_ENABLEMENT_SELECTORS,
  parseEnablementSelectors,
  type EnablementSelector,
} from '../../cni-plugin/shared/enablement.ts';

export interface InstallSettings {
  readonly chained: boolean;
  readonly cniConfName: string;
  /** Chained mode: our own config file sorting before the primary's, instead of an entry spliced into it. */
  readonly meshOwnedCniConfig: boolean;
  readonly meshOwnedCniConfigFilename: string;
  readonly cniNetDir: string;
  readonly mountedCniNetDir: string;
  readonly cniBinDir: string;
  readonly mountedCniBinDir: string;
  readonly cniBinariesDir: string;
  readonly cniNetworkConfig: string;
  readonly cniNetworkConfigFile: string;
  readonly orchcfgFileName: string;
  readonly orchconfigMode: number;
  readonly orchCaFile: string;
  readonly skipTlsVerify: boolean;
  readonly serviceAccountDir: string;
  /** The account whose token the agent mints for the plugin's orchconfig (TokenRequest). */
  readonly pluginServiceAccount: string;
  readonly pluginTokenExpirationMs: number;
  /** Empty: the API server's default audience. */
  readonly pluginTokenAudiences: readonly string[];
  /** A token provided for the plugin instead of a minted one; empty: mint. */
  readonly pluginTokenFile: string;
  /** The plugin's log level, written into its config. */
  readonly pluginLogLevel: LogLevel;
  readonly logUdsAddress: string;
  /** Where the agent answers the plugin's pod lookups; empty: off. */
  readonly podLookupUdsAddress: string;
  readonly excludeNamespaces: readonly string[];
  readonly cleanupOnExit: CleanupMode;
  readonly reconcileIntervalMs: number;
  /** A pass running longer is reported stuck; stop waits this long for it. */
  readonly reconcileTimeoutMs: number;
  /** Where the node's CPU flags are read before a Bun-built plugin is installed (cpucheck.ts); no flag: tests give a fake. */
  readonly cpuinfoPath: string;
  /** --native-nftables: the redirect backend asked for (src/install/nfthost.ts decides auto). */
  readonly nativeNftables: NativeNftablesMode;
}

export interface RepairSettings {
  readonly enabled: boolean;
  readonly deletePods: boolean;
  readonly labelPods: boolean;
  readonly labelKey: string;
  readonly labelValue: string;
  readonly fieldSelectors: string;
  readonly labelSelectors: string;
  readonly initContainerExitCode: number;
  readonly initContainerName: string;
  readonly initContainerTerminationMessage: string;
  /** Empty: all nodes. */
  readonly nodeName: string;
  readonly sidecarAnnotation: string;
  readonly qps: number;
  readonly burst: number;
  readonly concurrency: number;
  /** --repair-repair-pods: repair in place first (src/repair/inplace.ts). */
  readonly repairPods: boolean;
  /** The host's /proc as the agent sees it. */
  readonly hostProcDir: string;
  /** The host's own netns (never a pod's); default <hostProcDir>/1/ns/net. */
  readonly hostNetnsPath: string;
  /** mesh-validation.cjs, run in a repaired pod's netns to prove the repair; no flag: beside the agent bundle. */
  readonly validationBundle: string;
}

/**
 * Ambient mode (docs/ambient.md): the node dataplane (src/ambient/dataplane.ts) and which pods are
 * ambient.
 */
export interface AmbientSettings {
  /** --ambient-enabled; refused without NODE_NAME (the informer watches this node's pods). */
  readonly enabled: boolean;
  /** --ambient-enablement-selector: a pod is ambient when one pair matches (cni-plugin/shared/enablement.ts). */
  readonly enablementSelectors: readonly EnablementSelector[];
  /** --pluginevent-uds-address: where the plugin POSTs an ambient pod's ADD (src/ambient/cmdadd.ts). */
  readonly pluginEventUdsAddress: string;
  /** --ztunnel-uds-address: the ZDS socket ztunnel connects to. */
  readonly ztunnelUdsAddress: string;
  /** --ambient-dns-capture: DNS to ztunnel in every ambient pod (a pod annotation may override). */
  readonly dnsCapture: boolean;
  /** --ambient-reconcile-pod-rules-on-startup: re-program the in-pod rules of enrolled pods at start. */
  readonly reconcilePodRulesOnStartup: boolean;
  /** --host-probe-snat-ip(v6): the node's probes to enrolled pods are SNATed to these. */
  readonly hostProbeSnatIp: string;
  readonly hostProbeSnatIpv6: string;
  /** Host probe rules and ipset for IPv6 too. */
  readonly ipv6: boolean;
  /** Where the host's / is mounted: the plugin's CNI netns path is opened under it. */
  readonly hostRoot: string;
  /** --kubelet-uid: the native nftables probe rule's uid; undefined: found at start (src/ambient/kubeletuid.ts). */
  readonly kubeletUid: number | undefined;
}

/** A taint as the agent matches it on its node: key and effect name it; value, when given, must match too. */
export interface StartupTaint {
  readonly key: string;
  readonly value: string | undefined;
  readonly effect: TaintEffect;
}

export const TAINT_EFFECTS = ['NoSchedule', 'PreferNoSchedule', 'NoExecute'] as const;
export type TaintEffect = (typeof TAINT_EFFECTS)[number];

/** The node's readiness for mesh pods (docs/node-readiness.md): a node condition and a start-up taint. */
export interface NodeReadinessSettings {
  /** --node-readiness-condition: the condition type kept from the agent's readiness; empty: off. */
  readonly conditionType: string;
  /** --startup-taint: removed once when first ready; undefined: taints are left alone. */
  readonly startupTaint: StartupTaint | undefined;
  /** --node-readiness-interval: one readiness pass. */
  readonly intervalMs: number;
}

/** Node conditions the kubelet (or the node controller) owns: the agent would fight it over them. */
const KUBELET_CONDITIONS = ['Ready', 'MemoryPressure', 'DiskPressure', 'PIDPressure', 'NetworkUnavailable'];

/** How the agent itself talks to the API server (docs/design.md "Fleet scale"). */
export interface OrchSettings {
  /** Client-side rate limit of the agent's list, watch, GET and TokenRequest calls (one bucket per agent). */
  readonly qps: number;
  readonly burst: number;
  /** auto: watch-list, else a list from the watch cache; cache: rv=0 list; consistent: paginated consistent list. */
  readonly listMode: ListMode;
  /** A watch cut (not its own timeout) is resumed after a random 0..this ms (capped by the watch backoff's cap). */
  readonly reconnectSpreadMs: number;
  /** The first list or watch-list waits a random 0..this ms (capped by the watch backoff's cap). */
  readonly startJitterMs: number;
}

export interface LoggingSettings {
  readonly asJson: boolean;
  readonly caller: readonly LogScope[];
  /** Level of each scope after applying --log_output_level (`all:` and bare levels expanded). */
  readonly outputLevels: Readonly<Record<LogScope, LogLevel>>;
  readonly stacktraceLevels: Readonly<Record<LogScope, LogLevel>>;
  readonly rotate: string;
  readonly rotateMaxAgeDays: number;
  readonly rotateMaxBackups: number;
  readonly rotateMaxSizeMb: number;
  readonly targets: readonly string[];
  readonly vklog: number;
}

/** Facts about the node and pod the agent runs in, from the downward API and kubelet's env. */
export interface EnvironmentFacts {
  readonly nodeName: string;
  readonly hostIp: string;
  readonly podName: string;
  readonly podNamespace: string;
  readonly orchServiceHost: string;
  readonly orchServicePort: string;
  /** PATH, where in-place repair's start-up check looks for nsenter (its children search the same). */
  readonly path: string;
}

export interface Settings {
  readonly install: InstallSettings;
  readonly repair: RepairSettings;
  readonly ambient: AmbientSettings;
  readonly logging: LoggingSettings;
  readonly orch: OrchSettings;
  readonly monitoring: { readonly port: number };
  readonly nodeReadiness: NodeReadinessSettings;
  readonly ctrlz: { readonly address: string; readonly port: number; readonly write: CtrlzWriteMode };
  readonly orchconfig: string;
  readonly env: EnvironmentFacts;
}

/** Raw values as the CLI parser saw them: strings, or true for a bare boolean flag. */
export type RawFlags = Readonly<Record<string, string | boolean | undefined>>;
export type Env = Readonly<Record<string, string | undefined>>;

/** `scope:level,...` as in Istio; a bare level applies to `default`, `all:` to every scope. */
export function parseScopeLevels(flag: string, value: string, base: LogLevel): Record<LogScope, LogLevel> {
  const out = scopesAt(base);
  for (const item of parseList(value)) {
    const i = item.lastIndexOf(':');
    const scope = i < 0 ? 'default' : item.slice(0, i);
    const level = i < 0 ? item : item.slice(i + 1);
    if (!(LOG_SCOPES as readonly string[]).includes(scope)) {
      throw new ConfigError(flag, value, `unknown scope ${JSON.stringify(scope)}; scopes are ${LOG_SCOPES.join(', ')}`);
    }
    if (!(LOG_LEVELS as readonly string[]).includes(level)) {
      throw new ConfigError(
        flag,
        value,
        `unknown level ${JSON.stringify(level)} for scope ${scope}; levels are ${LOG_LEVELS.join(', ')}`,
      );
    }
    if (scope === 'all') for (const s of SCOPES) out[s] = level as LogLevel;
    else out[scope as LogScope] = level as LogLevel;
  }
  return out;
}

function parseScopes(flag: string, value: string): LogScope[] {
  const scopes = parseList(value);
  for (const s of scopes) {
    if (!(LOG_SCOPES as readonly string[]).includes(s)) {
      throw new ConfigError(flag, value, `unknown scope ${JSON.stringify(s)}; scopes are ${LOG_SCOPES.join(', ')}`);
    }
  }
  return scopes.includes('all') ? [...SCOPES] : (scopes as LogScope[]);
}

/** A Kubernetes object name (DNS subdomain), as a service account's. */
function parseObjectName(flag: string, value: string): string {
  if (value.length > 253 || !/^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/.test(value)) {
    throw new ConfigError(
      flag,
      value,
      'expected a service account name: lower-case letters, digits, - and ., at most 253',
    );
  }
  return value;
}

/** A file name that must stay inside its directory. */
function parseFileName(flag: string, value: string, allowEmpty: boolean): string {
  if (value === '' && allowEmpty) return value;
  if (value === '' || value.includes('/') || value === '.' || value === '..' || value.includes('\0')) {
    throw new ConfigError(flag, value, 'expected a plain file name (no slashes)');
  }
  return value;
}

/**
 * Our own config file's name (--mesh-owned-cni-config): a .conflist, since that is what we
 * write, and not a temp-file name of ours (leftovers of those are removed at start).
 */
function parseOwnedFileName(flag: string, value: string): string {
  const name = parseFileName(flag, value, false);
  if (path.extname(name) !== '.conflist')
    throw new ConfigError(
      flag,
      value,
      'expected a .conflist name (what we write there is a conflist), such as 02-mesh-cni.conflist',
    );
  if (name.includes(TEMP_MARKER))
    throw new ConfigError(flag, value, `must not contain ${TEMP_MARKER}, the mark of our temp files`);
  if (name.startsWith('.')) throw new ConfigError(flag, value, 'must not start with a dot');
  return name;
}

/**
 * Our owned file's name when none is given: 02-mesh-cni.conflist, unless --cni-conf-name sorts
 * before it (Calico's 00-calico.conflist): then <its stem>-mesh-cni.conflist, which sorts just
 * before it ('-' < '.', byte order), so naming a primary never needs a second flag.
 */
function defaultOwnedFileName(cniConfName: string): string {
  if (cniConfName === '' || byteOrder(cniConfName, DEFAULT_OWNED_NAME) > 0) return DEFAULT_OWNED_NAME;
  const ext = path.extname(cniConfName);
  const derived = `${cniConfName.slice(0, cniConfName.length - ext.length)}-mesh-cni.conflist`;
  try {
    parseOwnedFileName('', derived);
  } catch {
    return DEFAULT_OWNED_NAME;
  }
  // Not before it (no extension, say): the check in buildSettings refuses it, naming the flag.
  return byteOrder(derived, cniConfName) < 0 ? derived : DEFAULT_OWNED_NAME;
}

/**
 * The plugin's token lifetime: 10m (the API server refuses TokenRequests under that) to 24h. The
 * token sits in a file on every node's disk, readable by root there, so it is kept short-lived:
 * a copy taken from one node stops working within a day at worst (1h by default).
 */
function parsePluginTokenExpiration(flag: string, value: string): number {
  const ms = parseDuration(flag, value);
  if (ms < 600_000 || ms > 86_400_000) {
    throw new ConfigError(
      flag,
      value,
      "expected a duration from 10m (the API server's minimum) to 24h (the token is written to the node's disk, so it must be short-lived)",
    );
  }
  return ms;
}

/** A path; a relative one is taken from the working directory, as a shell user means it. */
function parsePath(flag: string, value: string, cwd: string): string {
  if (value.includes('\0')) throw new ConfigError(flag, value, 'expected a path (no NUL characters)');
  return path.resolve(cwd, value);
}

/**
 * The orchconfig's name in the net dir. It holds the plugin's token, so the runtime must never
 * take it for a CNI config: no config extension (libcni's ConfFiles reads only .conf, .conflist
 * and .json). Where it sorts does not matter then: a name the runtime does not read is not a
 * config before or after the primary.
 */
function parseOrchcfgFileName(flag: string, value: string): string {
  const name = parseFileName(flag, value, false);
  const ext = path.extname(name).toLowerCase();
  if (CONFIG_EXTENSIONS.includes(ext)) {
    throw new ConfigError(
      flag,
      value,
      `has a CNI config extension (${ext}); the runtime would read the token file as a CNI config. Use a name without .conf, .conflist or .json, such as the default ZZZ-mesh-cni-orchconfig`,
    );
  }
  if (name.includes(TEMP_MARKER))
    throw new ConfigError(flag, value, `names like our temp files (${TEMP_MARKER}), which are removed at start-up`);
  return name;
}

/**
 * The orchconfig's mode. It holds a token: owner read/write at most, unless group/other read is
 * asked for explicitly (a node agent of another vendor that reads it as another user). Write and
 * execute bits beyond the owner's rw are never taken.
 */
function parseOrchconfigMode(flag: string, value: string, allowGroupOtherRead: boolean): number {
  const mode = parseFileMode(flag, value);
  const problems: string[] = [];
  if (mode & 0o044 && !allowGroupOtherRead) problems.push('makes the token in it readable by group or others');
  if (mode & 0o022) problems.push('makes it writable by group or others');
  if (mode & 0o111) problems.push('sets execute bits');
  if (problems.length === 0) return mode;
  const hatch =
    mode & 0o044 && !allowGroupOtherRead
      ? '; group/other read, if really wanted, needs --orchconfig-allow-group-other-read'
      : '';
  throw new ConfigError(flag, value, `${problems.join(' and ')}; use 0600 (384) or 0400 (256)${hatch}`);
}

/**
 * --native-nftables: auto, or a boolean as Go's strconv.ParseBool reads it (Istio's
 * NATIVE_NFTABLES is one), kept as the word true or false.
 */
function parseNativeNftables(flag: string, value: string): NativeNftablesMode {
  if (value === 'auto') return 'auto';
  try {
    return parseBool(flag, value) ? 'true' : 'false';
  } catch {
    throw new ConfigError(flag, value, 'expected auto, true or false (also 1/0, t/f)');
  }
}

/**
 * mesh-validation.cjs, which in-place repair runs in a pod's netns: beside the agent bundle, in
 * dist/ and in the image (/opt/mesh-cni/); from source (tests), the built one in dist/.
 */
function validationBundlePath(): string {
  const here = path.dirname(fileURLToPath(import.meta.url));
  const beside = path.join(here, 'mesh-validation.cjs');
  const built = path.resolve(here, '..', '..', 'dist', 'mesh-validation.cjs');
  return existsSync(beside) || !existsSync(built) ? beside : built;
}

/** Builds the settings; throws ConfigErrors listing every bad value (nothing is touched first). */
export function buildSettings(flags: RawFlags, env: Env, cwd: string = process.cwd()): Settings {
  const errors: ConfigError[] = [];
  // Resolve flag > env > default, remembering which source gave the value for messages.
  const raw = (spec: FlagSpec): { value: string; source: string } => {
    const given = flags[spec.name];
    if (given !== undefined) return { value: given === true ? 'true' : String(given), source: `--${spec.name}` };
    const fromEnv = spec.env === null ? undefined : env[spec.env];
    if (fromEnv !== undefined) return { value: fromEnv, source: `env ${spec.env}` };
    return { value: spec.default ?? '', source: `--${spec.name}` };
  };
  const byName = new Map(FLAGS.map((f) => [f.name, f]));
  // A bad value is reported, and the checks after it see the flag's default (the flag table is the
  // one place defaults live): the other values are judged as they would be with it unset. The
  // settings themselves are thrown away with the errors.
  function get<T>(name: string, parse: (source: string, value: string) => T): T {
    const spec = byName.get(name);
    if (!spec) throw new Error(`internal: no flag ${name}`);
    const { value, source } = raw(spec);
    try {
      return parse(source, value);
    } catch (e) {
      if (!(e instanceof ConfigError)) throw e;
      errors.push(e);
    }
    try {
      return parse(`--${spec.name}`, spec.default ?? '');
    } catch (e) {
      throw new Error(`internal: the default of --${spec.name} in the flag table is refused: ${(e as Error).message}`, {
        cause: e,
      });
    }
  }
  const str = (name: string) => get(name, (_s, v) => v);
  const bool = (name: string) => get(name, parseBool);
  const int = (name: string, min: number, max: number) => get(name, (s, v) => parseInt10(s, v, min, max));
  // Path flags are the ones the flag table marks `path:` (completion reads the same mark).
  const pathFlag = (name: string, allowEmpty: boolean) => {
    if (!byName.get(name)?.path)
      throw new Error(`internal: flag ${name} is read as a path but not marked path: in the flag table`);
    return get(name, (s, v) => (v === '' && allowEmpty ? '' : parsePath(s, v, cwd)));
  };
  const abs = (name: string) => pathFlag(name, false);
  const absOrEmpty = (name: string) => pathFlag(name, true);

  // The flag keeps its place (Istio's install-cni has it), but there is nothing to turn on.
  get('ebpf-enabled', (s, v) => {
    if (parseBool(s, v))
      throw new ConfigError(
        s,
        v,
        'eBPF redirection was removed from Istio in 1.21 and ztunnel no longer consumes it; ' +
          'ambient mode (--ambient-enabled) redirects with in-pod iptables rules: remove the setting or set it to false',
      );
    return false;
  });

  const cniConfName = get('cni-conf-name', (s, v) => parseFileName(s, v, true));
  const ownedSpec = byName.get('mesh-owned-cni-config-filename')!;
  const ownedNameGiven =
    flags[ownedSpec.name] !== undefined || (ownedSpec.env !== null && env[ownedSpec.env] !== undefined);
  // Read once: a bad value is reported once, however often the mode is parsed.
  const allowGroupOtherRead = bool('orchconfig-allow-group-other-read');
  const install: InstallSettings = {
    chained: bool('chained-cni-plugin'),
    cniConfName,
    meshOwnedCniConfig: bool('mesh-owned-cni-config'),
    // Given (flag or env): taken as given, refused below if it does not sort first.
    meshOwnedCniConfigFilename: ownedNameGiven
      ? get('mesh-owned-cni-config-filename', parseOwnedFileName)
      : defaultOwnedFileName(cniConfName),
    cniNetDir: abs('cni-net-dir'),
    mountedCniNetDir: abs('mounted-cni-net-dir'),
    cniBinDir: abs('cni-bin-dir'),
    mountedCniBinDir: abs('mounted-cni-bin-dir'),
    cniBinariesDir: abs('cni-binaries-dir'),
    cniNetworkConfig: str('cni-network-config'),
    cniNetworkConfigFile: absOrEmpty('cni-network-config-file'),
    orchcfgFileName: get('orchcfg-file-name', parseOrchcfgFileName),
    orchconfigMode: get('orchconfig-mode', (s, v) => parseOrchconfigMode(s, v, allowGroupOtherRead)),
    orchCaFile: absOrEmpty('orch-ca-file'),
    skipTlsVerify: bool('skip-tls-verify'),
    serviceAccountDir: abs('service-account-dir'),
    pluginServiceAccount: get('plugin-service-account', parseObjectName),
    pluginTokenExpirationMs: get('plugin-token-expiration', parsePluginTokenExpiration),
    pluginTokenAudiences: get('plugin-token-audiences', (_s, v) => parseList(v)),
    pluginTokenFile: absOrEmpty('plugin-token-file'),
    pluginLogLevel: get('log-level', (s, v) => parseEnum(s, v, LOG_LEVELS)),
    logUdsAddress: absOrEmpty('log-uds-address'),
    podLookupUdsAddress: absOrEmpty('pod-lookup-uds-address'),
    excludeNamespaces: get('exclude-namespaces', (_s, v) => parseList(v)),
    cleanupOnExit: get('cleanup-on-exit', (s, v) => parseEnum(s, v, CLEANUP_MODES)),
    reconcileIntervalMs: get('reconcile-interval', (s, v) => parseDuration(s, v, { min: 100, max: MAX_TIMER_MS })),
    reconcileTimeoutMs: get('reconcile-timeout', (s, v) => parseDuration(s, v, { min: 100, max: MAX_TIMER_MS })),
    cpuinfoPath: '/proc/cpuinfo',
    nativeNftables: get('native-nftables', parseNativeNftables),
  };
  if (install.pluginTokenFile !== '' && install.pluginTokenFile === path.join(install.serviceAccountDir, 'token')) {
    errors.push(
      new ConfigError(
        '--plugin-token-file',
        install.pluginTokenFile,
        "is the agent's own service-account token, which must never be written to the node's disk; give a token of the plugin's account, or leave it empty to mint one",
      ),
    );
  }
  if (
    install.chained &&
    install.meshOwnedCniConfig &&
    install.cniConfName !== '' &&
    byteOrder(install.cniConfName, install.meshOwnedCniConfigFilename) <= 0
  ) {
    errors.push(
      new ConfigError(
        '--mesh-owned-cni-config-filename',
        install.meshOwnedCniConfigFilename,
        `does not sort before --cni-conf-name ${install.cniConfName}, so the runtime would read that file, not ours; name it so that it sorts first (byte order), such as ${path.basename(install.cniConfName, path.extname(install.cniConfName))}-mesh-cni.conflist (or leave it unset: that is then its default), or run with --mesh-owned-cni-config=false`,
      ),
    );
  }
  if (install.skipTlsVerify && install.orchCaFile !== '') {
    errors.push(
      new ConfigError(
        '--skip-tls-verify',
        'true',
        'cannot be combined with --orch-ca-file; choose one way to trust the API server',
      ),
    );
  }

  const nodeName = env.NODE_NAME ?? '';
  const hostProcDir = abs('host-proc-dir');
  const repair: RepairSettings = {
    enabled: bool('repair-enabled'),
    deletePods: bool('repair-delete-pods'),
    labelPods: bool('repair-label-pods'),
    labelKey: get('repair-broken-pod-label-key', parseLabelKey),
    labelValue: get('repair-broken-pod-label-value', parseLabelValue),
    // Checked the way the API server would, so a typo fails at start-up, not on every list call.
    fieldSelectors: get('repair-field-selectors', (s, v) => checkSelector(s, v, parseFieldSelector)),
    labelSelectors: get('repair-label-selectors', (s, v) => checkSelector(s, v, parseLabelSelector)),
    initContainerExitCode: int('repair-init-container-exit-code', 0, 255),
    initContainerName: get('repair-init-container-name', parseContainerName),
    initContainerTerminationMessage: str('repair-init-container-termination-message'),
    // Istio's default is empty (all nodes); on a node the DaemonSet passes NODE_NAME, which
    // is what an operator means: repair the pods of this node. All nodes only when both are empty.
    nodeName: get('repair-node-name', parseNodeName) || nodeName,
    sidecarAnnotation: get('repair-sidecar-annotation', parseAnnotationKey),
    qps: int('repair-qps', 1, 10_000),
    burst: int('repair-burst', 1, 100_000),
    concurrency: int('repair-concurrency', 1, 1000),
    repairPods: bool('repair-repair-pods'),
    hostProcDir,
    hostNetnsPath: absOrEmpty('host-netns-path') || path.join(hostProcDir, '1', 'ns', 'net'),
    validationBundle: validationBundlePath(),
  };
  if (repair.nodeName !== '') {
    // The watch selects spec.nodeName=<node> and the operator's terms are ANDed to it: one on
    // spec.nodeName that contradicts it makes a watch of no pod, a repair that never repairs.
    const bad = parseFieldSelector(repair.fieldSelectors).find(
      (r) => r.field === 'spec.nodeName' && (r.op === '=') !== (r.value === repair.nodeName),
    );
    if (bad) {
      const why =
        `spec.nodeName${bad.op}${bad.value} selects no pod of this agent's node ${repair.nodeName} ` +
        '(--repair-node-name, else NODE_NAME), which the watch selects already; ' +
        'to repair the pods of another node, set --repair-node-name';
      errors.push(new ConfigError(raw(byName.get('repair-field-selectors')!).source, repair.fieldSelectors, why));
    }
  }
  // Empty matches no pod: no container and no annotation has an empty name. (The value as given is
  // read: a bad one is not empty, so its error is the one already reported.)
  for (const [name, what] of [
    ['repair-init-container-name', 'the validation init container'],
    ['repair-sidecar-annotation', 'the annotation of sidecar pods'],
  ] as const) {
    const { value, source } = raw(byName.get(name)!);
    if (repair.enabled && value === '')
      errors.push(new ConfigError(source, value, `must name ${what} when --repair-enabled is on`));
  }

  const ambient: AmbientSettings = {
    enabled: bool('ambient-enabled'),
    enablementSelectors: get('ambient-enablement-selector', parseSelectorsFlag),
    pluginEventUdsAddress: abs('pluginevent-uds-address'),
    ztunnelUdsAddress: abs('ztunnel-uds-address'),
    dnsCapture: bool('ambient-dns-capture'),
    reconcilePodRulesOnStartup: bool('ambient-reconcile-pod-rules-on-startup'),
    hostProbeSnatIp: get('host-probe-snat-ip', (s, v) => parseAddress(s, v, 4)),
    hostProbeSnatIpv6: get('host-probe-snat-ipv6', (s, v) => parseAddress(s, v, 6)),
    ipv6: bool('ambient-ipv6'),
    hostRoot: abs('host-root'),
    // Up to 2^32-2: 2^32-1 is (uid_t)-1, no uid.
    kubeletUid: get('kubelet-uid', (s, v) => (v.trim() === '' ? undefined : parseInt10(s, v, 0, 0xfffffffe))),
  };
  if (ambient.enabled && nodeName === '') {
    const { value, source } = raw(byName.get('ambient-enabled')!);
    const why =
      'needs NODE_NAME (the node this agent runs on, from the downward API: spec.nodeName): ' +
      "ambient mode watches this node's pods";
    errors.push(new ConfigError(source, value, why));
  }

  const conditionType = get('node-readiness-condition', parseConditionType);
  const nodeReadiness: NodeReadinessSettings = {
    conditionType,
    startupTaint: get('startup-taint', parseTaint),
    intervalMs: get('node-readiness-interval', (s, v) => parseDuration(s, v, { min: 10, max: MAX_TIMER_MS })),
  };
  if (conditionType !== '' && nodeName === '') {
    const { value, source } = raw(byName.get('node-readiness-condition')!);
    const why =
      'needs NODE_NAME (the node this agent runs on, from the downward API: spec.nodeName): ' +
      'the condition and the start-up taint are on that node';
    errors.push(new ConfigError(source, value, why));
  }

  const logging: LoggingSettings = {
    asJson: bool('log_as_json'),
    caller: get('log_caller', parseScopes),
    outputLevels: get('log_output_level', (s, v) => parseScopeLevels(s, v, 'info')),
    stacktraceLevels: get('log_stacktrace_level', (s, v) => parseScopeLevels(s, v, 'none')),
    rotate: absOrEmpty('log_rotate'),
    rotateMaxAgeDays: int('log_rotate_max_age', 0, 1_000_000),
    rotateMaxBackups: int('log_rotate_max_backups', 0, 1_000_000),
    rotateMaxSizeMb: int('log_rotate_max_size', 1, Number.MAX_SAFE_INTEGER),
    targets: get('log_target', (s, v) => {
      const t = parseList(v);
      if (t.length === 0) throw new ConfigError(s, v, 'expected stdout, stderr or file paths, comma-separated');
      return t;
    }),
    vklog: int('vklog', 0, 10),
  };

  const orch: OrchSettings = {
    qps: int('orch-qps', 1, 10_000),
    burst: int('orch-burst', 1, 100_000),
    listMode: get('orch-list-mode', (s, v) => parseEnum(s, v, LIST_MODES)),
    // Not flags: a cut of every watch at once comes back over 12 s; a mass restart over 1 s.
    reconnectSpreadMs: 12_000,
    startJitterMs: 1000,
  };

  const settings: Settings = {
    install,
    repair,
    ambient,
    orch,
    logging,
    monitoring: { port: int('monitoring-port', 0, 65535) },
    nodeReadiness,
    ctrlz: {
      address: str('ctrlz_address'),
      port: int('ctrlz_port', 0, 65535),
      write: get('ctrlz_write', (s, v) => parseEnum(s, v, CTRLZ_WRITE_MODES)),
    },
    orchconfig: absOrEmpty('orchconfig'),
    env: {
      nodeName,
      hostIp: env.HOST_IP ?? '',
      podName: env.POD_NAME ?? '',
      podNamespace: env.POD_NAMESPACE ?? '',
      orchServiceHost: env.KUBERNETES_SERVICE_HOST ?? '',
      orchServicePort: env.KUBERNETES_SERVICE_PORT ?? '',
      path: env.PATH ?? '',
    },
  };
  if (errors.length > 0) throw new ConfigErrors(errors);
  return deepFreeze(settings);
}

/**
 * Names the repair controller matches on a pod, checked with the API server's rules: a name it
 * refuses is on no pod, so repair would match nothing, silently. Empty passes here (a setting
 * that is off); where empty cannot work, the check after the parse says so.
 */
function nameParser(what: string, rule: string, problem: (v: string) => string | undefined) {
  return (flag: string, value: string): string => {
    const why = value === '' ? undefined : problem(value);
    if (why !== undefined) throw new ConfigError(flag, value, `${why}; ${what} must be ${rule}`);
    return value;
  };
}

const parseContainerName = nameParser('a container name', DNS1123_LABEL_RULE, dns1123LabelProblem);
const parseNodeName = nameParser('a node name', DNS1123_SUBDOMAIN_RULE, dns1123SubdomainProblem);
const parseAnnotationKey = nameParser('an annotation key', `${QUALIFIED_NAME_RULE} (case aside)`, annotationKeyProblem);

function parseLabelKey(flag: string, value: string): string {
  if (!isLabelKey(value)) {
    throw new ConfigError(
      flag,
      value,
      'expected a label key: [prefix/]name, name of at most 63 letters, digits, -, _ or .',
    );
  }
  return value;
}

function parseLabelValue(flag: string, value: string): string {
  if (!isLabelValue(value)) {
    throw new ConfigError(
      flag,
      value,
      'expected a label value: at most 63 letters, digits, -, _ or ., starting and ending alphanumeric',
    );
  }
  return value;
}

/** A node condition type: a name (CamelCase, as the kubelet's) with an optional DNS prefix; not one the kubelet owns. */
function parseConditionType(flag: string, value: string): string {
  if (value === '') return '';
  if (!/^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\/)?[A-Za-z][A-Za-z0-9]{0,62}$/.test(value))
    throw new ConfigError(flag, value, 'expected a condition type such as MeshCNIReady or example.com/MeshCNIReady');
  if (KUBELET_CONDITIONS.includes(value))
    throw new ConfigError(flag, value, 'is a condition the kubelet keeps; name one of our own, such as MeshCNIReady');
  return value;
}

/** `key[=value]:effect`, as kubectl taint and the kubelet's --register-with-taints write it; empty: none. */
function parseTaint(flag: string, value: string): StartupTaint | undefined {
  if (value === '') return undefined;
  const m = /^([^=:]+)(?:=([^:]*))?:([A-Za-z]+)$/.exec(value);
  const effect = m?.[3] as TaintEffect | undefined;
  if (!m || !isLabelKey(m[1]!) || (m[2] !== undefined && m[2] !== '' && !isLabelValue(m[2])))
    throw new ConfigError(flag, value, 'expected key[=value]:effect, e.g. mesh.io/cni-not-ready:NoSchedule');
  if (!(TAINT_EFFECTS as readonly string[]).includes(effect!))
    throw new ConfigError(flag, value, `the effect must be one of ${TAINT_EFFECTS.join(', ')}`);
  return { key: m[1]!, value: m[2], effect: effect! };
}

const MAX_SELECTOR_BYTES = 65_536;

/**
 * --ambient-enablement-selector: YAML (JSON is YAML) list of {podSelector, namespaceSelector};
 * empty: the default. Label keys and values are checked as the API server checks them.
 */
function parseSelectorsFlag(flag: string, value: string): readonly EnablementSelector[] {
  if (value.trim() === '') return DEFAULT_ENABLEMENT_SELECTORS;
  // Bounded (written into the plugin's config, read on every ADD); the error shows its start only.
  const bytes = Buffer.byteLength(value);
  if (bytes > MAX_SELECTOR_BYTES)
    throw new ConfigError(flag, `${value.slice(0, 64)}...`, `${bytes} bytes: at most ${MAX_SELECTOR_BYTES}`);
  let doc: unknown;
  try {
    doc = parseYaml(value);
  } catch (e) {
    throw new ConfigError(flag, value, `not YAML or JSON: ${(e as Error).message.split('\n')[0]}`);
  }
  let selectors: EnablementSelector[];
  try {
    selectors = parseEnablementSelectors(doc);
  } catch (e) {
    throw new ConfigError(flag, value, (e as Error).message);
  }
  selectors.forEach((sel, i) => {
    for (const [part, ls] of [
      ['podSelector', sel.podSelector],
      ['namespaceSelector', sel.namespaceSelector],
    ] as const) {
      const keys = [
        ...Object.entries(ls?.matchLabels ?? {}).map(([k, v]) => [k, [v]] as const),
        ...(ls?.matchExpressions ?? []).map((e) => [e.key, e.values ?? []] as const),
      ];
      for (const [k, values] of keys) {
        if (!isLabelKey(k))
          throw new ConfigError(flag, value, `[${i}].${part}: ${JSON.stringify(k)} is not a label key`);
        const bad = values.find((v) => !isLabelValue(v));
        if (bad !== undefined)
          throw new ConfigError(flag, value, `[${i}].${part}: ${JSON.stringify(bad)} is not a label value (${k})`);
      }
    }
  });
  return selectors;
}

/** An IP address of the family, in its canonical text form. */
function parseAddress(flag: string, value: string, family: 4 | 6): string {
  if (family === 4) {
    if (!isIPv4(value)) throw new ConfigError(flag, value, 'expected an IPv4 address');
    return value;
  }
  // The URL parser checks an IPv6 literal as net.isIPv6 does, at no cost, where isIPv6's first
  // call compiles a large regular expression (~3 ms of every start: docs/design.md "Start-up time"); the
  // characters are checked first, so nothing but the address is parsed as the URL's host. A zone
  // id (fe80::1%eth0) is no address for a probe rule.
  const host = /^[0-9A-Fa-f:.]+$/.test(value) ? URL.parse(`http://[${value}]/`)?.hostname : undefined;
  if (!host) throw new ConfigError(flag, value, 'expected an IPv6 address');
  return host.slice(1, -1);
}

function checkSelector(flag: string, value: string, parse: (v: string) => unknown): string {
  try {
    parse(value);
  } catch (e) {
    throw new ConfigError(flag, value, (e as Error).message);
  }
  return value;
}

function deepFreeze<T>(o: T): T {
  if (o && typeof o === 'object' && !Object.isFrozen(o)) {
    Object.freeze(o);
    for (const v of Object.values(o)) deepFreeze(v);
  }
  return o;
}
