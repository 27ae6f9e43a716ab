// ControlZ (issue 6). Stub until it lands.
import type { Settings } from '../config/settings.ts';
import { disabledComponent, type Component } from '../component.ts';

export interface ControlzDeps {
  /** The agent's parts, for their status. */
  readonly components: () => readonly Component[];
}

export async function startControlz(_settings: Settings, _deps: ControlzDeps): Promise<Component> {
  return disabledComponent('ctrlz');
}
