import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { cacheFileFor, cachedFlavour, CACHE_FILE_NAME } from '../../cni-plugin/netns/flavourcache.ts';
import { detectFlavour, type Detection } from '../../cni-plugin/netns/iptables.ts';

const dir = mkdtempSync(path.join(os.tmpdir(), 'mcni-plg-cache-'));
after(() => rmSync(dir, { recursive: true, force: true }));
const bootId = readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();

function counting(d: Detection) {
  const calls = { n: 0 };
  return { calls, detect: async () => { calls.n++; return d; } };
}

describe('iptables flavour remembered for the boot', () => {
  it('lives beside the log socket, and nowhere without one', () => {
    assert.equal(cacheFileFor('/var/run/mesh-cni/log.sock'), `/var/run/mesh-cni/${CACHE_FILE_NAME}`);
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
