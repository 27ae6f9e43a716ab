// Whether stopping means uninstall (take our entry, orchconfig and binary off the node) or a
// restart/upgrade (leave them, so no pod starts unredirected while the new agent comes up).
// --cleanup-on-exit=auto asks the API server whether our DaemonSet still exists and is not
// being deleted; when it cannot tell, it cleans up, as the spec says.

import type { V1DaemonSet, V1Pod } from '@kubernetes/client-node';
import type { Settings } from '../config/settings.ts';
import { ApiError } from '../orch/errors.ts';
import { apiRequest } from '../orch/request.ts';
import { orchKubeConfig } from '../orch/client.ts';

export interface CleanupDecision {
  readonly cleanup: boolean;
  readonly why: string;
}

const ASK_TIMEOUT_MS = 5000;

export async function decideCleanup(settings: Settings): Promise<CleanupDecision> {
  const mode = settings.install.cleanupOnExit;
  if (mode === 'always') return { cleanup: true, why: '--cleanup-on-exit=always' };
  if (mode === 'never') return { cleanup: false, why: '--cleanup-on-exit=never' };
  const { podName, podNamespace } = settings.env;
  if (!podName || !podNamespace) {
    return {
      cleanup: true,
      why: 'POD_NAME/POD_NAMESPACE are not set, so whether our DaemonSet still exists cannot be asked',
    };
  }
  try {
    const kc = orchKubeConfig(settings);
    const get = <T>(apiPath: string, what: string) =>
      apiRequest<T>(kc, 'GET', apiPath, what, { signal: AbortSignal.timeout(ASK_TIMEOUT_MS) });
    const ns = encodeURIComponent(podNamespace);
    const pod = await get<V1Pod>(
      `/api/v1/namespaces/${ns}/pods/${encodeURIComponent(podName)}`,
      `reading pod ${podNamespace}/${podName}`,
    );
    const owner = pod.metadata?.ownerReferences?.find((o) => o.kind === 'DaemonSet');
    if (!owner) return { cleanup: true, why: `pod ${podNamespace}/${podName} is not owned by a DaemonSet` };
    let ds: V1DaemonSet;
    try {
      ds = await get<V1DaemonSet>(
        `/apis/apps/v1/namespaces/${ns}/daemonsets/${encodeURIComponent(owner.name)}`,
        `reading DaemonSet ${podNamespace}/${owner.name}`,
      );
    } catch (e) {
      if (e instanceof ApiError && e.code === 404)
        return { cleanup: true, why: `DaemonSet ${podNamespace}/${owner.name} is gone: uninstall` };
      throw e;
    }
    if (ds.metadata?.deletionTimestamp)
      return { cleanup: true, why: `DaemonSet ${podNamespace}/${owner.name} is being deleted: uninstall` };
    return {
      cleanup: false,
      why: `DaemonSet ${podNamespace}/${owner.name} still exists: a restart or upgrade, keeping the plugin in place`,
    };
  } catch (e) {
    return {
      cleanup: true,
      why: `cannot ask the API server whether our DaemonSet still exists (${(e as Error).message})`,
    };
  }
}
