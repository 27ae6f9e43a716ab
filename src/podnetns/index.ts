// "Enter a running pod's netns": find it from the host's /proc by pod UID and IP, hold it by fd,
// run programs in it (nsenter with the fd; the agent's own threads never setns). Used by repair
// in place and ambient enrollment. docs/repair.md: "Finding a running pod's network
// namespace".

export { podUidFromCgroup } from './cgroup.ts';
export { openNetns, type HeldNetns, type NsId } from './held.ts';
export {
  findPodNetns,
  findPodsNetns,
  hostNetnsId,
  type FindFailure,
  type FindResult,
  type PodNetnsOptions,
  type PodToFind,
} from './find.ts';
export { runInNetns, type RunOptions, type RunResult } from './run.ts';
export { withSbinDirs } from './program.ts';
export { netnsAddresses } from './addresses.ts';
