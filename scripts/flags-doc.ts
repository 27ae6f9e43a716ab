// The flag reference, docs/flags.md, written from the flag table (src/config/flags.ts): every
// install-cni flag by help group with its env setting, default, value and help, then the long
// text of the flags that have one, then the log scopes and levels --log_output_level takes.
// test/node/flags-reference.test.ts fails when the file differs from what the code gives, so the
// reference cannot drift from the flags.
//
//   node scripts/flags-doc.ts          # rewrites docs/flags.md

import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { FLAG_GROUPS, FLAGS, LOG_LEVELS, LOG_SCOPES, type FlagSpec } from '../src/config/flags.ts';

export const FLAGS_DOC = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../docs/flags.md');

const code = (s: string) => `\`${s}\``;
// Markdown would take `<scope>:<level>` for HTML and drop it.
const text = (s: string) => s.replaceAll('<', '&lt;').replaceAll('>', '&gt;');
const cell = (s: string) => text(s).replaceAll('|', '\\|').replaceAll('\n', ' ');

/** What the flag takes: its choices, else the kind of value (a path says file or dir). */
function takes(f: FlagSpec): string {
  if (f.choices) return f.choices.map(code).join(', ');
  if (f.path) return f.path === 'dir' ? 'directory' : 'path';
  return f.kind;
}

/** A heading's GitHub anchor: lower case, punctuation but `-` and `_` dropped, spaces to `-`. */
const anchor = (heading: string) =>
  heading
    .toLowerCase()
    .replace(/[^\w\- ]/g, '')
    .replaceAll(' ', '-');

export function flagsReference(): string {
  const lines = [
    '# Flags and env settings',
    '',
    '<!-- Written by `node scripts/flags-doc.ts` (or `npm run docs`) from src/config/flags.ts;',
    '     test/node/flags-reference.test.ts fails when it differs. Edit the flag table and run the script again. -->',
    '',
    'Every flag `install-cni` takes, by the group `install-cni --help` shows it in. A flag with an env',
    'setting reads it when the flag is not given (a flag beats its env setting, which beats the',
    "default); the common logging and ControlZ flags have none, as in Istio's install-cni. Every bad",
    'value is reported before anything is touched, one line each, with exit code 2.',
    '',
  ];
  for (const group of FLAG_GROUPS) {
    lines.push(
      `## ${group}`,
      '',
      '| flag | env | default | takes | help |',
      '|---|---|---|---|---|',
      ...FLAGS.filter((f) => f.group === group).map((f) => {
        const name = f.details ? `[${code(`--${f.name}`)}](#${anchor(`--${f.name}`)})` : code(`--${f.name}`);
        const def = f.default !== undefined && f.default !== '' ? code(f.default) : '';
        return `| ${name} | ${f.env ? code(f.env) : ''} | ${def} | ${takes(f)} | ${cell(f.help)} |`;
      }),
      '',
    );
    for (const f of FLAGS.filter((f) => f.group === group && f.details))
      lines.push(`### ${code(`--${f.name}`)}`, '', text(f.details!), '');
  }
  lines.push(
    '## Log scopes',
    '',
    '`--log_output_level`, `--log_stacktrace_level` and `--log_caller` name these scopes (`all` is every',
    `scope at once); the levels are ${LOG_LEVELS.map(code).join(', ')}.`,
    '',
    ...LOG_SCOPES.map((s) => `- ${code(s)}`),
    '',
  );
  return lines.join('\n');
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  writeFileSync(FLAGS_DOC, flagsReference());
  console.log(`wrote ${FLAGS_DOC}`);
}
