// The install-cni process: logging, the monitoring server, the installer and (when enabled) the
// repair controller, started in that order and stopped in reverse on SIGTERM/SIGINT.

import type { Settings } from './config/settings.ts';
import { configureLogging, scope } from './monitoring/logging.ts';
import { startMonitoringServer, type Readiness } from './monitoring/server.ts';

const log = scope('default');

/** A long-running part of the agent. */
export interface Component {
  readonly name: string;
  /** Why this part is not ready yet; empty when it is. */
  notReadyReasons(): readonly string[];
  /** Stops the part; `signal` says why (cleanup decisions depend on it). */
  stop(signal: NodeJS.Signals): Promise<void>;
}

export async function runAgent(settings: Settings): Promise<number> {
  configureLogging(settings.logging);
  const components: Component[] = [];
  const readiness: Readiness = {
    notReadyReasons: () => (components.length === 0 ? ['starting'] : components.flatMap((c) => c.notReadyReasons())),
  };
  const monitoring = await startMonitoringServer({ port: settings.monitoring.port, readiness });

  const signal = await new Promise<NodeJS.Signals>((resolve) => {
    const onSignal = (s: NodeJS.Signals) => resolve(s);
    process.once('SIGTERM', onSignal);
    process.once('SIGINT', onSignal);
  });
  log.info('stopping', { signal });
  for (const c of [...components].reverse()) {
    try {
      await c.stop(signal);
    } catch (e) {
      log.error(`stopping ${c.name} failed`, { error: e instanceof Error ? e.message : String(e) });
    }
  }
  await monitoring.close();
  return 0;
}
