// The repair controller (issue 5). Stub until it lands.
import type { Settings } from '../config/settings.ts';
import { disabledComponent, type Component } from '../component.ts';

export async function startRepair(_settings: Settings): Promise<Component> {
  return disabledComponent('repair');
}
