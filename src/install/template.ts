// Our plugin entry, from the operator's template (--cni-network-config or
// --cni-network-config-file, JSON with comments allowed: parsed with json5) or the default one,
// which is made from the plugin's own config type (cni-plugin/shared/netconf.ts MeshNetConf).
// Output is a plain object that the rest writes as strict JSON, since runtimes parse strictly.

import JSON5 from 'json5';
import { isObject } from '../../cni-plugin/shared/json.ts';
import { PLUGIN_TYPE, type MeshNetConf } from '../../cni-plugin/shared/netconf.ts';
import { CniConfigError, type JsonObject } from './cniconfig.ts';
import { describeParseError } from '../../cni-plugin/shared/parseerror.ts';
import type { EnablementSelector } from '../../cni-plugin/shared/enablement.ts';
import { LEVEL_RANK, type LogLevel } from '../../cni-plugin/shared/loglevels.ts';

/** A config with a placeholder for each value; a key the plugin does not read does not compile. */
type Placeholders<T> = {
  readonly [K in keyof T]?: K extends 'type'
    ? T[K]
    : NonNullable<T[K]> extends object & { length?: never }
      ? Placeholders<NonNullable<T[K]>>
      : `__${string}__`;
};

const DEFAULT_ENTRY: Placeholders<MeshNetConf> = {
  type: PLUGIN_TYPE,
  log_level: '__LOG_LEVEL__',
  log_uds_address: '__LOG_UDS_ADDRESS__',
  pod_lookup_uds_address: '__POD_LOOKUP_UDS_ADDRESS__',
  orch: {
    orchconfig: '__KUBECONFIG_FILEPATH__',
    cni_bin_dir: '__CNI_BIN_DIR__',
    exclude_namespaces: '__EXCLUDE_NAMESPACES__',
    node_name: '__KUBERNETES_NODE_NAME__',
  },
};

/** DEFAULT_ENTRY as template text: a list's placeholder stands bare (it is filled in as JSON). */
export const DEFAULT_TEMPLATE =
  JSON.stringify(DEFAULT_ENTRY, null, 2)
    .replace('{\n', '{\n  // Written by install-cni. Values in __X__ are filled in from its settings.\n')
    .replace('"__EXCLUDE_NAMESPACES__"', '__EXCLUDE_NAMESPACES__') + '\n';

export interface TemplateValues {
  readonly kubeconfigFilepath: string;
  readonly logLevel: string;
  readonly logUdsAddress: string;
  readonly podLookupUdsAddress: string;
  readonly orchServiceHost: string;
  readonly orchServicePort: string;
  readonly nodeName: string;
  readonly hostIp: string;
  readonly cniNetDir: string;
  readonly cniBinDir: string;
  readonly excludeNamespaces: readonly string[];
  /** Ambient mode (--ambient-enabled): absent when off. */
  readonly ambient?: AmbientEntryValues;
  /** The agent chose native nftables (--native-nftables, nftbackend.ts); absent or false: iptables. */
  readonly nativeNftables?: boolean;
}

/** What the plugin's ambient branch reads from the entry (cni-plugin/ambient.ts). */
export interface AmbientEntryValues {
  /** The agent's plugin event socket (src/ambient/cmdadd.ts). */
  readonly pluginEventUdsAddress: string;
  readonly enablementSelectors: readonly EnablementSelector[];
}

/**
 * Our entry's `log_level`: what the plugin sends the agent's log server. The agent prints those
 * records in its scope `cni`, so an operator who starts it with `cni:debug` asks for the plugin's
 * debug records: the entry then says debug, whatever --log-level says. Below debug the scope is
 * not counted: its default (info) would otherwise raise the shipped --log-level (warn), one more
 * record for every pod started. Read at start: ControlZ's level changes do not re-render it.
 */
export function entryLogLevel(pluginLevel: LogLevel, cniScope: LogLevel): LogLevel {
  return LEVEL_RANK[cniScope] > LEVEL_RANK.info && LEVEL_RANK[cniScope] > LEVEL_RANK[pluginLevel]
    ? cniScope
    : pluginLevel;
}

