// The repair controller (issue 5): finds pods that started before mesh-cni was in place on their
// node (their validation init container exited 126) and labels or deletes them, as the
// --repair-* flags say. See controller.ts for the order of actions and the rate limit.

import type { Settings } from '../config/settings.ts';
import { disabledComponent, type Component } from '../component.ts';
import { orchKubeConfig } from '../orch/client.ts';
import { clientNodeApi } from '../orch/api.ts';
import { RepairController, type RepairTiming } from './controller.ts';

export { RepairController } from './controller.ts';

export async function startRepair(settings: Settings, timing?: Partial<RepairTiming>): Promise<Component> {
  if (!settings.repair.enabled) return disabledComponent('repair');
  const controller = new RepairController({
    settings: settings.repair,
    api: clientNodeApi(orchKubeConfig(settings)),
    reporter: { host: settings.env.nodeName || settings.repair.nodeName, instance: settings.env.podName || 'mesh-cni' },
    ...(timing ? { timing } : {}),
  });
  controller.start();
  return controller;
}
