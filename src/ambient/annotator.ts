// The pod's redirection annotation (ambient.mesh.io/redirection: enabled | pending), set by the
// dataplane as it enrolls a pod and removed as it takes the pod out. Output only: it tells others,
// and the pod's owner can write it too, so the agent never reads it back as its record of
// enrollment (docs/ambient.md "What the agent counts as enrolled"). A merge patch on
// pods/status (the agent needs pods/status patch, never pods patch), the uid as a precondition
// (a new pod that took the name is never annotated), other annotations kept.

import type { OrchApi } from '../orch/api.ts';
import { REDIRECTION_ANNOTATION } from './enablement.ts';
import type { PodAnnotator } from './dataplane.ts';

const TIMEOUT_MS = 10_000;

export function apiAnnotator(api: OrchApi): PodAnnotator {
  const annotate = api.annotatePod.bind(api);
  return {
    async setRedirection(pod, value) {
      await annotate(pod, REDIRECTION_ANNOTATION, value, AbortSignal.timeout(TIMEOUT_MS));
    },
  };
}
