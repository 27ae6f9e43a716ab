// The records we keep beside our files in the net dir, so that an agent restarted any number of
// times (every upgrade is one) still knows what it did:
//  - `.<conflist>.mesh-original`: the primary CNI's .conf we made that conflist from, byte for
//    byte (and as the link it was, when it was one), given back on uninstall;
//  - `.<owned>.mesh-from`: the name of the primary our owned file (owned.ts) was made from.
// Hidden, and no config extension: no runtime reads them. The net dir is writable by others, so a
// record is taken as a claim and checked before use (parseOriginal, parseOwnedFrom).
//
// Pure: names, texts and checks. The planner (plan*.ts) reads and writes them through its view.

import { createHash } from 'node:crypto';
import path from 'node:path';
import { isConfigFile, otherForm, withoutOurEntry } from './cniconfig.ts';

/** What we replaced, to give the primary CNI's exact bytes back on cleanup. */
export interface Original {
  readonly name: string;
  readonly text: string;
  /** A .conf that was a symbolic link (to this): given back as the link, not as a copy. */
  readonly link?: string;
  readonly mode: number;
  readonly uid: number;
  readonly gid: number;
  /** sha256 of what we wrote; the record holds only while the file still has it. */
  readonly written: string;
}

export const sha256 = (s: string): string => createHash('sha256').update(s).digest('hex');

const ORIGINAL_SUFFIX = '.mesh-original';
/** Beside our owned file (hidden): the name of the primary it was made from. */
const OWNED_FROM_SUFFIX = '.mesh-from';
/** A record's mode, without the bits no CNI config needs (exec, setuid, group/other write). */
const RECORD_MODE_MASK = 0o644;
/** Both kinds of record are written for root alone. */
export const RECORD_FILE_MODE = 0o600;

/** The record of the .conf that the conflist `conflist` was made from. */
export const originalRecord = (conflist: string): string => `.${conflist}${ORIGINAL_SUFFIX}`;
export const isOriginalRecord = (name: string): boolean => name.startsWith('.') && name.endsWith(ORIGINAL_SUFFIX);

/** The record beside an owned file of ours named `owned`. */
export const ownedFromRecord = (owned: string): string => `.${owned}${OWNED_FROM_SUFFIX}`;

/** The owned file a `.<name>.mesh-from` record is kept for; null for any other name. */
export function ownedOfRecord(record: string): string | null {
  return record.startsWith('.') && record.endsWith(OWNED_FROM_SUFFIX)
    ? record.slice(1, -OWNED_FROM_SUFFIX.length)
    : null;
}

/** A .mesh-from record's text. */
export const formatOwnedFrom = (from: string): string => `${from}\n`;

/**
 * The primary a .mesh-from record beside `owned` names. The record is only a config file name in
 * this dir, and the worst a planted one does is keep ours as it is, not ready, or for a grace time.
 */
export function parseOwnedFrom(text: string | null, owned: string): string | null {
  const name = text?.trim() ?? '';
  const ok = isConfigFile(name) && !name.includes('/') && !name.startsWith('.') && name !== owned;
  return ok ? name : null;
}

/**
 * A .mesh-original record beside the conflist `name`, as a claim: only for the .conf this
 * conflist was made from (the one record we write), with a config file's mode bits at most, and
 * an owner that is the conflist's (`owner`) or root. Undefined when it does not hold.
 */
export function parseOriginal(
  text: string | null,
  name: string,
  owner: { uid: number; gid: number },
): Original | undefined {
  if (text === null) return undefined;
  try {
    const o = JSON.parse(text) as Partial<Original>;
    const ok =
      path.extname(name) === '.conflist' &&
      o.name === otherForm(name) &&
      typeof o.text === 'string' &&
      typeof o.written === 'string' &&
      typeof o.mode === 'number' &&
      typeof o.uid === 'number' &&
      typeof o.gid === 'number' &&
      (o.link === undefined || typeof o.link === 'string');
    if (!ok) return undefined;
    const r = o as Original;
    const known = (id: number, own: number) => id === own || id === 0;
    const uid = known(r.uid, owner.uid) ? r.uid : owner.uid;
    const gid = known(r.gid, owner.gid) ? r.gid : owner.gid;
    return { ...r, mode: r.mode & RECORD_MODE_MASK, uid, gid };
  } catch {
    return undefined;
  }
}

export const formatOriginal = (o: Original): string => JSON.stringify(o);

/**
 * What to give back on uninstall once `text` (now in `name`) is replaced by `written`. Never a
 * text with an entry of ours (one of an earlier version or run, or another log level): `prior`
 * (the record a run before us left), while the file is still as that run wrote it, else the text
 * with every entry of ours taken out.
 */
export function originalFor(
  prior: Original | undefined,
  name: string,
  text: string,
  st: { mode: number; uid: number; gid: number },
  written: string,
): Original {
  if (prior && prior.written === sha256(text)) return { ...prior, written: sha256(written) };
  let clean = text;
  try {
    clean = withoutOurEntry(text, name) ?? text;
  } catch {
    // withOurEntry parsed it already; keep the text as it came.
  }
  return { name, text: clean, mode: st.mode & 0o7777, uid: st.uid, gid: st.gid, written: sha256(written) };
}
