// The installer (issue 3). Stub until it lands.
import type { Settings } from '../config/settings.ts';
import { disabledComponent, type Component } from '../component.ts';

export async function startInstaller(_settings: Settings): Promise<Component> {
  return disabledComponent('install');
}
