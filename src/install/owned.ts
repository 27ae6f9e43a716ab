// The owned config file (--mesh-owned-cni-config): instead of splicing our entry into the
// primary CNI's file, we write a file of our own that sorts before it, holding the primary's
// network with our entry last. The runtime reads ours; the primary CNI can rewrite its own file
// as often as it likes, and the runtime meanwhile keeps reading our previous version, which has
// our entry: there is no window in which a pod starts without mesh-cni.
//
// Pure planning only: which text and mode our file should have, given the primary's text, mode
// and name and what our file holds now. The planner's owned mode (planmodes.ts) asks it, with the
// record of the primary ours was made from (records.ts); apply.ts does the I/O.

import { DEFAULT_OWNED_NAME } from '../config/cnifiles.ts';
import { byteOrder, withOurEntry, type JsonObject } from './cniconfig.ts';
import { ownedFromRecord } from './records.ts';

/** Our file's name unless --mesh-owned-cni-config-filename says otherwise: src/config/cnifiles.ts. */
export { DEFAULT_OWNED_NAME };
/** Our file's mode unless the primary's is stricter. */
export const OWNED_MODE = 0o600;

/**
 * Our file's text: the primary's network with exactly one entry of ours, last, the primary's
 * bytes kept as the splice keeps them (cniconfig.ts withOurEntry); a .conf or .json primary is
 * wrapped into a conflist with its own name and cniVersion. Throws CniConfigError for a
 * primary the runtime would not load.
 */
export function ownedText(primaryText: string, primaryName: string, entry: JsonObject): string {
  // null: the primary already has exactly our entry, last (it was spliced there before).
  return withOurEntry(primaryText, primaryName, entry)?.text ?? primaryText;
}

/** 0600, or the primary's mode when that gives fewer rights (0400 stays 0400, 0644 becomes 0600). */
export function ownedMode(primaryMode: number): number {
  return OWNED_MODE & primaryMode & 0o777;
}

/**
 * How long a primary that vanished keeps ours as it was made from it (not ready) before a file
 * sorting after it is followed: a primary CNI that deletes its file, then writes it, is back
 * within that; one that moved to another file name is followed after it.
 */
export const PRIMARY_GONE_GRACE_MS = 2000;

/** Byte order, as libcni sorts the dir (Go's sort.Strings). */
export function sortsBefore(a: string, b: string): boolean {
  return byteOrder(a, b) < 0;
}

export interface OwnedState {
  /** Our file's name. */
  readonly ownedName: string;
  /** The primary: the first config the runtime would load, ours left out; null if none. */
  readonly primary: { readonly name: string; readonly text: string; readonly mode: number } | null;
  /** Our file now; null when it does not exist. */
  readonly current: { readonly text: string; readonly mode: number } | null;
  /** The primary our file was last made from, when known (for the message when it is gone). */
  readonly madeFrom?: string | null;
}

export type OwnedPlan =
  /** Write our file (text and/or mode differ); `from` is the primary it is made from. */
  | {
      readonly action: 'write';
      readonly text: string;
      readonly mode: number;
      readonly from: string;
      readonly notReady: readonly string[];
    }
  /** Our file is right as it is. */
  | { readonly action: 'keep'; readonly from: string | null; readonly notReady: readonly string[] }
  /**
   * The primary sorts before our file: the runtime reads it, not ours; the entry must go there
   * (splice). Once it is there that is a note, not a reason to be not ready: the runtime reads
   * a file with our entry, and a node with Multus's 00-multus.conf would never be ready.
   */
  | { readonly action: 'shadowed'; readonly by: string; readonly note: string; readonly notReady: readonly string[] }
  /** No primary and no file of ours: nothing to write yet. */
  | { readonly action: 'wait'; readonly notReady: readonly string[] };

/**
 * Why our file is not the one the runtime reads: configs it would load (other than the named
 * primary, --cni-conf-name) that sort before ours. Pods then start without mesh-cni: an error.
 */
