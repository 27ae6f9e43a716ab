// The installer's entry for the agent.
import type { Component } from '../component.ts';
import type { Settings } from '../config/settings.ts';
import { Installer } from './installer.ts';

export async function startInstaller(settings: Settings): Promise<Component> {
  const installer = new Installer(settings);
  await installer.start();
  return installer;
}
