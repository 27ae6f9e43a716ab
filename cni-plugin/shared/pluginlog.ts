// Wire format of the plugin log socket (the agent's --log-uds-address, the entry's
// "log_uds_address"): written by cni-plugin/log/udslog.ts, read by src/monitoring/logserver.ts
// and pluginrecord.ts, which print each record in scope `cni`.
//   - a SOCK_STREAM unix socket; the plugin connects once per invocation, writes its lines and
//     closes (end of stream = end of that invocation's logs);
//   - UTF-8, one JSON object per line, '\n'-terminated, never more than PLUGIN_LOG_MAX_LINE
//     bytes per line (a longer record is sent with its message cut and `truncated: true`);
//   - the fields of PluginLogRecord, always present, plus message-specific flat JSON values
//     (e.g. "reason", "attempt", "elapsedMs");
//   - lines below the entry's `log_level` are not sent.
// The agent also reads other senders' spellings (`message`, `pod_namespace`/`pod_name`,
// `container_id`, more level names): see pluginrecord.ts.

import type { EmitLevel } from './loglevels.ts';

/** Longest line the plugin sends (the agent accepts longer ones, up to its own limit). */
export const PLUGIN_LOG_MAX_LINE = 16 * 1024;

/** The log scope the agent prints plugin records in; also each record's `scope`. */
export const PLUGIN_LOG_SCOPE = 'cni';

/** One line's record; extra flat fields follow these. */
export interface PluginLogRecord {
  /** RFC 3339 UTC with milliseconds, "2026-01-02T03:04:05.678Z". */
  readonly time: string;
  readonly level: EmitLevel;
  readonly msg: string;
  readonly scope: typeof PLUGIN_LOG_SCOPE;
  /** CNI_COMMAND: "ADD" | "DEL" | "CHECK" | ... */
  readonly command: string;
  /** CNI_CONTAINERID, "" when unknown. */
  readonly containerID: string;
  /** null when CNI_ARGS named no pod. */
  readonly pod: { readonly namespace: string; readonly name: string } | null;
  readonly [field: string]: unknown;
}
