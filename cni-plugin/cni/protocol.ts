// The CNI execution protocol (the CNI specification's section "Execution Protocol"): CNI_*
// environment + the plugin config on stdin -> one typed request, or a CniError with the code the
// spec asks for. This is the only place the plugin reads its environment.

import { CniError, CNI_ERROR } from './errors.ts';
import { isSupportedVersion, LATEST_VERSION, SUPPORTED_VERSIONS } from './result.ts';
import { isObject } from '../shared/json.ts';
import { isLogLevel, LOG_LEVELS, type LogLevel } from '../shared/loglevels.ts';
import {
  IPTABLES_FLAVOURS,
  PLUGIN_TYPE,
  type IptablesFlavour,
  type MeshNetConf,
  type MeshOrchConf,
  type NetConfKey,
  type RuntimeNetConf,
} from '../shared/netconf.ts';

export const COMMANDS = ['ADD', 'DEL', 'CHECK', 'VERSION', 'STATUS', 'GC'] as const;
export type Command = (typeof COMMANDS)[number];

/** Our entry of the conflist (cni-plugin/shared/netconf.ts MeshNetConf, plus what the runtime adds), parsed. */
export interface PluginConfig {
  readonly cniVersion: string;
  readonly name: string;
  readonly type: string;
  readonly logLevel: LogLevel;
  readonly logUdsAddress: string;
  /** The agent's pod lookup socket; empty: always ask the API server. */
  readonly podLookupUdsAddress: string;
  readonly orchconfig: string;
  readonly cniBinDir: string;
  readonly excludeNamespaces: readonly string[];
  /**
   * `orch.assume_namespace_when_missing`: for test set-ups only. A call that names a pod
   * (K8S_POD_NAME) but no K8S_POD_NAMESPACE is taken as a pod of this namespace. Empty (the
   * default): such a call is not a Kubernetes pod and passes through untouched, as Istio does.
   */
  readonly assumeNamespaceWhenMissing: string;
  readonly nodeName: string;
  /** Pod lookup bounds; optional in the config (tests and slow clusters tune them). */
  readonly podLookupTimeoutMs: number;
  readonly podLookupAttemptTimeoutMs: number;
  readonly iptablesFlavour: IptablesFlavour;
  /** `native_nftables`: the agent chose native nftables rules for this node. */
  readonly nativeNftables: boolean;
  /** Ambient mode: `ambient_enabled`, the agent's `pluginevent_uds_address` (non-empty when enabled). */
  readonly ambientEnabled: boolean;
  readonly pluginEventUdsAddress: string;
  /** `enablement_selectors` as found (undefined: the default); checked by the ambient branch when it runs. */
  readonly enablementSelectors: unknown;
  readonly prevResult: Record<string, unknown> | undefined;
}

export interface PodRef {
  readonly namespace: string;
  readonly name: string;
  readonly uid: string;
  readonly infraContainerId: string;
}

export interface CniRequest {
  readonly command: Command;
  readonly containerId: string;
  readonly netns: string;
  readonly ifname: string;
  readonly args: ReadonlyMap<string, string>;
  readonly pod: PodRef | null;
  readonly config: PluginConfig;
}

export type Env = Readonly<Record<string, string | undefined>>;

/** `K=V;K2=V2`. Every pair must have a key and `=`; values may be empty (podman sends them so). */
export function parseCniArgs(raw: string): Map<string, string> {
  const out = new Map<string, string>();
  if (raw.trim() === '') return out;
  for (const pair of raw.split(';')) {
    if (pair === '') continue;
    const eq = pair.indexOf('=');
    if (eq <= 0) {
      throw new CniError(
        CNI_ERROR.INVALID_ENV,
        'invalid CNI_ARGS',
        `CNI_ARGS pair ${JSON.stringify(pair)} is not KEY=VALUE (whole value ${JSON.stringify(raw)})`,
      );
    }
    out.set(pair.slice(0, eq).trim(), pair.slice(eq + 1));
  }
  return out;
}

