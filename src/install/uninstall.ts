// Whether stopping means uninstall (take our entry, orchconfig and binary off the node) or a
// restart/upgrade (leave them, so no pod starts unredirected while the new agent comes up).
// --cleanup-on-exit=auto asks the API server whether our DaemonSet still exists and is not
// being deleted; when it cannot tell, it cleans up, as the spec says.

import { AppsV1Api, CoreV1Api } from '@kubernetes/client-node';
import type { Settings } from '../config/settings.ts';
import { orchKubeConfig, withTimeout } from '../orch/client.ts';

export interface CleanupDecision {
  readonly cleanup: boolean;
  readonly why: string;
}

const ASK_TIMEOUT_MS = 5000;

function statusCode(e: unknown): number | undefined {
  const code = (e as { code?: unknown }).code;
  return typeof code === 'number' ? code : undefined;
}

export async function decideCleanup(settings: Settings): Promise<CleanupDecision> {
  const mode = settings.install.cleanupOnExit;
  if (mode === 'always') return { cleanup: true, why: '--cleanup-on-exit=always' };
  if (mode === 'never') return { cleanup: false, why: '--cleanup-on-exit=never' };
  const { podName, podNamespace } = settings.env;
  if (!podName || !podNamespace) {
    return { cleanup: true, why: 'POD_NAME/POD_NAMESPACE are not set, so whether our DaemonSet still exists cannot be asked' };
  }
  try {
    const kc = orchKubeConfig(settings);
    const pod = await withTimeout(kc.makeApiClient(CoreV1Api).readNamespacedPod({ name: podName, namespace: podNamespace }), ASK_TIMEOUT_MS, `reading pod ${podNamespace}/${podName}`);
    const owner = pod.metadata?.ownerReferences?.find((o) => o.kind === 'DaemonSet');
    if (!owner) return { cleanup: true, why: `pod ${podNamespace}/${podName} is not owned by a DaemonSet` };
    let ds;
    try {
      ds = await withTimeout(kc.makeApiClient(AppsV1Api).readNamespacedDaemonSet({ name: owner.name, namespace: podNamespace }), ASK_TIMEOUT_MS, `reading DaemonSet ${podNamespace}/${owner.name}`);
    } catch (e) {
      if (statusCode(e) === 404) return { cleanup: true, why: `DaemonSet ${podNamespace}/${owner.name} is gone: uninstall` };
      throw e;
    }
    if (ds.metadata?.deletionTimestamp) return { cleanup: true, why: `DaemonSet ${podNamespace}/${owner.name} is being deleted: uninstall` };
    return { cleanup: false, why: `DaemonSet ${podNamespace}/${owner.name} still exists: a restart or upgrade, keeping the plugin in place` };
  } catch (e) {
    return { cleanup: true, why: `cannot ask the API server whether our DaemonSet still exists (${(e as Error).message})` };
  }
}
