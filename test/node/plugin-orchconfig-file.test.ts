// The root plugin reads only its orchconfig, and reads it safely (docs/security.md "What the agent
// and the plugin read, and who writes it"): the orchconfig sits in the net dir, which others may
// write, so a file there naming another host file (user.tokenFile, cluster.certificate-authority)
// must not have the plugin read that file and send it as a Bearer token to a server the same file
// names; and the orchconfig itself must be a regular file of bounded size (a FIFO would block every
// CNI call, /dev/zero never ends).

import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { OrchconfigError, parseOrchconfig } from '../../cni-plugin/orch/orchconfig.ts';

const dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-plugin-orch-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const doc = (cluster: Record<string, unknown>, user: Record<string, unknown>) =>
  JSON.stringify({
    clusters: [{ name: 'c', cluster: { server: 'https://198.18.0.1:443', ...cluster } }],
    users: [{ name: 'u', user }],
    contexts: [{ name: 'x', context: { cluster: 'c', user: 'u' } }],
    'current-context': 'x',
  });
const SECRET_FILE = path.join(dir, 'host-secret');
writeFileSync(SECRET_FILE, 'host-secret-do-not-send\n');

/** readOrchconfig in a child, so a read that blocks fails the test instead of hanging it. */
function readInChild(file: string): { status: number | null; out: string } {
  const script = `import { readOrchconfig } from ${JSON.stringify(path.resolve('cni-plugin/orch/orchconfig.ts'))};
try { const a = readOrchconfig(${JSON.stringify(file)}); console.log('OK ' + a.token); } catch (e) { console.log('ERR ' + e.constructor.name + ': ' + e.message); }`;
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { timeout: 5000, encoding: 'utf8' });
  return { status: r.status, out: r.stdout.trim() };
}

describe('the plugin reads no file its orchconfig names', () => {
  it('refuses user.tokenFile, never reading it', () => {
    assert.throws(
      () =>
        parseOrchconfig(
          doc({ 'insecure-skip-tls-verify': true }, { tokenFile: SECRET_FILE }),
          '/etc/cni/net.d/ZZZ-mesh-cni-orchconfig',
        ),
      (e: Error) => {
        assert.ok(e instanceof OrchconfigError);
        assert.match(e.message, /tokenFile/);
        assert.doesNotMatch(e.message, /host-secret-do-not-send/);
        return true;
      },
    );
  });

  it('refuses cluster.certificate-authority (a file path), never reading it', () => {
    assert.throws(
      () =>
        parseOrchconfig(
          doc({ 'certificate-authority': SECRET_FILE }, { token: 't' }),
          '/etc/cni/net.d/ZZZ-mesh-cni-orchconfig',
        ),
      (e: Error) => {
        assert.ok(e instanceof OrchconfigError);
        assert.match(e.message, /certificate-authority-data/);
        return true;
      },
    );
  });

  it('still takes what install-cni writes (inline token and certificate-authority-data)', () => {
    const a = parseOrchconfig(
      doc({ 'certificate-authority-data': Buffer.from('PEM').toString('base64') }, { token: 'tok' }),
      'f',
    );
    assert.equal(a.token, 'tok');
    assert.equal(a.caPem, 'PEM');
  });
});

describe('the orchconfig itself is read as a regular file of at most 1 MiB', () => {
  it('a regular file is read', () => {
    const f = path.join(dir, 'good');
    writeFileSync(f, doc({ 'insecure-skip-tls-verify': true }, { token: 'tok' }));
    assert.deepEqual(readInChild(f), { status: 0, out: 'OK tok' });
  });

  it('a FIFO is refused at once (it would block every CNI call)', () => {
    const f = path.join(dir, 'fifo');
    execFileSync('mkfifo', [f]);
    const r = readInChild(f);
    assert.equal(r.status, 0, 'the read blocked');
    assert.match(r.out, /^ERR OrchconfigError: .*not a regular file/);
  });

  it('a device (/dev/zero, endless) and a link are refused', () => {
    const z = path.join(dir, 'zero');
    symlinkSync('/dev/zero', z);
    assert.match(readInChild('/dev/zero').out, /^ERR OrchconfigError: .*not a regular file/);
    assert.match(readInChild(z).out, /^ERR OrchconfigError: .*symbolic link/);
  });

  it('a file over 1 MiB is refused', () => {
    const f = path.join(dir, 'big');
    writeFileSync(f, ' '.repeat(1024 * 1024 + 1));
    assert.match(readInChild(f).out, /^ERR OrchconfigError: .*1 MiB/);
  });
});