/**
 * The Kubernetes pod a call is for, or null when it is not one. Kubernetes runtimes send both
 * namespace and name. Other runtimes sharing the node's CNI dir (podman sends
 * `IgnoreUnknown=1;K8S_POD_NAME=<container>`) send no namespace: their containers are no pods,
 * and looking them up would fail them; only `assumeNamespace` (a test set-up) makes them pods.
 */
export function podRefFromArgs(args: ReadonlyMap<string, string>, assumeNamespace: string): PodRef | null {
  const name = args.get('K8S_POD_NAME') ?? '';
  const namespace = args.get('K8S_POD_NAMESPACE') || assumeNamespace;
  if (name === '' || namespace === '') return null;
  return {
    namespace,
    name,
    uid: args.get('K8S_POD_UID') ?? '',
    infraContainerId: args.get('K8S_POD_INFRA_CONTAINER_ID') ?? '',
  };
}

/** The version to answer in when the input cannot tell us (garbage stdin, unknown version). */
export function versionOf(stdin: string): string {
  try {
    const v = (JSON.parse(stdin) as { cniVersion?: unknown }).cniVersion;
    if (isSupportedVersion(v)) return v;
  } catch {
    // fall through
  }
  return LATEST_VERSION;
}

function parseCommand(env: Env): Command {
  const c = env.CNI_COMMAND;
  if (c === undefined || c === '')
    throw new CniError(
      CNI_ERROR.INVALID_ENV,
      'CNI_COMMAND is not set',
      'mesh-cni is a CNI plugin: it is run by the container runtime with CNI_COMMAND=ADD|DEL|CHECK|VERSION|STATUS|GC',
    );
  if (!(COMMANDS as readonly string[]).includes(c)) {
    throw new CniError(
      CNI_ERROR.INVALID_ENV,
      `unknown CNI_COMMAND ${JSON.stringify(c)}`,
      `CNI_COMMAND must be one of ${COMMANDS.join(', ')}`,
    );
  }
  return c as Command;
}

/** A key of our entry at its own level: one read at the wrong level (top or "orch") does not compile. */
type TopKey = keyof MeshNetConf | keyof RuntimeNetConf;
function str(o: Record<string, unknown>, key: TopKey, where: '', fallback?: string): string;
function str(o: Record<string, unknown>, key: keyof MeshOrchConf, where: 'orch.', fallback?: string): string;
function str(o: Record<string, unknown>, key: NetConfKey, where: string, fallback?: string): string {
  const v = o[key];
  if (v === undefined && fallback !== undefined) return fallback;
  if (typeof v !== 'string') {
    throw new CniError(
      CNI_ERROR.INVALID_CONFIG,
      `invalid network config: ${where}${key} must be a string`,
      `got ${JSON.stringify(v)}`,
    );
  }
  return v;
}

function num(o: Record<string, unknown>, key: TopKey, fallback: number): number {
  const v = o[key];
  if (v === undefined) return fallback;
  if (typeof v !== 'number' || !Number.isFinite(v) || v <= 0) {
    throw new CniError(
      CNI_ERROR.INVALID_CONFIG,
      `invalid network config: ${key} must be a positive number of milliseconds`,
      `got ${JSON.stringify(v)}`,
    );
  }
  return v;
}

