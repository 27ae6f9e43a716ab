// Baseline for the repair benchmark: the naive controller one would write first. Every second it
// lists the node's pods and labels every broken, unlabelled one at once (no rate limit, no
// concurrency bound), posting an Event for each. Same detection and client as ours.
import { CoreV1Api, KubeConfig, PatchStrategy, setHeaderOptions } from '@kubernetes/client-node';
import { buildSettings } from '../../../src/config/settings.ts';
import { detectBroken, hasLabel } from '../../../src/repair/detect.ts';

const [orchconfig, node] = process.argv.slice(2) as [string, string];
const s = buildSettings(
  { 'repair-enabled': true, 'repair-label-pods': true, 'repair-node-name': node, orchconfig },
  {},
).repair;
const kc = new KubeConfig();
kc.loadFromFile(orchconfig);
const core = kc.makeApiClient(CoreV1Api);
const tick = async () => {
  const list = await core.listPodForAllNamespaces({ fieldSelector: `spec.nodeName=${node}` });
  await Promise.all(
    list.items
      .filter((p) => detectBroken(p, s) && !hasLabel(p, s.labelKey, s.labelValue))
      .map(async (p) => {
        const { name, namespace, uid } = p.metadata as { name: string; namespace: string; uid: string };
        await core.patchNamespacedPod(
          { name, namespace, body: { metadata: { labels: { [s.labelKey]: s.labelValue } } } },
          setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
        );
        await core.createNamespacedEvent({
          namespace,
          body: {
            metadata: { generateName: `${name}.` },
            involvedObject: { kind: 'Pod', name, namespace, uid },
            reason: 'Repair',
            message: 'broken',
            type: 'Warning',
          },
        });
      }),
  );
};
const loop = async () => {
  for (;;) {
    await tick().catch((e: unknown) => console.error(String(e)));
    await new Promise((r) => setTimeout(r, 1000));
  }
};
void loop();
process.on('SIGTERM', () => process.exit(0));
