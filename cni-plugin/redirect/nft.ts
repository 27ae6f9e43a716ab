// Native nftables in a netns through a runner: one `inet` table of ours per job (a pod's rules,
// the node's probe path), written whole in one `nft -f -` transaction and read back as JSON.
// Like iptables.ts, nothing here starts a process: the runner does (the plugin's nsenter, the
// agent's netns by fd), so both bundles import it.
//
// What is ours: a table named mesh_* that holds our owner set (OWNER_SET, its comment
// `mesh-cni <digest>`). A table of our name without it was not written by us (another tool, a
// hand-made test, a pod's own NET_ADMIN container): it is refused, never replaced or deleted, so
// nothing of someone else's is lost on a name clash; the error says how to remove it by hand.
// The marker is a set, not the table's comment (which we write too, for people reading `nft list
// ruleset`), because nft 1.0.6's JSON leaves table and chain comments out.
//
// Every transaction is atomic in the kernel: a pod sees all of its old table or all of its new
// one, never half. A first write is `create table` (fails if anything holds the name); a rewrite
// deletes the table we read by its handle and adds the new one in the same transaction, so a
// table someone made in between (another handle) fails the whole transaction instead of going.

import { NetnsError, type NetnsRunner, type RunResult } from './iptables.ts';

/** Our tables' names: `mesh_` first, so `nft list tables` says whose they are. */
const TABLE_NAME = /^mesh_[a-z0-9_]{1,58}$/;

/** The set in each table of ours that says it is ours (and which body it holds). */
export const OWNER_SET = 'mesh_cni_owner';
const OWNER_MARK = 'mesh-cni';

export class NftError extends NetnsError {
  /** Retrying cannot help (no nft, nft without JSON, a table of our name not ours): tell a person. */
  readonly permanent: boolean;
  constructor(message: string, permanent = false) {
    super(message);
    this.permanent = permanent;
  }
}

// ---- the body: what the caller hands us for inside `table inet <name> { ... }` ----

export interface BodyShape {
  /** Chain name -> rules in it, in order (one rule per statement). */
  readonly chains: ReadonlyMap<string, number>;
  readonly sets: readonly string[];
}

/** `text` with quoted strings blanked (kept as ""), and `#` comments cut. */
function unquoted(line: string): string {
  return line.replace(/"[^"]*"/g, '""').replace(/#.*$/, '');
}

/** Whether `line` ends inside a quoted string (a `#` outside quotes starts a comment). */
function quoteLeftOpen(line: string): boolean {
  let open = false;
  for (const c of line) {
    if (c === '"') open = !open;
    else if (c === '#' && !open) break;
  }
  return open;
}

function braces(text: string): number {
  let d = 0;
  for (const c of text) d += c === '{' ? 1 : c === '}' ? -1 : 0;
  return d;
}

/** Statements of a chain line (`type ...; policy accept;`), split at `;` outside braces. */
function statements(line: string): string[] {
  const out: string[] = [];
  let depth = 0;
  let cur = '';
  for (const c of line) {
    if (c === ';' && depth === 0) {
      out.push(cur.trim());
      cur = '';
      continue;
    }
    depth += c === '{' ? 1 : c === '}' ? -1 : 0;
    cur += c;
  }
  out.push(cur.trim());
  return out.filter((s) => s !== '');
}

/**
 * Checks a table body as the renderer writes it, and tells its chains and sets: at the top only
 * `chain NAME {` / `set NAME {` / `map NAME {` blocks (each header and each chain's closing `}` on
 * a line of its own); in a chain, `type`/`policy`/`comment` or one rule per statement, and every
 * rule has a `counter` (the counters are how anyone sees which of our rules traffic took). The
 * braces never close more than they opened, so nothing in a body reaches outside our table; no
 * quoted string spans lines, and nothing reaches outside nft (no `include`, `define`, `$var`).
 */