/** Placeholder -> text put in its place. String values are JSON-escaped (they sit inside quotes). */
function substitutions(v: TemplateValues): [string, string][] {
  const str = (s: string) => JSON.stringify(s).slice(1, -1);
  return [
    ['__KUBECONFIG_FILEPATH__', str(v.kubeconfigFilepath)],
    ['__ORCHCONFIG_FILEPATH__', str(v.kubeconfigFilepath)],
    ['__LOG_LEVEL__', str(v.logLevel)],
    ['__LOG_UDS_ADDRESS__', str(v.logUdsAddress)],
    ['__POD_LOOKUP_UDS_ADDRESS__', str(v.podLookupUdsAddress)],
    ['__KUBERNETES_SERVICE_HOST__', str(v.orchServiceHost)],
    ['__KUBERNETES_SERVICE_PORT__', str(v.orchServicePort)],
    ['__KUBERNETES_NODE_NAME__', str(v.nodeName)],
    ['__HOST_IP__', str(v.hostIp)],
    ['__CNI_NET_DIR__', str(v.cniNetDir)],
    ['__CNI_BIN_DIR__', str(v.cniBinDir)],
    ['__EXCLUDE_NAMESPACES__', JSON.stringify(v.excludeNamespaces)],
    ['__AMBIENT_ENABLED__', JSON.stringify(v.ambient !== undefined)],
    ['__PLUGINEVENT_UDS_ADDRESS__', str(v.ambient?.pluginEventUdsAddress ?? '')],
    ['__AMBIENT_ENABLEMENT_SELECTORS__', JSON.stringify(v.ambient?.enablementSelectors ?? [])],
  ];
}

/** Renders the template into our plugin entry; `source` names it in errors. */
export function renderEntry(template: string, values: TemplateValues, source: string): JsonObject {
  let text = template;
  for (const [placeholder, value] of substitutions(values)) text = text.replaceAll(placeholder, value);
  let parsed: unknown;
  try {
    parsed = JSON5.parse(text);
  } catch (e) {
    // Never json5's message as it is: it quotes the text, and a mistaken path may name a token.
    throw new CniConfigError(
      `cannot parse the CNI network config template from ${source}: ${describeParseError(e, text, 'JSON5')}`,
    );
  }
  if (!isObject(parsed)) {
    throw new CniConfigError(`the CNI network config template from ${source} must be a JSON object (one plugin entry)`);
  }
  const entry = parsed as JsonObject;
  if (entry.type !== PLUGIN_TYPE) {
    throw new CniConfigError(
      `the CNI network config template from ${source} must have "type": "${PLUGIN_TYPE}" (found ${JSON.stringify(entry.type)})`,
    );
  }
  const left = /__[A-Z0-9_]+__/.exec(JSON.stringify(entry));
  if (left)
    throw new CniConfigError(`the CNI network config template from ${source} uses unknown placeholder ${left[0]}`);
  // Round-trip through strict JSON: json5 accepts values (Infinity, NaN) that strict JSON cannot hold.
  const strict = JSON.stringify(entry, (_k, v: unknown) => {
    if (typeof v === 'number' && !Number.isFinite(v))
      throw new CniConfigError(
        `the CNI network config template from ${source} has ${v}, which strict JSON cannot hold`,
      );
    return v;
  });
  const out = JSON.parse(strict) as JsonObject;
  // The backend is the agent's choice, made from the node at start: never the template's.
  if (values.nativeNftables) out.native_nftables = true;
  else delete out.native_nftables;
  // Ambient mode: the entry always says so, whatever the template holds: a template without the
  // keys (or with ambient_enabled false) would start ambient pods with no redirection at all.
  if (values.ambient) {
    out.ambient_enabled = true;
    out.pluginevent_uds_address = values.ambient.pluginEventUdsAddress;
    out.enablement_selectors = JSON.parse(JSON.stringify(values.ambient.enablementSelectors)) as JsonObject[];
    // The plugin skips an excluded namespace before deciding, the agent decides with its own
    // --exclude-namespaces: the two must be one list, or a namespace only the template excludes
    // starts its ambient pods unredirected (until the informer enrolls them).
    out.orch = { ...(isObject(out.orch) ? out.orch : {}), exclude_namespaces: [...values.excludeNamespaces] };
  }
  return out;
}