export function shadowedBy(before: readonly string[], ownedName: string, netDir: string): string | null {
  if (before.length === 0) return null;
  const many = before.length > 1;
  return `${before.join(', ')} in ${netDir} ${many ? 'sort' : 'sorts'} before our ${ownedName}, so the runtime reads ${many ? 'the first of them' : 'it'}, not ours, and pods may start without mesh-cni; remove ${many ? 'them' : 'it'}, give --mesh-owned-cni-config-filename a name that sorts first (byte order), or run with --mesh-owned-cni-config=false`;
}

/**
 * A file at one of our own names (our owned file's, standalone mode's) that sorts before
 * `target`, the file holding our entry, and holds none itself: the runtime reads it, not ours.
 * We cannot tell we wrote it (a copy of the primary that a rollback to a version without the
 * owned file left behind, or another program's), so it is not ours to remove: an error.
 */
export function ownNameShadows(
  name: string,
  target: string,
  netDir: string,
  recordedFrom: string | null = null,
): string {
  const head = `${name} in ${netDir} holds no entry of ours and sorts before ${target}, so the runtime reads it, not our entry, and pods may start without mesh-cni`;
  // Our record beside it: most likely ours with our entry taken out by a version without the
  // owned file, of a primary that changed since (a byte-exact copy would have been removed).
  if (recordedFrom !== null)
    return `${head}; our record ${ownedFromRecord(name)} says ours was made from ${recordedFrom}, but it is no copy of ${recordedFrom} as that is now (the primary changed since?): remove ${name} and ${ownedFromRecord(name)} if they are a leftover of ours`;
  return `${head}; it has one of our file names but is not known as ours (a copy of the primary left by a version of the agent without --mesh-owned-cni-config, or another program's), so it is left as it is: remove it`;
}

/** Our owned file's name taken by a file that holds no entry of ours: never overwritten or removed. */
export function foreignOwned(
  ownedName: string,
  netDir: string,
  why = 'holds no entry of ours',
  recordedFrom: string | null = null,
): string {
  const record =
    recordedFrom === null
      ? ''
      : `; our record ${ownedFromRecord(ownedName)} says ours was made from ${recordedFrom}, but it is no copy of ${recordedFrom} as that is now (the primary changed since?): if it is a leftover of ours, remove it`;
  return `${ownedName} in ${netDir} ${why}, so we did not write it (another program's file, the primary CNI's own, or a copy left by another version of the agent): not overwriting it, and uninstall will not remove it. Remove it, or give --mesh-owned-cni-config-filename a name no other file has${record}`;
}

/**
 * What to do with our file this pass. Throws CniConfigError for a primary the runtime would
 * not load (the caller keeps our file as it is and says so).
 */
export function planOwned(s: OwnedState, entry: JsonObject, netDir: string): OwnedPlan {
  const notReady: string[] = [];
  if (s.primary === null) {
    if (s.current === null) return { action: 'wait', notReady };
    notReady.push(
      `the primary CNI config${s.madeFrom ? ` ${s.madeFrom}` : ''} our ${s.ownedName} was made from is gone from ${netDir}; keeping ours as it is, so pods still get mesh-cni with the network it had, until the primary CNI writes its config again`,
    );
    return { action: 'keep', from: null, notReady };
  }
  if (sortsBefore(s.primary.name, s.ownedName)) {
    const note = `${s.primary.name} in ${netDir} sorts before our ${s.ownedName}, so the runtime reads it, not ours; our entry is spliced into it, as with --mesh-owned-cni-config=false, so each rewrite of it by its CNI opens a window in which pods start without mesh-cni, until it is gone. Give --mesh-owned-cni-config-filename a name that sorts first (byte order) to close it`;
    return { action: 'shadowed', by: s.primary.name, note, notReady };
  }
  const text = ownedText(s.primary.text, s.primary.name, entry);
  const mode = ownedMode(s.primary.mode);
  if (s.current && s.current.text === text && (s.current.mode & 0o7777) === mode)
    return { action: 'keep', from: s.primary.name, notReady };
  return { action: 'write', text, mode, from: s.primary.name, notReady };
}
