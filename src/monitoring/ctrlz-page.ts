// The ControlZ page: one self-contained HTML document (no CDN, fonts or images) that reads the
// JSON API and sets scope levels through it. Data is only ever put into the page as text
// (textContent), never as markup, so an env value or a component's error cannot inject HTML.

import { createHash } from 'node:crypto';
import { LOG_LEVELS } from '../../cni-plugin/shared/loglevels.ts';

const STYLE = `
  :root { color-scheme: light dark; --line: #8884; --accent: #2a6fdb; }
  body { font: 14px/1.45 system-ui, sans-serif; margin: 0; }
  header { padding: 12px 20px; background: #1d2b3a; color: #fff; display: flex; gap: 16px; align-items: baseline; }
  header h1 { font-size: 18px; margin: 0; }
  header span { opacity: .75; }
  nav { display: flex; gap: 4px; padding: 8px 20px 0; border-bottom: 1px solid var(--line); }
  nav button { border: 1px solid var(--line); border-bottom: none; background: none; padding: 6px 12px; cursor: pointer; font: inherit; color: inherit; border-radius: 4px 4px 0 0; }
  nav button[aria-selected="true"] { background: var(--accent); color: #fff; }
  main { padding: 16px 20px; }
  section[hidden] { display: none; }
  table { border-collapse: collapse; min-width: 480px; }
  th, td { text-align: left; padding: 4px 12px 4px 0; border-bottom: 1px solid var(--line); vertical-align: top; }
  td.v { font-family: ui-monospace, monospace; word-break: break-all; }
  pre { font: 12px/1.35 ui-monospace, monospace; white-space: pre-wrap; word-break: break-all; }
  .bad { color: #c0392b; } .ok { color: #27ae60; }
  #access { padding: 6px 10px; border-left: 4px solid #c0392b; background: #c0392b14; }
  select:disabled { opacity: .75; }
  #status { margin-left: auto; font-size: 12px; }
`;

