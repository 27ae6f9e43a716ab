// The plugin log server on --log-uds-address (issue 6). Stub until it lands.
import type { Settings } from '../config/settings.ts';
import { disabledComponent, type Component } from '../component.ts';

export async function startPluginLogServer(_settings: Settings): Promise<Component> {
  return disabledComponent('plugin-log-server');
}