/** Parses stdin into the plugin config; `needsOrch` when the command will talk to the API server. */
export function parseConfig(stdin: string, command: Command): PluginConfig {
  let raw: unknown;
  try {
    raw = JSON.parse(stdin);
  } catch (e) {
    throw new CniError(
      CNI_ERROR.DECODE_FAILURE,
      'cannot decode the network config on stdin',
      `${(e as Error).message}; stdin starts with ${JSON.stringify(stdin.slice(0, 60))}`,
    );
  }
  if (!isObject(raw))
    throw new CniError(CNI_ERROR.DECODE_FAILURE, 'cannot decode the network config on stdin', 'expected a JSON object');
  const cniVersion = raw.cniVersion;
  if (!isSupportedVersion(cniVersion)) {
    throw new CniError(
      CNI_ERROR.INCOMPATIBLE_VERSION,
      `incompatible CNI version ${JSON.stringify(cniVersion ?? null)}`,
      `mesh-cni supports ${SUPPORTED_VERSIONS.join(', ')} (it chains after an interface plugin, so versions before 0.3.0 cannot work)`,
    );
  }
  const orch = raw.orch === undefined ? {} : raw.orch;
  if (!isObject(orch))
    throw new CniError(
      CNI_ERROR.INVALID_CONFIG,
      'invalid network config: orch must be an object',
      `got ${JSON.stringify(orch)}`,
    );
  const logLevel = str(raw, 'log_level', '', 'warn');
  if (!isLogLevel(logLevel)) {
    throw new CniError(
      CNI_ERROR.INVALID_CONFIG,
      `invalid network config: log_level ${JSON.stringify(logLevel)}`,
      `expected one of ${LOG_LEVELS.join(', ')}`,
    );
  }
  const excl = orch['exclude_namespaces' satisfies keyof MeshOrchConf] ?? [];
  if (!Array.isArray(excl) || !excl.every((n) => typeof n === 'string')) {
    throw new CniError(
      CNI_ERROR.INVALID_CONFIG,
      'invalid network config: orch.exclude_namespaces must be a list of strings',
      `got ${JSON.stringify(excl)}`,
    );
  }
  const assumeNamespace = str(orch, 'assume_namespace_when_missing', 'orch.', '');
  if (assumeNamespace !== '' && !NAMESPACE.test(assumeNamespace)) {
    throw new CniError(
      CNI_ERROR.INVALID_CONFIG,
      `invalid network config: orch.assume_namespace_when_missing ${JSON.stringify(assumeNamespace)}`,
      'expected a namespace name (lower-case letters, digits and -, at most 63), or leave it out so calls without K8S_POD_NAMESPACE pass through',
    );
  }
  const flavour = str(raw, 'iptables_flavour', '', 'auto');
  if (!(IPTABLES_FLAVOURS as readonly string[]).includes(flavour)) {
    throw new CniError(
      CNI_ERROR.INVALID_CONFIG,
      `invalid network config: iptables_flavour ${JSON.stringify(flavour)}`,
      'expected auto, legacy or nft',
    );
  }
  // The agent writes the backend it chose, a boolean: anything else is no choice to guess at.
  const nativeNftables = raw.native_nftables ?? false;
  if (typeof nativeNftables !== 'boolean') {
    throw new CniError(
      CNI_ERROR.INVALID_CONFIG,
      'invalid network config: native_nftables must be true or false',
      `got ${JSON.stringify(nativeNftables)}; install-cni writes the redirect backend it chose there (--native-nftables)`,
    );
  }
  const ambient = raw.ambient_enabled ?? false;
  if (typeof ambient !== 'boolean') {
    throw new CniError(
      CNI_ERROR.INVALID_CONFIG,
      'invalid network config: ambient_enabled must be true or false',
      `got ${JSON.stringify(ambient)}`,
    );
  }
  const pluginEventUds = str(raw, 'pluginevent_uds_address', '', '');
  if (ambient && pluginEventUds === '') {
    throw new CniError(
      CNI_ERROR.INVALID_CONFIG,
      'invalid network config: ambient_enabled is true but pluginevent_uds_address is empty',
      "install-cni writes the agent's plugin event socket there; ambient pods cannot be enrolled without it",
    );
  }
  const needsOrch = command === 'ADD' || command === 'CHECK';
  const orchconfig = str(orch, 'orchconfig', 'orch.', needsOrch ? undefined : '');
  if (needsOrch && orchconfig === '') {
    throw new CniError(
      CNI_ERROR.INVALID_CONFIG,
      'invalid network config: orch.orchconfig is empty',
      'install-cni writes the path of its orchconfig there',
    );
  }
  const prev = raw.prevResult;
  if (prev !== undefined && !isObject(prev)) {
    throw new CniError(
      CNI_ERROR.INVALID_CONFIG,
      'invalid network config: prevResult must be an object',
      `got ${JSON.stringify(prev)}`,
    );
  }
  if (prev === undefined && (command === 'ADD' || command === 'CHECK')) {
    throw new CniError(
      CNI_ERROR.INVALID_CONFIG,
      'missing prevResult',
      "mesh-cni is a chained plugin: it must come after an interface plugin (bridge, ptp, calico, ...) in a .conflist so the runtime passes that plugin's result",
    );
  }
  return Object.freeze({
    cniVersion,
    name: str(raw, 'name', '', ''),
    type: str(raw, 'type', '', PLUGIN_TYPE),
    logLevel,
    logUdsAddress: str(raw, 'log_uds_address', '', ''),
    podLookupUdsAddress: str(raw, 'pod_lookup_uds_address', '', ''),
    orchconfig,
    cniBinDir: str(orch, 'cni_bin_dir', 'orch.', ''),
    excludeNamespaces: Object.freeze([...(excl as string[])]),
    assumeNamespaceWhenMissing: assumeNamespace,
    nodeName: str(orch, 'node_name', 'orch.', ''),
    podLookupTimeoutMs: num(raw, 'pod_lookup_timeout_ms', 10_000),
    podLookupAttemptTimeoutMs: num(raw, 'pod_lookup_attempt_timeout_ms', 2_000),
    iptablesFlavour: flavour as IptablesFlavour,
    nativeNftables,
    ambientEnabled: ambient,
    pluginEventUdsAddress: pluginEventUds,
    enablementSelectors: raw.enablement_selectors,
    prevResult: prev as Record<string, unknown> | undefined,
  });
}