const SCRIPT = `
const LEVELS = ${JSON.stringify(LOG_LEVELS)};
const $ = (id) => document.getElementById(id);
const el = (tag, text, cls) => { const e = document.createElement(tag); if (text !== undefined) e.textContent = String(text); if (cls) e.className = cls; return e; };
const row = (...cells) => { const tr = el('tr'); for (const c of cells) tr.append(c instanceof Node ? c : el('td', c)); return tr; };
const say = (text, bad) => { const s = $('status'); s.textContent = text; s.className = bad ? 'bad' : 'ok'; };
// Read-only (--ctrlz_write): levels are shown, not offered for change, and the page says why.
let writable = false;
async function api(path, init) {
  const r = await fetch('/api/' + path, init);
  if (!r.ok) throw new Error(path + ': ' + r.status + ' ' + (await r.text()));
  return r.headers.get('content-type').startsWith('application/json') ? r.json() : r.text();
}
function levelSelect(scope, field, value) {
  const s = el('select');
  s.name = scope + '.' + field;
  s.dataset.scope = scope; s.dataset.field = field;
  for (const l of LEVELS) { const o = el('option', l); o.value = l; o.selected = l === value; s.append(o); }
  s.disabled = !writable;
  if (!writable) s.title = 'read-only';
  s.addEventListener('change', async () => {
    try {
      await api('scopes/' + encodeURIComponent(scope), { method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ [field]: s.value }) });
      say(scope + ' ' + field.replace('_', ' ') + ' set to ' + s.value);
      await loadScopes();
    } catch (e) { say(e.message, true); }
  });
  const td = el('td'); td.append(s); return td;
}
async function loadScopes() {
  const access = await api('controlz');
  writable = access.writable;
  $('access').hidden = writable;
  $('access').textContent = writable ? '' : 'Read-only: ' + access.reason + '.';
  const scopes = await api('scopes');
  const body = $('scopes-body'); body.replaceChildren();
  for (const s of scopes) {
    const tr = row(el('td', s.name), levelSelect(s.name, 'output_level', s.output_level), levelSelect(s.name, 'stack_trace_level', s.stack_trace_level), el('td', s.log_caller ? 'yes' : ''));
    tr.id = 'scope-' + s.name;
    body.append(tr);
  }
}
function kvTable(body, obj) {
  body.replaceChildren();
  for (const [k, v] of Object.entries(obj)) body.append(row(el('th', k), el('td', typeof v === 'object' ? JSON.stringify(v) : v, 'v')));
}
async function loadProc() {
  const p = await api('proc');
  const mem = p.memory;
  kvTable($('proc-body'), {
    pid: p.pid, ppid: p.ppid, hostname: p.hostname, uptime: p.uptime_seconds.toFixed(0) + ' s',
    'node version': p.node_version, 'build': p.build.version + ' (' + p.build.git_commit.slice(0, 12) + ')', platform: p.platform,
    'memory rss': (mem.rss / 1048576).toFixed(1) + ' MiB', 'heap used': (mem.heapUsed / 1048576).toFixed(1) + ' MiB',
    cwd: p.cwd, args: p.args.join(' '),
  });
  $('pid').textContent = 'pid ' + p.pid;
}
async function loadComponents() {
  const cs = await api('components');
  const box = $('components-body'); box.replaceChildren();
  for (const c of cs) {
    const h = el('h3', c.name + ' ');
    h.append(el('span', c.ready ? 'ready' : 'not ready', c.ready ? 'ok' : 'bad'));
    box.append(h);
    const lines = [...c.not_ready.map((r) => r.reason + ' (since ' + r.since + ')'), ...c.notes.map((n) => 'note: ' + n.note + ' (since ' + n.since + ')')];
    if (lines.length) { const ul = el('ul'); for (const l of lines) ul.append(el('li', l)); box.append(ul); }
    const t = el('table'); const b = el('tbody'); t.append(b); kvTable(b, c.status); box.append(t);
  }
}
async function loadEnv() { kvTable($('env-body'), await api('env')); }
async function loadMetrics() { $('metrics-body').textContent = await api('metrics'); }
const loaders = { scopes: loadScopes, proc: loadProc, components: loadComponents, env: loadEnv, metrics: loadMetrics };
let current = 'scopes';
async function show(name) {
  current = name;
  for (const b of document.querySelectorAll('nav button')) b.setAttribute('aria-selected', String(b.dataset.tab === name));
  for (const s of document.querySelectorAll('main section')) s.hidden = s.id !== name;
  try { await loaders[name](); document.body.dataset.loaded = name; } catch (e) { say(e.message, true); }
}
for (const b of document.querySelectorAll('nav button')) b.addEventListener('click', () => show(b.dataset.tab));
setInterval(() => { if (current !== 'scopes' && current !== 'env') loaders[current]().catch((e) => say(e.message, true)); }, 5000);
loadProc().catch(() => {});
show('scopes');
`;

const sha256 = (s: string) => `'sha256-${createHash('sha256').update(s).digest('base64')}'`;

/** Only this page's own script and style may run: the hashes pin them. */
export const CONTROLZ_CSP = `default-src 'none'; connect-src 'self'; script-src ${sha256(SCRIPT)}; style-src ${sha256(STYLE)}; img-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'`;

export const CONTROLZ_PAGE = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>ControlZ · install-cni</title>
<style>${STYLE}</style>
</head>
<body>
<header><h1>ControlZ</h1><span>install-cni</span><span id="pid"></span><span id="status"></span></header>
<nav>
  <button data-tab="scopes">Logging scopes</button>
  <button data-tab="components">Components</button>
  <button data-tab="proc">Process</button>
  <button data-tab="env">Environment</button>
  <button data-tab="metrics">Metrics</button>
</nav>
<main>
  <section id="scopes"><p id="access" hidden></p><table><thead><tr><th>scope</th><th>output level</th><th>stack trace level</th><th>caller</th></tr></thead><tbody id="scopes-body"></tbody></table>
    <p>A change takes effect at once, lasts until the agent restarts, and is logged (scope monitoring) before it applies.</p></section>
  <section id="components" hidden><div id="components-body"></div></section>
  <section id="proc" hidden><table><tbody id="proc-body"></tbody></table></section>
  <section id="env" hidden><p>Values of names containing TOKEN, SECRET, PASSWORD, KEY or CERT are masked.</p><table><tbody id="env-body"></tbody></table></section>
  <section id="metrics" hidden><pre id="metrics-body"></pre></section>
</main>
<script>${SCRIPT}</script>
</body>
</html>
`;
