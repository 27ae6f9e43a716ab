// Every flag install-cni accepts, with its env setting and default: the one table the CLI, the
// settings builder, the completion scripts and docs/flags.md (scripts/flags-doc.ts) are made from.
//
// The install-cni flags read their env setting named like the flag (`--cni-net-dir` ->
// CNI_NET_DIR), as Istio's install-cni does; the common logging and ctrlz flags have no env
// setting, as in Istio's.

import { LOG_LEVELS, type LogLevel } from '../../cni-plugin/shared/loglevels.ts';
import { DEFAULT_OWNED_NAME } from './cnifiles.ts';

export type FlagKind = 'bool' | 'string' | 'int' | 'duration' | 'list';

/** The groups of `--help`, in the order it shows them. */
export const FLAG_GROUPS = ['install', 'plugin', 'repair', 'ambient', 'monitoring', 'logging'] as const;
export type FlagGroup = (typeof FLAG_GROUPS)[number];

export interface FlagSpec {
  /** Long name without dashes, as typed: `cni-net-dir`, `log_output_level`. */
  readonly name: string;
  readonly kind: FlagKind;
  /** The default as the user would write it; undefined means empty. */
  readonly default?: string;
  /** Env setting read when the flag is not given; null means none. */
  readonly env: string | null;
  /** One short sentence: `--help` and the completion menus show it. */
  readonly help: string;
  /** The whole story, when one sentence cannot tell it: for a reference made from this table. */
  readonly details?: string;
  /** For completion: fixed choices. */
  readonly choices?: readonly string[];
  /** For completion: the value is a path to a file (or socket) or to a directory. */
  readonly path?: 'file' | 'dir';
  /** Group shown in help and docs/flags.md. */
  readonly group: FlagGroup;
}

function envName(name: string): string {
  return name.toUpperCase().replaceAll('-', '_');
}

/**
 * A flag of `group` whose env setting is its name in upper case (Istio's install-cni rule for these
 * groups).
 */
function envNamedFlag(group: FlagGroup) {
  return (
    name: string,
    kind: FlagKind,
    def: string | undefined,
    help: string,
    extra: Partial<FlagSpec> = {},
  ): FlagSpec => ({
    name,
    kind,
    default: def,
    env: envName(name),
    help,
    group,
    ...extra,
  });
}

const installFlag = envNamedFlag('install');
const pluginFlag = envNamedFlag('plugin');
const repairFlag = envNamedFlag('repair');
const ambientFlag = envNamedFlag('ambient');
const monitoringFlag = envNamedFlag('monitoring');

function commonFlag(
  name: string,
  kind: FlagKind,
  def: string | undefined,
  help: string,
  group: FlagGroup,
  extra: Partial<FlagSpec> = {},
): FlagSpec {
  return { name, kind, default: def, env: null, help, group, ...extra };
}

// One list with the plugin's config parser (cni-plugin/shared/), re-exported for the flag table's users.
export { LOG_LEVELS, type LogLevel };

/**
 * The install-cni log scopes (Istio's install-cni's, docs/flags.md "Log scopes"); `all` addresses
 * every scope at once.
 */
export const LOG_SCOPES = [
  'all',
  'ambient',
  'cni',
  'controllers',
  'default',
  'ebpf',
  'install',
  'klog',
  'model',
  'monitoring',
  'repair',
  'spiffe',
  'trustBundle',
  'validation',
] as const;
export type LogScope = Exclude<(typeof LOG_SCOPES)[number], 'all'>;
/** Every scope itself (LOG_SCOPES without `all`). */
export const SCOPES: readonly LogScope[] = LOG_SCOPES.filter((s): s is LogScope => s !== 'all');

/** Every scope at one level. */
export function scopesAt(level: LogLevel): Record<LogScope, LogLevel> {
  return Object.fromEntries(SCOPES.map((s) => [s, level])) as Record<LogScope, LogLevel>;
}

export const CLEANUP_MODES = ['auto', 'always', 'never'] as const;
/** --orch-list-mode: how the pod watch reads the state it then watches from (src/orch/informer.ts). */
export const LIST_MODES = ['auto', 'cache', 'consistent'] as const;
export type ListMode = (typeof LIST_MODES)[number];
/** --ctrlz_write: auto lets ControlZ change levels only when it listens on loopback alone. */
export const CTRLZ_WRITE_MODES = ['auto', 'true', 'false'] as const;
export type CtrlzWriteMode = (typeof CTRLZ_WRITE_MODES)[number];
export type CleanupMode = (typeof CLEANUP_MODES)[number];
/** --native-nftables: auto decides from the node (src/install/nfthost.ts), true and false pin it. */
export const NATIVE_NFTABLES_MODES = ['auto', 'true', 'false'] as const;
export type NativeNftablesMode = (typeof NATIVE_NFTABLES_MODES)[number];

