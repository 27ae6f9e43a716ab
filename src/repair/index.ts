// The repair controller (issue 5): finds pods that started before mesh-cni was in place on their
// node (their validation init container exited 126) and labels or deletes them, as the
// --repair-* flags say. See controller.ts for the order of actions and the rate limit.

import type { Settings } from '../config/settings.ts';
import { disabledComponent, type Component } from '../component.ts';
import { orchKubeConfig } from '../orch/client.ts';
import { clientNodeApi } from '../orch/api.ts';
import { RepairController, type RepairTiming } from './controller.ts';
import { scope } from '../monitoring/logging.ts';

const log = scope('repair');

export async function startRepair(settings: Settings, timing?: Partial<RepairTiming>): Promise<Component> {
  if (!settings.repair.enabled) return disabledComponent('repair');
  if (settings.repair.nodeName === '') {
    // The seed's default, but on a DaemonSet it means every agent repairs every pod.
    log.warn('repairing pods of ALL nodes: neither --repair-node-name nor NODE_NAME is set; every agent that runs like this watches and acts on every pod of the cluster');
  }
  const controller = new RepairController({
    settings: settings.repair,
    api: clientNodeApi(orchKubeConfig(settings)),
    reporter: { host: settings.env.nodeName || settings.repair.nodeName, instance: settings.env.podName || 'mesh-cni' },
    ...(timing ? { timing } : {}),
  });
  controller.start();
  return controller;
}
