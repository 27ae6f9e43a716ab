import assert from 'node:assert/strict';
import {
  chmodSync,
  chownSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { cacheFileFor, cachedFlavour, CACHE_DIR_NAME, CACHE_FILE_NAME } from '../../cni-plugin/netns/flavourcache.ts';
import { detectFlavour, type Detection } from '../../cni-plugin/netns/iptables.ts';

const dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-plg-cache-'));
after(() => rmSync(dir, { recursive: true, force: true }));
const bootId = readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();

function counting(d: Detection) {
  const calls = { n: 0 };
  return {
    calls,
    detect: async () => {
      calls.n++;
      return d;
    },
  };
}

describe('iptables flavour remembered for the boot', () => {
  it('lives in a directory of its own beside the log socket, and nowhere without one', () => {
    assert.equal(cacheFileFor('/var/run/mesh-cni/log.sock'), `/var/run/mesh-cni/${CACHE_DIR_NAME}/${CACHE_FILE_NAME}`);
    assert.equal(cacheFileFor(''), null);
  });

  it('detects once, then answers from the cache', async () => {
    const file = path.join(dir, 'a.json');
    const { calls, detect } = counting({ flavour: 'legacy', why: 'test' });
    assert.deepEqual(await cachedFlavour(file, detect), { flavour: 'legacy', why: 'test', cached: false });
    const second = await cachedFlavour(file, detect);
    assert.equal(second.flavour, 'legacy');
    assert.equal(second.cached, true);
    assert.equal(calls.n, 1);
  });

  for (const [what, content] of [
    ['from another boot', { flavour: 'legacy', why: 'x', bootId: 'another-boot', at: Date.now() }],
    ['older than an hour', { flavour: 'legacy', why: 'x', bootId, at: Date.now() - 3_700_000 }],
    ['with a bad flavour', { flavour: 'iptables-ng', why: 'x', bootId, at: Date.now() }],
    ['that is not JSON', 'garbage'],
  ] as const) {
    it(`ignores and rewrites a cache ${what}`, async () => {
      const file = path.join(dir, `${what.replaceAll(' ', '-')}.json`);
      writeFileSync(file, typeof content === 'string' ? content : JSON.stringify(content));
      const { calls, detect } = counting({ flavour: 'nft', why: 'fresh' });
      assert.equal((await cachedFlavour(file, detect)).flavour, 'nft');
      assert.equal(calls.n, 1);
      assert.equal((JSON.parse(readFileSync(file, 'utf8')) as { flavour: string }).flavour, 'nft');
    });
  }

  it('always detects without a cache file, and survives an unwritable one', async () => {
    const { calls, detect } = counting({ flavour: 'nft', why: 'x' });
    await cachedFlavour(null, detect);
    await cachedFlavour(null, detect);
    await cachedFlavour(path.join(dir, 'no/such/dir/cache.json'), detect);
    assert.equal(calls.n, 3);
  });

  it('remembers what the real detection says on this host', async () => {
    const file = path.join(dir, 'real.json');
    const real = await cachedFlavour(file, detectFlavour);
    assert.equal((await cachedFlavour(file, detectFlavour)).flavour, real.flavour);
  });
});

// The plugin runs as root; the directory it caches in must not let anyone else choose what root
// writes. Before, the temp file had a predictable name (`<file>.<pid>.tmp`) and was written with
// writeFileSync, which follows a symlink planted there onto any file.
describe('the flavour cache cannot be turned against root', () => {
  const victimDir = mkdtempSync(path.join(os.tmpdir(), 'mcni-plg-victim-'));
  after(() => rmSync(victimDir, { recursive: true, force: true }));

  function victim(name: string): string {
    const v = path.join(victimDir, name);
    writeFileSync(v, 'precious\n', { mode: 0o600 });
    return v;
  }

  it('writes through no symlink planted at the temp file name or at the cache file name', async () => {
    const d = mkdtempSync(path.join(os.tmpdir(), 'mcni-plg-cache-'));
    try {
      const file = path.join(d, CACHE_FILE_NAME);
      const atTemp = victim('shadow');
      const atFile = victim('passwd');
      symlinkSync(atTemp, `${file}.${process.pid}.tmp`);
      symlinkSync(atFile, file);
      const { calls, detect } = counting({ flavour: 'nft', why: 'planted' });
      await cachedFlavour(file, detect);
      assert.equal(readFileSync(atTemp, 'utf8'), 'precious\n', 'the file behind the temp-name link is untouched');
      assert.equal(readFileSync(atFile, 'utf8'), 'precious\n', 'the file behind the cache-name link is untouched');
      assert.ok(lstatSync(file).isFile(), 'the link at the cache name is replaced by our own regular file');
      assert.equal(statSync(file).mode & 0o777, 0o600);
      assert.equal((await cachedFlavour(file, detect)).cached, true, 'and it is used');
      assert.equal(calls.n, 1);
      assert.deepEqual(
        readdirSync(d).filter((f) => f.endsWith('.tmp') && !f.startsWith(`${CACHE_FILE_NAME}.${process.pid}`)),
        [],
        'no temp file left',
      );
    } finally {
      rmSync(d, { recursive: true, force: true });
    }
  });

  for (const [what, make] of [
    [
      'a symlink to a directory',
      (d: string) => {
        const real = path.join(d, 'real');
        mkdirSync(real, { mode: 0o700 });
        symlinkSync(real, path.join(d, 'cache'));
        return real;
      },
    ],
    [
      'writable by others',
      (d: string) => {
        mkdirSync(path.join(d, 'cache'));
        chmodSync(path.join(d, 'cache'), 0o777);
        return path.join(d, 'cache');
      },
    ],
    [
      'writable by its group',
      (d: string) => {
        mkdirSync(path.join(d, 'cache'));
        chmodSync(path.join(d, 'cache'), 0o770);
        return path.join(d, 'cache');
      },
    ],
    [
      'owned by another user',
      (d: string) => {
        mkdirSync(path.join(d, 'cache'), { mode: 0o700 });
        chownSync(path.join(d, 'cache'), 65534, 65534);
        return path.join(d, 'cache');
      },
    ],
  ] as const) {
    it(`keeps no cache in a directory that is ${what}`, async () => {
      const d = mkdtempSync(path.join(os.tmpdir(), 'mcni-plg-cache-'));
      try {
        const target = make(d);
        const file = path.join(d, 'cache', CACHE_FILE_NAME);
        const { calls, detect } = counting({ flavour: 'legacy', why: 'unsafe dir' });
        assert.equal((await cachedFlavour(file, detect)).flavour, 'legacy');
        assert.equal((await cachedFlavour(file, detect)).cached, false);
        assert.equal(calls.n, 2, 'detected every time');
        assert.deepEqual(readdirSync(target), [], 'nothing written there');
      } finally {
        rmSync(d, { recursive: true, force: true });
      }
    });
  }
});

describe('the agent makes the cache directory', () => {
  it('0700 beside its log socket at start, narrowing one an older version left wider', async () => {
    const { buildSettings } = await import('../../src/config/settings.ts');
    const { startPluginLogServer } = await import('../../src/monitoring/logserver.ts');
    const d = mkdtempSync(path.join(os.tmpdir(), 'mcni-plg-run-'));
    try {
      const sock = path.join(d, 'run/log.sock');
      const cacheDir = path.dirname(cacheFileFor(sock)!);
      for (const before of ['absent', 'wide']) {
        if (before === 'wide') chmodSync(cacheDir, 0o755);
        const server = await startPluginLogServer(buildSettings({ 'log-uds-address': sock }, {}).install.logUdsAddress);
        try {
          const st = lstatSync(cacheDir);
          assert.ok(st.isDirectory(), before);
          assert.equal(st.mode & 0o777, 0o700, before);
          assert.equal(st.uid, process.geteuid!());
        } finally {
          await server.stop('SIGTERM');
        }
      }
    } finally {
      rmSync(d, { recursive: true, force: true });
    }
  });
});
