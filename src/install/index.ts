// The installer's entry for the agent.
import type { Component } from '../component.ts';
import type { Settings } from '../config/settings.ts';
import type { PluginTokenSource } from './tokenrequest.ts';
import { Installer } from './installer.ts';

/** The orchconfig gets `pluginToken`: the plugin's own token, never the agent's. */
export async function startInstaller(settings: Settings, pluginToken: PluginTokenSource): Promise<Component> {
  const installer = new Installer(settings, { pluginToken });
  await installer.start();
  return installer;
}
