// ControlZ in a real browser (Debian's chromium, driven by playwright-core): change the cni
// scope's level from the page and see the running agent's output change. With
// UPDATE_SCREENSHOT=1 it also refreshes docs/controlz.png.

import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { chromium, type BrowserContext, type Page } from 'playwright-core';
import { UdsLog } from '../../cni-plugin/log/udslog.ts';
import { spawnAgent, type AgentProcess } from '../helpers/agent.ts';
import { ROOT } from '../helpers/cli.ts';
import { makeHostTree, type HostTree } from '../helpers/hosttree.ts';

const CHROMIUM = '/usr/bin/chromium';
const FLAGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

describe(
  'ControlZ in Chromium',
  { skip: existsSync(CHROMIUM) ? false : `${CHROMIUM} missing (scripts/setup-host.sh installs it)` },
  () => {
    let tree: HostTree;
    let agent: AgentProcess;
    let sock: string;
    let base: string;
    let profile: string;
    let context: BrowserContext;
    let page: Page;
    const requested: string[] = [];
    const consoleErrors: string[] = [];

    before(async () => {
      tree = await makeHostTree();
      sock = path.join(tree.root, 'run/mesh-cni/log.sock');
      agent = spawnAgent(
        tree,
        { 'log-uds-address': sock, log_output_level: 'default:info,cni:info', ctrlz_address: 'localhost' },
        { MESH_DEMO_API_TOKEN: 'do-not-show-me' },
      );
      base = `http://localhost:${(await agent.waitForLog((r) => r.msg === 'ControlZ listening', 'ControlZ', 30_000)).port as number}`;
      profile = mkdtempSync(path.join(os.tmpdir(), 'mcni-obs-chromium-'));
      context = await chromium.launchPersistentContext(profile, {
        executablePath: CHROMIUM,
        headless: true,
        args: FLAGS /* the fresh profile dir is the userDataDir argument: playwright passes it as --user-data-dir */,
        viewport: { width: 1100, height: 760 },
        timeout: 60_000,
      });
      page = context.pages()[0] ?? (await context.newPage());
      page.setDefaultTimeout(15_000);
      page.on('request', (r) => requested.push(r.url()));
      page.on('console', (m) => m.type() === 'error' && consoleErrors.push(m.text()));
    });
    after(async () => {
      await context?.close();
      await agent?.stop('SIGTERM');
      await tree?.remove();
      if (profile) rmSync(profile, { recursive: true, force: true });
    });

    const pluginSays = async (msg: string) => {
      const client = new UdsLog(
        sock,
        'debug',
        { command: 'ADD', containerID: 'cid-9', pod: { namespace: 'shop', name: 'cart-7' } },
        'none',
      );
      client.debug(msg);
      client.info(`${msg} (marker)`);
      await client.flush(2000);
      await agent.waitForLog((r) => r.msg === `${msg} (marker)`, `the marker after "${msg}"`);
    };

    it('changes the cni level from the page and the agent prints what it hid before', async () => {
      await page.goto(base + '/');
      const select = page.locator('select[name="cni.output_level"]');
      await select.waitFor();
      assert.equal(await select.inputValue(), 'info');
      assert.equal(await select.isDisabled(), false);
      assert.equal(await page.locator('#access').isVisible(), false, 'no read-only note on loopback');

      await pluginSays('debug before');
      assert.equal(
        agent.logs.some((r) => r.msg === 'debug before'),
        false,
        'cni at info hides debug records',
      );

      await select.selectOption('debug');
      await page.locator('#status', { hasText: 'cni output level set to debug' }).waitFor();
      assert.equal(await page.locator('select[name="cni.output_level"]').inputValue(), 'debug');

      await pluginSays('debug after');
      const rec = agent.logs.find((r) => r.msg === 'debug after');
      assert.ok(rec, 'the agent prints the debug record once the page set cni to debug');
      assert.equal(rec.level, 'debug');
      assert.equal(rec.pod, 'shop/cart-7');
      assert.ok(
        agent.logs.some(
          (r) =>
            r.msg === 'ControlZ: changing scope levels' &&
            r.scope_name === 'cni' &&
            r.from === 'cni:info' &&
            r.client_uid === 0,
        ),
      );
    });

    it('shows components, process info, masked env and metrics', async () => {
      await page.click('nav button[data-tab="components"]');
      await page.locator('body[data-loaded="components"]').waitFor();
      const components = await page.locator('#components-body').innerText();
      assert.match(components, /plugin-log-server/);
      assert.match(components, /ctrlz/);

      await page.click('nav button[data-tab="env"]');
      await page.locator('body[data-loaded="env"]').waitFor();
      const env = await page.locator('#env-body').innerText();
      assert.match(env, /MESH_DEMO_API_TOKEN\s+\*{6}/);
      assert.doesNotMatch(env, /do-not-show-me/);

      await page.click('nav button[data-tab="proc"]');
      await page.locator('body[data-loaded="proc"]').waitFor();
      const proc = await page.locator('#proc-body').innerText();
      assert.match(proc, new RegExp(`pid\\s+${agent.child.pid}`));
      assert.match(proc, /node version\s+v24\./);

      await page.click('nav button[data-tab="metrics"]');
      await page.locator('body[data-loaded="metrics"]').waitFor();
      assert.match(await page.locator('#metrics-body').innerText(), /mesh_cni_plugin_log_lines_received_total \d+/);
    });

    it('loads nothing from anywhere else and trips no error or CSP violation', () => {
      const foreign = requested.filter((u) => !u.startsWith(base + '/'));
      assert.deepEqual(foreign, []);
      assert.deepEqual(consoleErrors, []);
    });

    it('shows the levels read-only, saying why, when the agent runs with --ctrlz_write=false', async () => {
      const tree2 = await makeHostTree();
      const agent2 = spawnAgent(tree2, { ctrlz_address: 'localhost', ctrlz_write: 'false' });
      const page2 = await context.newPage();
      try {
        const base2 = `http://localhost:${(await agent2.waitForLog((r) => r.msg === 'ControlZ listening', 'ControlZ', 30_000)).port as number}`;
        const errors: string[] = [];
        page2.on('console', (m) => m.type() === 'error' && errors.push(m.text()));
        await page2.goto(base2 + '/');
        await page2.locator('body[data-loaded="scopes"]').waitFor();
        const select = page2.locator('select[name="cni.output_level"]');
        assert.equal(await select.isDisabled(), true);
        assert.equal(await select.inputValue(), 'info');
        assert.match(
          await page2.locator('#access').innerText(),
          /^Read-only: ControlZ is read-only \(--ctrlz_write=false\)\.$/,
        );
        assert.equal(await page2.locator('select:not([disabled])').count(), 0, 'no level can be picked');
        assert.deepEqual(errors, []);
      } finally {
        await page2.close();
        await agent2.stop('SIGTERM');
        await tree2.remove();
      }
    });

    it('renders the scopes page (screenshot)', async () => {
      await page.click('nav button[data-tab="scopes"]');
      await page.locator('body[data-loaded="scopes"]').waitFor();
      const shot = path.join(profile, 'controlz.png');
      await page.screenshot({ path: shot, fullPage: true });
      assert.ok(statSync(shot).size > 10_000);
      if (process.env.UPDATE_SCREENSHOT === '1')
        await page.screenshot({ path: path.join(ROOT, 'docs/controlz.png'), fullPage: true });
    });
  },
);
