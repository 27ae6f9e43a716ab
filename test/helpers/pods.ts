// Pod objects for repair tests and benchmarks: healthy, broken by the start-up race, or not meshed.

import type { V1Pod } from '@kubernetes/client-node';
import { randomUUID } from 'node:crypto';

export interface PodSpecOptions {
  namespace?: string;
  node?: string;
  /** Carries the sidecar annotation (default true). */
  meshed?: boolean;
  /** Exit code of the validation init container; undefined: it has not run yet. */
  initExitCode?: number;
  /** Where the termination shows: the current state (default) or the last state. */
  where?: 'state' | 'lastState';
  initContainerName?: string;
  message?: string;
  labels?: Record<string, string>;
}

/** A pod as the API server shows it after kubelet ran its init container `mesh-validation`. */
export function testPod(name: string, o: PodSpecOptions = {}): V1Pod {
  const initName = o.initContainerName ?? 'mesh-validation';
  const terminated =
    o.initExitCode === undefined
      ? undefined
      : {
          exitCode: o.initExitCode,
          reason: o.initExitCode === 0 ? 'Completed' : 'Error',
          message: o.message,
          containerID: `containerd://${randomUUID()}`,
          finishedAt: new Date(),
        };
  const where = o.where ?? 'state';
  return {
    metadata: {
      name,
      namespace: o.namespace ?? 'default',
      labels: { app: name.replace(/-\d+$/, ''), ...o.labels },
      annotations: o.meshed === false ? {} : { 'sidecar.mesh.io/status': '{"initContainers":["mesh-validation"]}' },
    },
    spec: {
      nodeName: o.node ?? 'node-a',
      initContainers: [{ name: initName, image: 'mesh/proxy' }],
      containers: [
        { name: 'app', image: 'busybox' },
        { name: 'mesh-proxy', image: 'mesh/proxy' },
      ],
    },
    status: {
      phase: 'Pending',
      initContainerStatuses: [
        {
          name: initName,
          image: 'mesh/proxy',
          imageID: '',
          ready: false,
          restartCount: where === 'lastState' ? 1 : 0,
          ...(where === 'state'
            ? { state: terminated ? { terminated } : { waiting: { reason: 'PodInitializing' } } }
            : {
                state: { waiting: { reason: 'CrashLoopBackOff' } },
                ...(terminated ? { lastState: { terminated } } : {}),
              }),
        },
      ],
    },
  };
}

export const brokenPod = (name: string, o: PodSpecOptions = {}) => testPod(name, { initExitCode: 126, ...o });