export function checkBody(body: string): BodyShape {
  const chains = new Map<string, number>();
  const sets: string[] = [];
  let chain: string | null = null;
  let depth = 0;
  const bad = (n: number, why: string) => new NftError(`nft table body line ${n}: ${why}`);
  body.split('\n').forEach((raw, i) => {
    const n = i + 1;
    // nft's quoted string runs to the next `"`, newlines and all: one left open here would have
    // nft read the lines below differently from this check.
    if (quoteLeftOpen(raw)) throw bad(n, `a quoted string must close on its own line: ${raw.trim()}`);
    const line = unquoted(raw).trim();
    if (line === '') return;
    // Run as the node's root, nft reads the file an `include` names (in any block, and prints its
    // first line in the syntax error) and expands `define`d `$variables`: no body of ours has any.
    if (/(^|[^A-Za-z0-9_])(include|define|redefine|undefine)([^A-Za-z0-9_]|$)|\$/.test(line))
      throw bad(n, `include, define and $variables are not for our tables: ${raw.trim()}`);
    if (depth === 0) {
      const m = /^(chain|set|map) ([A-Za-z][A-Za-z0-9_-]{0,62}) \{(.*)$/.exec(line);
      if (!m) throw bad(n, `expected "chain NAME {", "set NAME {" or "map NAME {", found: ${raw.trim()}`);
      const [, kind, name, rest] = m;
      if (name === OWNER_SET) throw bad(n, `${OWNER_SET} is the applier's own set`);
      if (kind === 'chain') {
        if (rest!.trim() !== '') throw bad(n, `put what chain ${name!} holds on the lines after its "{"`);
        if (chains.has(name!)) throw bad(n, `chain ${name!} is declared twice`);
        chains.set(name!, 0);
        chain = name!;
      } else {
        sets.push(name!);
      }
      depth = 1 + braces(rest!);
      if (depth < 0) throw bad(n, 'more "}" than "{"');
      return;
    }
    if (chain !== null && depth === 1) {
      if (line === '}') {
        chain = null;
        depth = 0;
        return;
      }
      for (const s of statements(line)) {
        if (/^(type|policy|comment|devices) /.test(s)) continue;
        if (braces(s) !== 0) throw bad(n, `one rule per line, its braces closed on it: ${raw.trim()}`);
        if (!/(^|\s)counter(\s|$)/.test(s)) throw bad(n, `rule without a counter (every rule of ours has one): ${s}`);
        chains.set(chain, chains.get(chain)! + 1);
      }
      return;
    }
    depth += braces(line);
    if (depth < 0) throw bad(n, 'more "}" than "{"');
  });
  if (depth !== 0) throw new NftError(`nft table body: ${depth} "{" never closed`);
  return { chains, sets };
}

/** FNV-1a 64 of the body's lines (trimmed): which body a table of ours holds, in its owner set. */
export function bodyDigest(body: string): string {
  let h = 0xcbf29ce484222325n;
  const text = body
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l !== '')
    .join('\n');
  for (const b of new TextEncoder().encode(text)) h = ((h ^ BigInt(b)) * 0x100000001b3n) & 0xffffffffffffffffn;
  return h.toString(16).padStart(16, '0');
}

function checkName(name: string): void {
  if (!TABLE_NAME.test(name)) {
    throw new NftError(`nft table name "${name}" is not ours: our tables are mesh_ + lower-case letters, digits, _`);
  }
}

/**
 * The table whole: created with our comment, then filled with our owner set and the body. Two
 * commands because nft 1.0.6's `create table X { ... }` makes the table and its comment but
 * drops what the block holds, and `add table` on a table there does not set its comment.
 */
function tableCommands(name: string, body: string, digest: string): string[] {
  return [
    `create table inet ${name} { comment "written by ${OWNER_MARK}; it removes it"; }`,
    [
      `add table inet ${name} {`,
      `\tset ${OWNER_SET} {`,
      '\t\ttype mark',
      `\t\tcomment "${OWNER_MARK} ${digest}"`,
      '\t}',
      body.replace(/\n+$/, ''),
      '}',
    ].join('\n'),
  ];
}

