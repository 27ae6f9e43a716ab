// The ambient pods this node agent knows: pod UID -> who the pod is (for ztunnel) and its network
// namespace, held open by fd for the pod's life, so that any ztunnel that (re)connects gets every
// pod's netns in its snapshot (Istio's pod_cache.go). A null netns: the pod is known but its netns
// was not found (a snapshot names it with Keep, so ztunnel keeps what it has).
//
// Closing: an fd may be on its way to ztunnel (a snapshot being sent) when its pod goes. Closing
// it then could hand ztunnel whatever file next gets that fd number; so while anything holds the
// cache (hold()), closes wait, and happen when the last hold is released.

import type { HeldNetns } from '../podnetns/index.ts';
import type { SnapshotPod } from './ztunnelserver.ts';
import type { WorkloadInfo } from './zds.ts';

export interface CachedPod {
  readonly info: WorkloadInfo;
  readonly netns: HeldNetns | null;
}

export class PodCache {
  readonly #pods = new Map<string, CachedPod>();
  #holds = 0;
  readonly #deferred: HeldNetns[] = [];

  get size(): number {
    return this.#pods.size;
  }

  get(uid: string): CachedPod | undefined {
    return this.#pods.get(uid);
  }

  has(uid: string): boolean {
    return this.#pods.has(uid);
  }

  /** Known from now on; an entry there keeps its netns and takes the new info. */
  ensure(uid: string, info: WorkloadInfo): void {
    this.#pods.set(uid, { info, netns: this.#pods.get(uid)?.netns ?? null });
  }

  /**
   * The pod's netns is `netns`: the same namespace (dev, inode) as the one held keeps the held fd
   * (the new one is closed), another replaces it (the old one is closed). Returns the one kept.
   */
  upsert(uid: string, info: WorkloadInfo, netns: HeldNetns): HeldNetns {
    const old = this.#pods.get(uid)?.netns ?? null;
    if (old !== null && old.fd >= 0 && old.dev === netns.dev && old.ino === netns.ino) {
      if (netns !== old) netns.close(); // never handed out: nothing can be sending it
      this.#pods.set(uid, { info, netns: old });
      return old;
    }
    this.#pods.set(uid, { info, netns });
    if (old !== null && old !== netns) this.release(old);
    return netns;
  }

  /** Out of the cache; its netns (null: none) is the caller's, to release() when done with it. */
  take(uid: string): HeldNetns | null {
    const entry = this.#pods.get(uid);
    this.#pods.delete(uid);
    return entry?.netns ?? null;
  }

  /** Closes a netns that left the cache: now, or when the last hold is released. */
  release(netns: HeldNetns | null): void {
    if (netns === null) return;
    if (this.#holds > 0) this.#deferred.push(netns);
    else netns.close();
  }

  /** Closes wait until the returned function is called (once; more calls do nothing). */
  hold(): () => void {
    this.#holds++;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      if (--this.#holds === 0) for (const ns of this.#deferred.splice(0)) ns.close();
    };
  }

  /** What a new ztunnel connection is sent: Add + fd for each pod with a netns, Keep for the others. */
  snapshot(): SnapshotPod[] {
    return [...this.#pods].map(([uid, p]) => ({ uid, info: p.info, netnsFd: p.netns?.fd ?? null }));
  }

  /** UIDs of the pods known without a netns. */
  withoutNetns(): string[] {
    return [...this.#pods].filter(([, p]) => p.netns === null).map(([uid]) => uid);
  }

  /** Every pod out, every netns closed (deferred ones too): the agent is stopping. */
  clear(): void {
    for (const uid of [...this.#pods.keys()]) this.release(this.take(uid));
    for (const ns of this.#deferred.splice(0)) ns.close();
  }
}
