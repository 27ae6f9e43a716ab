// Every command the docs show works today: each fenced shell block of README.md and docs/**/*.md
// says where it can run (test/helpers/docs-blocks.ts has the markers and the `$ ` convention), and
// each `run` block runs here, as root with no cluster, from the repository root with a HOME,
// TMPDIR and MESH_SANDBOX_DIR of its own, and must exit 0 and print what the docs show.

import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import {
  blocksOf,
  docFiles,
  outputMismatch,
  runBlock,
  shellBlocks,
  unmarked,
  where,
  type Block,
} from '../helpers/docs-blocks.ts';
import { eventually } from '../helpers/poll.ts';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const FIXTURES = 'test/node/fixtures/docs-blocks';
/** A block that takes longer than this is `slow`. */
const BLOCK_TIMEOUT_MS = 60_000;

const fixture = (name: string) =>
  shellBlocks(`${FIXTURES}/${name}`, readFileSync(path.join(ROOT, FIXTURES, name), 'utf8'));
const at = (blocks: readonly Block[], line: number) => blocks.find((b) => b.line === line)!;
const runHere = (b: Block, timeoutMs = BLOCK_TIMEOUT_MS) => runBlock(b, { root: ROOT, timeoutMs });

describe('the docs test, on fixtures', () => {
  it('finds the shell blocks with their markers, indented ones too, and leaves other blocks alone', () => {
    const blocks = fixture('marked.md');
    assert.deepEqual(
      blocks.map((b) => [where(b), b.lang, b.marker]),
      [
        [`${FIXTURES}/marked.md:6`, 'sh', 'run'],
        [`${FIXTURES}/marked.md:16`, 'bash', 'slow'],
        [`${FIXTURES}/marked.md:21`, 'console', 'cluster'],
        [`${FIXTURES}/marked.md:38`, 'shell', 'run'],
      ],
    );
    assert.equal(at(blocks, 38).body, 'echo indented');
    assert.deepEqual(unmarked(blocks), []);
  });

  it('names each block with no marker right above it, or an unknown one, by file:line', () => {
    assert.deepEqual(unmarked(fixture('unmarked.md')), [
      `${FIXTURES}/unmarked.md:3: no <!-- docs-test: run|slow|cluster --> on the line above this \`\`\`sh block`,
      `${FIXTURES}/unmarked.md:8: unknown marker "docs-test: sometimes" (run, slow or cluster)`,
      `${FIXTURES}/unmarked.md:14: no <!-- docs-test: run|slow|cluster --> on the line above this \`\`\`sh block`,
    ]);
  });

  it('runs a block with its own HOME, TMPDIR and sandbox, node 24, kustomize and the bins on PATH', async () => {
    for (const b of fixture('marked.md').filter((b) => b.marker === 'run')) assert.equal(await runHere(b), null);
  });

  it('runs only the `$ ` lines of a prompted block and checks the output shown under each', async () => {
    const [shown, notRun] = fixture('prompts.md');
    assert.deepEqual(
      shown!.commands!.map((c) => [c.line, c.text, c.output]),
      [
        [5, 'echo one', ['one']],
        [
          7,
          `sh -c 'echo "install-cni: invalid value \\"x\\" for --flag: expected a number" >&2; exit 2'`,
          ['install-cni: invalid value "x" for --flag: ...'],
        ],
        [9, 'echo continued \\\n    over two lines', ['continued over two lines']],
        [12, "printf 'first\\nsecond\\nthird\\n'", ['first', 'third']],
        [15, 'true', []],
      ],
    );
    assert.equal(await runHere(shown!), null);
    assert.equal(await runHere(notRun!), null);
    assert.equal(outputMismatch(['third', 'first'], 'first\nthird\n'), 'first', 'shown lines match in order');
    assert.equal(outputMismatch(['fir'], 'first\n'), 'fir', 'a shown line matches a whole line');
  });

  it('reports a failing block by file:line with what it printed, and removes its HOME', async () => {
    const blocks = fixture('failing.md');
    const failed = await runHere(at(blocks, 4));
    assert.match(failed ?? '', new RegExp(`^${FIXTURES}/failing.md:4 \\(\`\`\`sh, docs-test: run\\) exited 1:\n`));
    assert.match(failed!, /about to fail/);
    assert.doesNotMatch(failed!, /not reached/);
    const home = /home (\S+)/.exec(failed!)![1]!;
    assert.equal(existsSync(home), false, `${home} left behind`);
  });

  it('reports a prompted command by its line: other output than shown, or a failure with none shown', async () => {
    const blocks = fixture('failing.md');
    assert.match(
      (await runHere(at(blocks, 12))) ?? '',
      new RegExp(
        `^${FIXTURES}/failing.md:13: \`echo two\` \\(exit 0\\) did not print the line the docs show\n  three\n`,
      ),
    );
    assert.equal(
      await runHere(at(blocks, 18)),
      `${FIXTURES}/failing.md:20: \`sh -c 'echo broken >&2; exit 3'\` exited 3:\nbroken\n`,
    );
  });

  it('ends what a block left running, and a block over its time', async () => {
    const blocks = fixture('failing.md');
    const left = await runHere(at(blocks, 25));
    const pid = Number(/pid (\d+)/.exec(left ?? '')?.[1]);
    assert.ok(pid > 0, `no pid in ${left}`);
    const alive = () => {
      try {
        process.kill(pid, 0);
        return !readFileSync(`/proc/${pid}/stat`, 'utf8').includes(') Z ');
      } catch {
        return false;
      }
    };
    await eventually(() => !alive(), `the block's background sleep ${pid} ended`);
    assert.match((await runHere(at(blocks, 32), 1000)) ?? '', /failing.md:32 .* did not finish in 1000 ms/);
  });
});

describe('the shell blocks of README.md and docs/', () => {
  const blocks = blocksOf(ROOT, docFiles(ROOT));

  it('each say where they can run (<!-- docs-test: run|slow|cluster --> right above)', () => {
    const problems = unmarked(blocks);
    assert.deepEqual(problems, [], `${problems.length} shell blocks without a docs-test marker`);
  });

  for (const b of blocks) {
    const name = `${where(b)} (${b.marker ?? 'unmarked'})`;
    if (b.marker === 'run')
      it(name, async () => {
        const failed = await runHere(b);
        assert.equal(failed, null, failed ?? '');
      });
    else it(name, { skip: b.marker === null ? 'no marker' : `docs-test: ${b.marker}` }, () => {});
  }
});