/** A Kubernetes namespace name (an RFC 1123 label). */
const NAMESPACE = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;
const CONTAINER_ID = /^[A-Za-z0-9][A-Za-z0-9_.-]*$/;
const IFNAME = /^[^\s/:]{1,15}$/;

/** The whole request for ADD/DEL/CHECK (VERSION/STATUS/GC need less; see main.ts). */
export function parseRequest(env: Env, stdin: string): CniRequest {
  const command = parseCommand(env);
  const required: Record<Command, readonly string[]> = {
    ADD: ['CNI_CONTAINERID', 'CNI_NETNS', 'CNI_IFNAME'],
    CHECK: ['CNI_CONTAINERID', 'CNI_NETNS', 'CNI_IFNAME'],
    DEL: ['CNI_CONTAINERID', 'CNI_IFNAME'],
    VERSION: [],
    STATUS: [],
    GC: [],
  };
  const missing = required[command].filter((k) => !env[k]);
  if (missing.length > 0) {
    throw new CniError(
      CNI_ERROR.INVALID_ENV,
      `missing ${missing.join(', ')}`,
      `CNI_COMMAND=${command} needs ${required[command].join(', ')} set by the runtime`,
    );
  }
  const containerId = env.CNI_CONTAINERID ?? '';
  if (containerId !== '' && !CONTAINER_ID.test(containerId)) {
    throw new CniError(
      CNI_ERROR.INVALID_ENV,
      'invalid CNI_CONTAINERID',
      `${JSON.stringify(containerId)} must start with a letter or digit and hold only letters, digits, _ . -`,
    );
  }
  const ifname = env.CNI_IFNAME ?? '';
  if (ifname !== '' && (!IFNAME.test(ifname) || ifname === '.' || ifname === '..')) {
    throw new CniError(
      CNI_ERROR.INVALID_ENV,
      'invalid CNI_IFNAME',
      `${JSON.stringify(ifname)} is not a Linux interface name`,
    );
  }
  const args = parseCniArgs(env.CNI_ARGS ?? '');
  const config = parseConfig(stdin, command);
  return {
    command,
    containerId,
    netns: env.CNI_NETNS ?? '',
    ifname,
    args,
    pod: podRefFromArgs(args, config.assumeNamespaceWhenMissing),
    config,
  };
}

export { parseCommand };
