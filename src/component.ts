// The shape every long-running part of the agent has, so the agent can start, watch and stop them
// the same way, and ControlZ can show their state.

export interface Component {
  readonly name: string;
  /** Why this part is not ready yet; empty when it is. */
  notReadyReasons(): readonly string[];
  /** What an operator should know whether ready or not (shown by /readyz); none when absent. */
  notes?(): readonly string[];
  /** A small JSON-able snapshot of the part's state, for ControlZ. */
  status(): Record<string, unknown>;
  /** Stops the part; `signal` says why (cleanup decisions depend on it). */
  stop(signal: NodeJS.Signals): Promise<void>;
}

/** A part that is switched off: always ready, nothing to stop. */
export function disabledComponent(name: string): Component {
  return { name, notReadyReasons: () => [], status: () => ({ enabled: false }), stop: async () => {} };
}