export const FLAGS: readonly FlagSpec[] = [
  // --- install: where the plugin goes and how the agent keeps it there (seed flags first)
  installFlag(
    'chained-cni-plugin',
    'bool',
    'true',
    'Chain our entry into the primary CNI config (false: write a standalone conflist).',
    {
      details:
        'Whether to install the plugin as a chained entry of the primary CNI config (false: write a standalone conflist).',
    },
  ),
  installFlag(
    'mesh-owned-cni-config',
    'bool',
    'false',
    "Chained mode: write our own config file, sorting before the primary's, instead of editing it.",
    {
      details:
        "Chained mode: write our own config file (--mesh-owned-cni-config-filename), the primary CNI's network with our entry last, sorting before the primary's file, which is never edited, so no pod starts without our entry while the primary CNI rewrites its file (false, the default: splice our entry into the primary's file; docs/installer.md \"Owned config\" says what to check before turning it on).",
    },
  ),
  installFlag(
    'mesh-owned-cni-config-filename',
    'string',
    DEFAULT_OWNED_NAME,
    "Name of our own config file; it must sort before the primary CNI's file (byte order).",
    {
      details:
        "Name of our own config file with --mesh-owned-cni-config; it must sort before the primary CNI's file (byte order).",
    },
  ),
  installFlag(
    'cni-conf-name',
    'string',
    undefined,
    'CNI config file to put our entry into, or to write; empty: pick it as the runtime does.',
    {
      details:
        'Name of the CNI config file to put our entry into (chained) or to write (standalone); empty means pick it as the runtime does.',
    },
  ),
  installFlag(
    'cni-net-dir',
    'string',
    '/etc/cni/net.d',
    'The CNI net dir as the host sees it (used in paths written into configs).',
    { path: 'dir' },
  ),
  installFlag(
    'mounted-cni-net-dir',
    'string',
    '/host/etc/cni/net.d',
    'The CNI net dir as mounted into this container (where files are written).',
    { path: 'dir' },
  ),
  // --- paths to run outside a real node, and agent behaviour with no Istio install-cni flag
  installFlag('cni-bin-dir', 'string', '/opt/cni/bin', 'The CNI bin dir as the host sees it.', { path: 'dir' }),
  installFlag(
    'mounted-cni-bin-dir',
    'string',
    '/host/opt/cni/bin',
    'The CNI bin dir as mounted into this container (where mesh-cni is copied to).',
    { path: 'dir' },
  ),
  installFlag(
    'cni-binaries-dir',
    'string',
    '/opt/mesh-cni/bin',
    'Directory holding the binaries to install (in the image).',
    { path: 'dir' },
  ),
  installFlag(
    'service-account-dir',
    'string',
    '/var/run/secrets/kubernetes.io/serviceaccount',
    "Directory of the agent's service-account token, CA and namespace.",
    { path: 'dir' },
  ),
  installFlag(
    'orchconfig',
    'string',
    undefined,
    'Orchconfig (kubeconfig) the agent itself uses; empty: in-cluster (service account).',
    {
      path: 'file',
      details:
        'Orchconfig (kubeconfig) file the agent itself uses to reach the API server; empty means in-cluster (service account).',
    },
  ),
  installFlag(
    'orch-qps',
    'int',
    '1',
    "Rate limit of the agent's own API requests, per second (repair actions have --repair-qps).",
    {
      details:
        "Client-side rate limit of the agent's own API requests (lists, watches, reads, TokenRequests), " +
        'per second; repair actions have --repair-qps.',
    },
  ),
  installFlag(
    'orch-burst',
    'int',
    '10',
    'Requests the agent may send at once above --orch-qps (start-up needs about four).',
  ),
  installFlag(
    'orch-list-mode',
    'string',
    'auto',
    "How the agent reads its node's pods before watching: auto, cache or consistent.",
    {
      choices: LIST_MODES,
      details:
        "How the agent reads its node's pods before watching: auto (the streaming watch-list where the API server " +
        'has it, else a list from its watch cache), cache (a resourceVersion=0 list) or consistent (a paginated ' +
        'consistent list, read from etcd: only for a server without a watch cache).',
    },
  ),
  installFlag(
    'cleanup-on-exit',
    'string',
    'auto',
    'On SIGTERM: remove our entry and files always, never, or auto (unless our DaemonSet still exists).',
    {
      choices: CLEANUP_MODES,
      details:
        'On SIGTERM: always remove our entry and files, never, or auto: keep them only while the API server confirms our DaemonSet still exists (a restart or upgrade).',
    },
  ),
  installFlag(
    'reconcile-interval',
    'duration',
    '5s',
    'How often a full reconcile runs besides the file watches (catches what watches miss).',
  ),
  installFlag(
    'reconcile-timeout',
    'duration',
    '30s',
    'A reconcile pass longer than this fails /readyz; stopping waits this long for one.',
    {
      details:
        'A reconcile pass running longer than this makes /readyz fail with the reason (it is stuck); stopping waits at most this long for a running pass, and as long again for the uninstall.',
    },
  ),
  // --- the node's readiness for mesh pods (docs/node-readiness.md): off unless a condition is named
  installFlag(
    'node-readiness-condition',
    'string',
    undefined,
    'Node condition type the agent keeps from its readiness (e.g. MeshCNIReady); empty: off.',
    {
      details:
        'Node condition type (e.g. MeshCNIReady) the agent keeps on its own node from its readiness (what /readyz says), and the switch for --startup-taint; empty: off, the agent writes nothing to its node.',
    },
  ),
  installFlag(
    'startup-taint',
    'string',
    'mesh.io/cni-not-ready:NoSchedule',
    "Taint key[=value]:effect removed from the agent's node once, when first ready; empty: none.",
    {
      details:
        'Taint key[=value]:effect the agent removes from its own node once, when first ready (with --node-readiness-condition); empty: leave taints alone (e.g. the Node Readiness Controller removes it, keyed on the condition).',
    },
  ),
  installFlag(
    'node-readiness-interval',
    'duration',
    '1s',
    "How often the agent compares its readiness with its node's condition.",
    {
      details:
        'How often the agent compares its readiness with the node condition it last wrote (one readiness pass); the node is written only when the condition changes.',
    },
  ),
  // --- plugin: what the CNI plugin is given (its config, its orchconfig and token, its sockets)
  pluginFlag(
    'cni-network-config',
    'string',
    undefined,
    'Template of our CNI plugin entry (JSON; comments allowed); overrides --cni-network-config-file.',
  ),
  pluginFlag(
    'cni-network-config-file',
    'string',
    undefined,
    'File holding the template of our CNI plugin entry (JSON; comments allowed).',
    { path: 'file' },
  ),
  pluginFlag(
    'exclude-namespaces',
    'list',
    'mesh-system,kube-system',
    'Namespaces whose pods the plugin never redirects (comma-separated; written into its config).',
  ),
  pluginFlag('log-level', 'string', 'warn', 'Log level of the CNI plugin (written into its config).', {
    choices: LOG_LEVELS,
  }),
  pluginFlag(
    'native-nftables',
    'string',
    'false',
    'Redirect with native nftables rules: true, false, or auto (when the node can and uses nftables).',
    {
      choices: NATIVE_NFTABLES_MODES,
      details:
        'Redirect with native nftables rules instead of iptables: true, false, or auto (nftables when the node ' +
        "can run it, nft >= 1.0.1 with JSON and nf_tables in the kernel, and uses it: kube-proxy's nftables " +
        "table). Checked once at start; the choice goes into the plugin's config as native_nftables. With true " +
        'on a node that cannot, /readyz is not ready (docs/plugin.md "Native nftables"). The default is false: ' +
        'the rules benchmark measures no ADD faster or cheaper with nftables (docs/design.md "Benchmark").',
    },
  ),
  pluginFlag(
    'log-uds-address',
    'string',
    '/var/run/mesh-cni/log.sock',
    'Unix socket the CNI plugin sends its logs to; the agent prints them in scope cni.',
    { path: 'file' },
  ),
  pluginFlag(
    'pod-lookup-uds-address',
    'string',
    '/var/run/mesh-cni/pods.sock',
    "Unix socket where the agent answers the plugin's pod lookups; empty: it asks the API server.",
    {
      path: 'file',
      details:
        "Unix socket where the agent answers the plugin's pod lookups from its watch of this node's pods (empty: the plugin always asks the API server).",
    },
  ),
  pluginFlag(
    'orchcfg-file-name',
    'string',
    'ZZZ-mesh-cni-orchconfig',
    "Name of the plugin's orchconfig file, written into the CNI net dir.",
  ),
  pluginFlag(
    'orchconfig-mode',
    'int',
    '384',
    'File mode of the orchconfig, decimal (384) or octal (0600); it holds a token: at most 0600.',
    {
      details:
        "File mode of the orchconfig file (decimal as Istio's install-cni takes it, 384 = 0600; octal 0600 also accepted). It holds a token: group/other bits are refused unless --orchconfig-allow-group-other-read.",
    },
  ),
  pluginFlag(
    'orchconfig-allow-group-other-read',
    'bool',
    'false',
    'Let --orchconfig-mode give group and others read access to the orchconfig and its token.',
    {
      details:
        'Let --orchconfig-mode give group and others read access to the orchconfig and the token in it (write and execute bits stay refused).',
    },
  ),
  pluginFlag(
    'orch-ca-file',
    'string',
    undefined,
    'CA file the orchconfig trusts for the API server; empty: the service-account CA.',
    { path: 'file' },
  ),
  pluginFlag('skip-tls-verify', 'bool', 'false', 'Write insecure-skip-tls-verify into the orchconfig instead of a CA.'),
  pluginFlag(
    'plugin-service-account',
    'string',
    'mesh-cni-plugin',
    "Service account whose token the agent mints (TokenRequest) for the plugin's orchconfig.",
    {
      details:
        "Service account (in the agent's namespace) whose token the agent mints with TokenRequest for the CNI plugin's orchconfig; the agent's own token never leaves its pod.",
    },
  ),
  pluginFlag(
    'plugin-token-expiration',
    'duration',
    '1h',
    "Lifetime asked for the plugin's token, 10m to 24h; it is refreshed at 50-80% of it.",
    {
      details:
        "Lifetime asked for the plugin's token, 10m (the API server's minimum) to 24h (it sits on the node's disk); it is refreshed at 50-80% of the lifetime it got.",
    },
  ),
  pluginFlag(
    'plugin-token-audiences',
    'list',
    undefined,
    "Audiences of the plugin's token; empty: the API server's default, the one it surely accepts.",
    {
      details:
        "Audiences of the plugin's token; empty means the API server's default, the only one it is sure to accept.",
    },
  ),
  pluginFlag(
    'plugin-token-file',
    'string',
    undefined,
    "Put this token into the orchconfig instead of minting one (never the agent's own).",
    {
      path: 'file',
      details:
        "Put the token in this file into the orchconfig instead of minting one (a token of the plugin's account that you provide; the agent's own token is refused).",
    },
  ),
  // --- repair controller (seed), and its client-side limits
  repairFlag(
    'repair-enabled',
    'bool',
    'false',
    'Run the repair controller; on its own it is report only: it logs broken pods, acts on none.',
    {
      details:
        'Whether the repair controller runs. On its own it is report only: a broken pod is logged (warning) and ' +
        'counted, and nothing is done to it; --repair-repair-pods, --repair-label-pods and --repair-delete-pods ' +
        'say what to do. The start log says which it is.',
    },
  ),
  repairFlag('repair-delete-pods', 'bool', 'false', 'Delete pods found broken by the race (with a uid precondition).'),
  repairFlag('repair-label-pods', 'bool', 'false', 'Label pods found broken by the race.'),
  repairFlag(
    'repair-repair-pods',
    'bool',
    'false',
    'Repair broken pods in place, in their netns, before labelling or deleting them.',
    {
      details:
        "Repair broken pods in place: program the redirect rules in the running pod's netns and prove them " +
        'before labelling or deleting (needs /host/proc and CAP_SYS_ADMIN, CAP_SYS_PTRACE, CAP_NET_ADMIN, CAP_NET_RAW).',
    },
  ),
  repairFlag('repair-broken-pod-label-key', 'string', 'cni.mesh.io/uninitialized', 'Label key put on broken pods.'),
  repairFlag('repair-broken-pod-label-value', 'string', 'true', 'Label value put on broken pods.'),
  repairFlag(
    'repair-node-name',
    'string',
    undefined,
    "Repair the pods of this node; empty: NODE_NAME's (all nodes only if NODE_NAME is unset too).",
    {
      details:
        'Repair the pods of this node (a node name: a DNS-1123 subdomain). Empty, the default, means NODE_NAME, ' +
        "which the DaemonSet sets from the downward API: each agent repairs its own node's pods. Only when " +
        'NODE_NAME is unset too does repair watch the pods of all nodes, with a warning at start-up. In-place ' +
        'repair needs it empty or equal to NODE_NAME.',
    },
  ),
  repairFlag(
    'repair-field-selectors',
    'string',
    undefined,
    'Extra field selectors for the pods watched (field=value, comma-separated).',
  ),
  repairFlag('repair-label-selectors', 'string', undefined, 'Label selectors for the pods watched.'),
  repairFlag(
    'repair-sidecar-annotation',
    'string',
    'sidecar.mesh.io/status',
    'Pods without this annotation key are ignored (its value is not read).',
  ),
  repairFlag(
    'repair-init-container-name',
    'string',
    'mesh-validation',
    'Name of the validation init container (a DNS-1123 label).',
  ),
  repairFlag(
    'repair-init-container-exit-code',
    'int',
    '126',
    'Exit code of the validation init container that marks a pod broken.',
  ),
  repairFlag(
    'repair-init-container-termination-message',
    'string',
    undefined,
    'If set, the termination message must contain it for the pod to count as broken.',
  ),
  repairFlag('repair-qps', 'int', '200', 'Client-side rate limit of repair actions, requests per second.'),
  repairFlag('repair-burst', 'int', '400', 'Client-side burst of repair actions.'),
  repairFlag('repair-concurrency', 'int', '16', 'How many repair actions may be in flight at once.'),
  repairFlag(
    'host-proc-dir',
    'string',
    '/host/proc',
    "The host's /proc as mounted in the agent's container (to find pods' netns).",
    {
      path: 'dir',
      details:
        "The host's /proc as mounted in the agent's container, where in-place repair and ambient mode find pods' netns.",
    },
  ),
  repairFlag(
    'host-netns-path',
    'string',
    undefined,
    "The host's own netns, which is never a pod's (default: <host-proc-dir>/1/ns/net).",
    { path: 'file' },
  ),
  // --- ambient mode
  ambientFlag(
    'ambient-enabled',
    'bool',
    'false',
    "Ambient mode: enroll the node's ambient pods into ztunnel instead of a sidecar (needs NODE_NAME).",
    {
      details:
        "Ambient mode: enroll the node's ambient pods (--ambient-enablement-selector) into the node proxy, ztunnel, " +
        'instead of a sidecar (needs NODE_NAME; docs/ambient.md).',
    },
  ),
  ambientFlag(
    'ambient-enablement-selector',
    'string',
    undefined,
    'Which pods are ambient: a YAML or JSON list of pod and namespace selector pairs.',
    {
      details:
        'Which pods are ambient: a YAML or JSON list of {podSelector, namespaceSelector} label selectors, one pair ' +
        'matching is enough (empty: pod label mesh.io/dataplane-mode=ambient, or that namespace label with the ' +
        "pod's not none).",
    },
  ),
  ambientFlag(
    'ztunnel-uds-address',
    'string',
    '/var/run/ztunnel/ztunnel.sock',
    'Unix socket (SOCK_SEQPACKET) the agent listens on for ztunnel.',
    {
      path: 'file',
      details:
        'Unix socket (SOCK_SEQPACKET) the agent listens on for ztunnel, which receives the enrolled pods over it.',
    },
  ),
  ambientFlag(
    'pluginevent-uds-address',
    'string',
    '/var/run/mesh-cni/pluginevent.sock',
    "Unix socket where the agent takes the plugin's ADD of an ambient pod and enrolls it.",
    {
      path: 'file',
      details:
        "Unix socket where the agent takes the CNI plugin's ADD of an ambient pod (POST /cmdadd) and enrolls it.",
    },
  ),
  ambientFlag(
    'ambient-dns-capture',
    'bool',
    'false',
    "Send ambient pods' DNS to ztunnel (port 15053); a pod annotation may override it.",
    {
      details:
        "Send ambient pods' DNS to ztunnel (port 15053); the pod annotation ambient.mesh.io/dns-capture overrides it.",
    },
  ),
  ambientFlag(
    'ambient-reconcile-pod-rules-on-startup',
    'bool',
    'true',
    "At start-up, re-program enrolled pods' in-pod rules that differ from this version's.",
    {
      details: 'At start-up, re-program the in-pod rules of enrolled pods that differ from what this version writes.',
    },
  ),
  ambientFlag(
    'ambient-ipv6',
    'bool',
    'true',
    'Host probe rules and ipset for IPv6 too (turn off on a node without ip6tables).',
  ),
  ambientFlag(
    'host-probe-snat-ip',
    'string',
    '169.254.7.127',
    "The IPv4 address the node's probes (kubelet) to ambient pods are SNATed to.",
    {
      details:
        "The IPv4 address the node's probes (kubelet) to ambient pods are SNATed to, which their rules let through.",
    },
  ),
  ambientFlag(
    'host-probe-snat-ipv6',
    'string',
    'fd16:9254:7127:1337:ffff:ffff:ffff:ffff',
    'The IPv6 address of --host-probe-snat-ip.',
  ),
  ambientFlag(
    'kubelet-uid',
    'int',
    undefined,
    "kubelet's uid, whose connections native nftables lets past ztunnel as probes (empty: root).",
    {
      details:
        "kubelet's uid, whose connections to ambient pods the native nftables probe rule SNATs past ztunnel " +
        '(empty: 0, root, as on nearly every node; a process is never believed kubelet by its name for another ' +
        'uid, and the agent warns at start when --host-proc-dir shows a kubelet not running as root: set it ' +
        'then; docs/ambient.md "Native nftables").',
    },
  ),
  ambientFlag(
    'host-root',
    'string',
    '/host',
    "Where the host's / is mounted in the agent's container (/ when it runs on the host).",
    {
      path: 'dir',
      details:
        "Where the host's / is mounted in the agent's container: a pod netns path from the CNI plugin " +
        '(/var/run/netns/...) is opened under it (/ when the agent runs on the host).',
    },
  ),
  ambientFlag(
    'ebpf-enabled',
    'bool',
    'false',
    'eBPF redirection: always refused (gone since Istio 1.21); kept for compatibility.',
    {
      details:
        'eBPF redirection: always refused (Istio removed it in 1.21 and ztunnel no longer consumes it); kept for compatibility.',
    },
  ),
  // --- monitoring: metrics and health, and ControlZ (no env setting, as in Istio's)
  monitoringFlag('monitoring-port', 'int', '15014', 'HTTP port for /metrics, /readyz and /healthz.'),
  commonFlag(
    'ctrlz_address',
    'string',
    'localhost',
    'Address ControlZ listens on (* means all addresses).',
    'monitoring',
  ),
  commonFlag('ctrlz_port', 'int', '9876', 'Port ControlZ listens on.', 'monitoring'),
  commonFlag(
    'ctrlz_write',
    'string',
    'auto',
    'Whether ControlZ may change log levels: true, false or auto (only when on loopback alone).',
    'monitoring',
    {
      choices: CTRLZ_WRITE_MODES,
      details: 'Whether ControlZ may change log levels: auto (only when it listens on loopback alone), true or false.',
    },
  ),
  // --- common logging flags, as Istio's
  commonFlag('log_as_json', 'bool', 'false', 'Emit JSON instead of console format.', 'logging'),
  commonFlag('log_caller', 'string', undefined, 'Comma-separated scopes that include caller info.', 'logging'),
  commonFlag(
    'log_output_level',
    'string',
    'default:info',
    '<scope>:<level> pairs, comma-separated; levels none, error, warn, info, debug.',
    'logging',
  ),
  commonFlag('log_rotate', 'string', undefined, 'Path of an optional rotating log file.', 'logging', { path: 'file' }),
  commonFlag('log_rotate_max_age', 'int', '30', 'Days before a log file is rotated (0: no limit).', 'logging'),
  commonFlag('log_rotate_max_backups', 'int', '1000', 'Rotated files kept (0: no limit).', 'logging'),
  commonFlag('log_rotate_max_size', 'int', '104857600', 'Size in megabytes before a log file is rotated.', 'logging'),
  commonFlag(
    'log_stacktrace_level',
    'string',
    'default:none',
    '<scope>:<level> pairs at which stack traces are captured.',
    'logging',
  ),
  commonFlag(
    'log_target',
    'list',
    'stdout',
    'Output paths, comma-separated; stdout and stderr are special.',
    'logging',
  ),
  commonFlag('vklog', 'int', '0', 'Verbosity number of the orch client logs, like -v.', 'logging'),
];

export function findFlag(name: string): FlagSpec | undefined {
  return FLAGS.find((f) => f.name === name);
}