/**
 * The transaction writing `body` as table `name`: a create (which fails, whole, when anything
 * holds the name), or the table at `handle` deleted and made again in the same commit.
 */
export function tableTransaction(name: string, body: string, handle: number | null): string {
  checkName(name);
  checkBody(body);
  const table = tableCommands(name, body, bodyDigest(body));
  return [...(handle === null ? [] : [`delete table inet handle ${handle}`]), ...table].join('\n') + '\n';
}

// ---- running nft ----

function nftFailed(runner: NetnsRunner, what: string, r: RunResult): NftError {
  // Not there: the runner's own spawn says ENOENT; nsenter, which execs it, exits 127.
  const missing =
    (r.error !== null && /ENOENT|not found/.test(r.error)) ||
    (r.error === null && r.code === 127 && /failed to execute|No such file/.test(r.stderr));
  if (missing || r.error !== null) {
    return new NftError(
      missing
        ? `cannot run nft ${runner.where} (${(r.error ?? r.stderr).trim()}): install nftables (nft >= 1.0) on the node`
        : `${what} ${runner.where}: ${r.error}`,
      missing,
    );
  }
  if (r.code === null) {
    return new NftError(`${what} ${runner.where} was killed by a signal before it finished (did nft crash?)`);
  }
  const text = r.stderr.trim() || r.stdout.trim() || 'no output';
  return new NftError(`${what} ${runner.where} failed (exit ${r.code}): ${text}`);
}

async function nft(
  runner: NetnsRunner,
  args: readonly string[],
  input: string | null,
  blocking = false,
): Promise<RunResult> {
  return runner.run(['nft', ...args], { input, stdout: input === null, blocking });
}

/** Runs a transaction; nothing of it is in the kernel when this throws (nft's commit is atomic). */
async function transact(runner: NetnsRunner, doc: string, blocking = false): Promise<void> {
  const r = await nft(runner, ['-f', '-'], doc, blocking);
  if (r.error !== null || r.code !== 0) throw nftFailed(runner, 'nft -f -', r);
}

// ---- reading: `nft -j list table inet <name>` ----

export interface NftRuleState {
  readonly handle: number;
  readonly counter: boolean;
  readonly comment: string | null;
  /** The rule's expressions as nft's JSON gives them. */
  readonly expr: readonly unknown[];
}

export interface NftSetState {
  readonly type: string;
  /** Element (as nft prints it) -> its comment ('' for none). */
  readonly elements: ReadonlyMap<string, string>;
}

export interface NftTableState {
  readonly handle: number;
  /** The digest in our owner set; null: no owner set, the table is not ours. */
  readonly digest: string | null;
  readonly chains: ReadonlyMap<string, readonly NftRuleState[]>;
  readonly sets: ReadonlyMap<string, NftSetState>;
}

const NO_JSON = /JSON support not compiled|unrecognized option|invalid option|unknown option/i;
// nft's own answer for a table that is not there (exit 1), not nsenter's for a missing nft (exit 127)
const ABSENT = /^Error: No such file or directory$/m;

function elementsOf(elem: unknown): Map<string, string> {
  const out = new Map<string, string>();
  if (!Array.isArray(elem)) return out;
  for (const e of elem) {
    if (typeof e === 'string' || typeof e === 'number') out.set(String(e), '');
    const inner = (e as { elem?: { val?: unknown; comment?: unknown } } | null)?.elem;
    if (inner && (typeof inner.val === 'string' || typeof inner.val === 'number')) {
      out.set(String(inner.val), typeof inner.comment === 'string' ? inner.comment : '');
    }
  }
  return out;
}

