// What the plugin sends the agent follows what the agent was started to print: our entry's
// `log_level` is --log-level, or `debug` when the agent's `cni` scope starts at debug
// (--log_output_level cni:debug or all:debug), so an operator who asks the agent for the plugin's
// debug records gets them without knowing the second knob. The scope's default (info) leaves the
// shipped --log-level (warn): no per-pod record more than before. A real agent installs the entry,
// and the real plugin runs a DEL with it, as the runtime would, against the agent's log server.

import assert from 'node:assert/strict';
import fs from 'node:fs/promises';
import path from 'node:path';
import { describe, it } from 'node:test';
import { spawnAgent, type AgentProcess } from '../helpers/agent.ts';
import { BRIDGE_CONFLIST, makeHostTreeFor, type HostTree } from '../helpers/hosttree.ts';
import { meshCni } from '../helpers/plugin.ts';
import { cleanupAfterEach } from '../helpers/cleanup.ts';
import { waitFor } from '../helpers/poll.ts';
import { entryLogLevel } from '../../src/install/template.ts';
import { LOG_LEVELS } from '../../cni-plugin/shared/loglevels.ts';

const defer = cleanupAfterEach();

async function installed(
  flags: Record<string, string>,
): Promise<{ t: HostTree; a: AgentProcess; entry: Record<string, unknown>; conflist: Record<string, unknown> }> {
  const t = await makeHostTreeFor(defer);
  await fs.writeFile(path.join(t.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
  const a = spawnAgent(t, flags);
  defer(() => a.stop('SIGKILL'));
  await a.waitForLog((r) => r.msg === 'mesh-cni is installed and ready', 'ready', 30_000);
  const conflist = JSON.parse(await fs.readFile(path.join(t.netDir, '10-bridge.conflist'), 'utf8')) as Record<
    string,
    unknown
  >;
  const entry = (conflist.plugins as Record<string, unknown>[]).find((p) => p.type === 'mesh-cni');
  assert.ok(entry, 'our entry is in the primary');
  return { t, a, entry, conflist };
}

describe("the plugin's log_level follows the agent's cni scope", () => {
  it('cni:debug: the entry says debug, and a real plugin DEL shows its debug records in the agent', async () => {
    const flags = { log_output_level: 'default:info,cni:debug' };
    const { t, a, entry, conflist } = await installed(flags);
    assert.equal(entry.log_level, 'debug');
    // DEL with CNI_NETNS naming a directory: no rule of ours can be there, and the plugin says so
    // at debug.
    const notNetns = path.join(t.root, 'not-a-netns');
    await fs.mkdir(notNetns);
    const del = await meshCni(
      'DEL',
      {
        containerId: 'ctr-loglevel',
        netns: notNetns,
        ifname: 'eth0',
        args: 'K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0',
      },
      { cniVersion: conflist.cniVersion, name: conflist.name, ...entry },
    );
    assert.equal(del.code, 0, del.stdout + del.stderr);
    const isOurs = (r: Record<string, unknown>) =>
      r.scope === 'cni' && r.level === 'debug' && r.msg === 'nothing to remove: CNI_NETNS is no netns';
    // The plugin gives its connection a few ms: on a loaded machine the records may go to the
    // fallback file instead, which the agent prints when it next starts.
    const fallback = path.join(t.root, 'run/plugin-log.jsonl');
    const where = await waitFor('the debug record, printed or in the fallback file', async () =>
      a.logs.some(isOurs)
        ? 'printed'
        : (await fs.readFile(fallback, 'utf8').catch(() => '')).includes('CNI_NETNS is no netns') && 'file',
    );
    let rec: Record<string, unknown>;
    if (where === 'printed') rec = a.logs.find(isOurs)!;
    else {
      await a.stop('SIGKILL');
      const again = spawnAgent(t, flags);
      defer(() => again.stop('SIGKILL'));
      rec = await again.waitForLog(isOurs, 'the replayed debug record', 30_000);
    }
    assert.equal(rec.containerID, 'ctr-loglevel');
  });

  it('the default scopes: the entry keeps the shipped --log-level, warn', async () => {
    const { entry } = await installed({ log_output_level: 'default:info' });
    assert.equal(entry.log_level, 'warn');
  });

  it('--log-level and the cni scope: the more verbose, the scope counted only above its default (info)', () => {
    for (const plugin of LOG_LEVELS) {
      for (const cni of LOG_LEVELS) {
        const want = cni === 'debug' ? 'debug' : plugin;
        assert.equal(entryLogLevel(plugin, cni), want, `--log-level=${plugin} cni:${cni}`);
      }
    }
  });
});