/** Our table's state from `nft -j list table inet <name>` output. */
export function parseTableJson(name: string, text: string): NftTableState {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    throw new NftError(`nft -j list table inet ${name} printed no JSON (${(e as Error).message})`, true);
  }
  const items = (doc as { nftables?: unknown } | null)?.nftables;
  if (!Array.isArray(items))
    throw new NftError(`nft -j list table inet ${name}: no "nftables" array in its JSON`, true);
  let handle: number | null = null;
  let digest: string | null = null;
  const chains = new Map<string, NftRuleState[]>();
  const sets = new Map<string, NftSetState>();
  const rules: [string, NftRuleState][] = [];
  for (const item of items as Record<string, Record<string, unknown>>[]) {
    const t = item.table;
    if (t && t.family === 'inet' && t.name === name && typeof t.handle === 'number') handle = t.handle;
    const s = item.set;
    if (s && s.table === name && typeof s.name === 'string') {
      sets.set(s.name, { type: String(s.type), elements: elementsOf(s.elem) });
      const m = new RegExp(`^${OWNER_MARK} ([0-9a-f]{16})$`).exec(typeof s.comment === 'string' ? s.comment : '');
      if (s.name === OWNER_SET && m) digest = m[1]!;
    }
    const c = item.chain;
    if (c && c.table === name && typeof c.name === 'string' && !chains.has(c.name)) chains.set(c.name, []);
    const r = item.rule;
    if (r && r.table === name && typeof r.chain === 'string') {
      const expr = Array.isArray(r.expr) ? (r.expr as unknown[]) : [];
      rules.push([
        r.chain,
        {
          handle: typeof r.handle === 'number' ? r.handle : -1,
          counter: expr.some((x) => x !== null && typeof x === 'object' && 'counter' in x),
          comment: typeof r.comment === 'string' ? r.comment : null,
          expr,
        },
      ]);
    }
  }
  if (handle === null) throw new NftError(`nft -j list table inet ${name}: the table is not in its JSON`, true);
  for (const [chain, rule] of rules) (chains.get(chain) ?? chains.set(chain, []).get(chain)!).push(rule);
  return { handle, digest, chains, sets };
}

/** What is in table `name` now; null when there is no such table. Reads once: never retries. */
export async function readTable(runner: NetnsRunner, name: string): Promise<NftTableState | null> {
  checkName(name);
  const what = `nft -j list table inet ${name}`;
  const r = await nft(runner, ['-j', 'list', 'table', 'inet', name], null);
  if (r.error === null && r.code === 1 && ABSENT.test(r.stderr)) return null;
  if (r.error === null && r.code === 1 && NO_JSON.test(r.stderr)) {
    throw new NftError(
      `${what} ${runner.where}: this nft cannot print JSON (${r.stderr.trim()}); ` +
        'native nftables mode reads its tables as JSON: install an nft built with JSON support (Debian, Fedora and Alpine ship one)',
      true,
    );
  }
  if (r.error !== null || r.code !== 0) throw nftFailed(runner, what, r);
  return parseTableJson(name, r.stdout);
}

/** The refusal of a table of our name that is not ours (no owner set). */
export function foreignTable(runner: NetnsRunner, name: string): NftError {
  return new NftError(
    `table inet ${name} ${runner.where} was not written by mesh-cni (it has no ${OWNER_SET} set): left as it is. ` +
      `If it is a leftover, remove it with \`nft delete table inet ${name}\`; if another tool owns it, ` +
      'that tool and mesh-cni cannot share the name',
    true,
  );
}

/** What differs between table `have` and what `body` makes (its shape and digest); [] when none. */
export function tableDrift(body: string, have: NftTableState): string[] {
  const want = checkBody(body);
  const out: string[] = [];
  if (have.digest !== bodyDigest(body)) out.push(`it holds another body (digest ${have.digest ?? 'none'})`);
  for (const [chain, rules] of want.chains) {
    const there = have.chains.get(chain);
    if (there === undefined) out.push(`chain ${chain} missing`);
    else if (there.length !== rules) out.push(`chain ${chain} has ${there.length} rules, not ${rules}`);
  }
  for (const chain of have.chains.keys()) if (!want.chains.has(chain)) out.push(`chain ${chain} unexpected`);
  for (const set of want.sets) if (!have.sets.has(set)) out.push(`set ${set} missing`);
  for (const [chain, rules] of have.chains) {
    if (rules.some((r) => !r.counter)) out.push(`chain ${chain} has a rule without a counter`);
  }
  return out;
}

// ---- applying and removing ----

/**
 * ADD: table `name` becomes `body`, whole, in one transaction. On a netns without it (every first
 * ADD) one `nft -f -`; when it is there (a second ADD), read and replaced whole: our own, by the
 * handle read; someone else's of our name, refused.
 */
export async function applyTable(
  runner: NetnsRunner,
  name: string,
  body: string,
  blocking = false,
): Promise<'created' | 'replaced'> {
  const create = tableTransaction(name, body, null);
  try {
    await transact(runner, create, blocking);
    return 'created';
  } catch (first) {
    // Only "the name is taken" is worth a read; anything else (the body refused, nft gone,
    // killed) is the answer as it is.
    if (!(first instanceof NftError) || !/File exists/.test(first.message)) throw first;
    const have = await readTable(runner, name);
    if (have === null) throw first;
    if (have.digest === null) throw foreignTable(runner, name);
    await transact(runner, tableTransaction(name, body, have.handle));
    return 'replaced';
  }
}

/**
 * A table that has been there a while (in-place repair): read first, written only when it
 * differs (tableDrift). `created`: none there; `replaced`: ours, and not what `body` makes.
 */
export async function ensureTable(
  runner: NetnsRunner,
  name: string,
  body: string,
): Promise<'unchanged' | 'replaced' | 'created'> {
  checkBody(body);
  const have = await readTable(runner, name);
  if (have === null) {
    await transact(runner, tableTransaction(name, body, null));
    return 'created';
  }
  if (have.digest === null) throw foreignTable(runner, name);
  if (tableDrift(body, have).length === 0) return 'unchanged';
  await transact(runner, tableTransaction(name, body, have.handle));
  return 'replaced';
}

/**
 * DEL: table `name` out, if it is ours, by the handle read (a table made meanwhile is not
 * deleted). `absent`: nothing there; `foreign`: a table of our name not ours, left alone (a DEL
 * has nothing of ours to take out, so it is not an error; the caller logs it).
 */
export async function removeTable(runner: NetnsRunner, name: string): Promise<'removed' | 'absent' | 'foreign'> {
  const have = await readTable(runner, name);
  if (have === null) return 'absent';
  if (have.digest === null) return 'foreign';
  await transact(runner, `${deleteTableCommand(have)}\n`);
  return 'removed';
}

/** Runs a transaction the caller built (the host probe path's element changes): atomic, once. */
export function runTransaction(runner: NetnsRunner, commands: readonly string[]): Promise<void> {
  return transact(runner, commands.join('\n') + '\n');
}

/**
 * For a writer that keeps its table and edits it (the node's probe sets keep their elements):
 * the commands making table `name` ours (created if absent, with our comment) and its owner set
 * naming `digest`, in the transaction's own words. Safe on a table of ours: `add` of what is
 * there is a no-op, and the owner set is added, deleted and added again to take the new digest.
 * The caller has read the table first and refused it when it was there and not ours.
 */
export function ownerCommands(name: string, digest: string): string[] {
  checkName(name);
  if (!/^[0-9a-f]{16}$/.test(digest)) throw new NftError(`"${digest}" is not a digest (16 hex digits)`);
  return [
    `add table inet ${name} { comment "written by ${OWNER_MARK}; it removes it"; }`,
    `add set inet ${name} ${OWNER_SET} { type mark; }`,
    `delete set inet ${name} ${OWNER_SET}`,
    `add set inet ${name} ${OWNER_SET} { type mark; comment "${OWNER_MARK} ${digest}"; }`,
  ];
}

/** Table `name` out, by the handle read: for a writer that checked it is ours (digest not null). */
export function deleteTableCommand(have: NftTableState): string {
  return `delete table inet handle ${have.handle}`;
}
