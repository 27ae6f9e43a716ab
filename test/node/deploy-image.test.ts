// The container image: scripts/image.sh builds it offline with buildah into an OCI archive;
// podman (private storage and config) loads it and runs `install-cni version`; then the image
// runs the way deploy/ runs it (the DaemonSet's env, args, securityContext: root with every
// capability dropped, read-only root fs, no privilege escalation; its volumes as host dirs) and
// installs the plugin into a sandbox node, answers /readyz, and on SIGTERM takes it all out
// again, leaving the primary config byte for byte as it was. Its API server is the test one,
// with exactly the RBAC deploy/ grants each account: the agent in the image mints the plugin's
// token, and its own token appears nowhere on the sandbox node's disk. Repair in place: the image's
// nsenter, iptables (both flavours) and ip run; as the repair-in-place component runs the image,
// a rule of each flavour goes into a uid-65535 process's netns found through /host/proc, and the
// component's four capabilities are each shown needed (dropped in turn, a named step fails).
//
// Needs root, buildah and podman (scripts/setup-host.sh) and a built dist/ (npm test builds).

import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import fs from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { V1ConfigMap, V1DaemonSet } from '@kubernetes/client-node';
import { ROOT } from '../helpers/cli.ts';
import { BRIDGE_CONFLIST, makeHostTree, type HostTree } from '../helpers/hosttree.ts';
import { startTestApiServer, type TestApiServer } from '../helpers/apiserver.ts';
import { eventually } from '../helpers/poll.ts';
import { rulesFor } from '../helpers/rbac.ts';
import { Netns, run } from '../helpers/netns.ts';
import { makePodman, type Podman } from '../helpers/podman.ts';
import {
  agentContainer,
  DEPLOY_DIR,
  kustomize,
  one,
  podmanRunArgs,
  SERVICE_ACCOUNT_MOUNT,
  type Rendered,
} from '../helpers/podman-daemonset.ts';

const pkg = JSON.parse(readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { version: string };
const IMAGE = `localhost/mesh-cni:${pkg.version}`;

describe('deploy: the container image', { timeout: 300_000 }, () => {
  let work: string;
  let archive: string;
  let podman: Podman;
  let buildOutput: string;
  before(async () => {
    for (const f of ['dist/install-cni.js', 'dist/bin/mesh-cni']) {
      assert.ok(existsSync(path.join(ROOT, f)), `${f} is missing: run npm run build first`);
    }
    work = await fs.mkdtemp(path.join(os.tmpdir(), 'mcni-image-test-'));
    archive = path.join(work, 'mesh-cni-image.tar');
    const r = await run('bash', [path.join(ROOT, 'scripts/image.sh'), archive], { timeoutMs: 240_000 });
    assert.equal(r.code, 0, `scripts/image.sh failed: ${r.stderr}`);
    buildOutput = r.stdout;
    podman = makePodman();
    await podman.ok(['load', '--quiet', '--input', archive]);
  });
  after(async () => {
    await podman?.remove();
    await fs.rm(work, { recursive: true, force: true });
  });

  it('is an OCI archive of localhost/mesh-cni:<version>, entrypoint install-cni, default user nobody', async () => {
    assert.match(buildOutput, new RegExp(`image: ${IMAGE} -> `));
    const [inspect] = JSON.parse(await podman.ok(['image', 'inspect', IMAGE])) as [
      { Config: { Entrypoint: string[]; User: string; Labels: Record<string, string> }; Size: number },
    ];
    assert.deepEqual(inspect.Config.Entrypoint, ['/usr/bin/node', '/opt/mesh-cni/install-cni.js']);
    assert.equal(inspect.Config.User, '65534:65534');
    assert.equal(inspect.Config.Labels['org.opencontainers.image.version'], pkg.version);
    // The plugin sits where install-cni copies from by default, byte for byte the build's.
    const listing = await podman.ok([
      'run',
      '--rm',
      '--network',
      'none',
      '--entrypoint',
      '/usr/bin/node',
      IMAGE,
      '-e',
      "const fs=require('fs');const c=require('crypto');for(const f of fs.readdirSync('/opt/mesh-cni/bin'))console.log(f,c.createHash('sha256').update(fs.readFileSync('/opt/mesh-cni/bin/'+f)).digest('hex'))",
    ]);
    const { createHash } = await import('node:crypto');
    const want = createHash('sha256')
      .update(readFileSync(path.join(ROOT, 'dist/bin/mesh-cni')))
      .digest('hex');
    assert.equal(listing.trim(), `mesh-cni ${want}`);
  });

  it('runs `install-cni version` (as nobody, without network)', async () => {
    const text = await podman.ok(['run', '--rm', '--network', 'none', IMAGE, 'version']);
    assert.match(text, new RegExp(`Version:"${pkg.version.replaceAll('.', '\\.')}"`));
    assert.match(text, /NodeVersion:"v24\./);
    const json = JSON.parse(await podman.ok(['run', '--rm', '--network', 'none', IMAGE, 'version', '-o', 'json'])) as {
      version: string;
      nodeVersion: string;
    };
    assert.equal(json.version, pkg.version);
    const short = await podman.ok([
      'run',
      '--rm',
      '--network',
      'none',
      '--user',
      '0:0',
      '--cap-drop',
      'ALL',
      '--read-only',
      '--read-only-tmpfs=false',
      IMAGE,
      'version',
      '--short',
    ]);
    assert.equal(short.trim(), pkg.version);
  });

  describe('repair in place: the tools, and the capabilities of the repair-in-place component, measured', () => {
    const POD_IP = '198.18.77.2';
    const STEPS = [
      'open',
      'setns',
      'addr',
      'restore-legacy',
      'save-legacy',
      'restore-nft',
      'save-nft',
      'route',
      'validation',
    ];
    let dir: string;
    let rendered: Rendered;
    let ns: Netns;
    let target: ChildProcess;
    before(async () => {
      dir = await fs.mkdtemp(path.join(os.tmpdir(), 'mcni-image-inplace-'));
      // The component used as the README says: from an operator's kustomization next to deploy/.
      const rel = path.relative(dir, DEPLOY_DIR);
      await fs.writeFile(
        path.join(dir, 'kustomization.yaml'),
        `resources:\n  - ${rel}\ncomponents:\n  - ${rel}/overlays/repair-in-place\n`,
      );
      rendered = kustomize(dir);
      await fs.writeFile(path.join(dir, 'probe.cjs'), IN_PLACE_PROBE);
      for (const d of ['bin', 'net', 'run', 'template', 'lock']) await fs.mkdir(path.join(dir, d));
      // The "pod": a process of uid 65535 in a netns of its own, with an address and a default
      // route (mesh-validation's connect must not fail with ENETUNREACH before any rule acts).
      ns = new Netns('inplace');
      ns.exec(['ip', 'link', 'add', 'mcni-p0', 'type', 'veth', 'peer', 'name', 'mcni-p1']);
      ns.exec(['ip', 'link', 'set', 'mcni-p1', 'up']);
      ns.exec(['ip', 'addr', 'add', `${POD_IP}/24`, 'dev', 'mcni-p0']);
      ns.exec(['ip', 'link', 'set', 'mcni-p0', 'up']);
      ns.exec(['ip', 'route', 'add', 'default', 'via', '198.18.77.1']);
      target = spawn(
        'ip',
        ['netns', 'exec', ns.name, 'setpriv', '--reuid', '65535', '--regid', '65535', '--clear-groups', 'sleep', '600'],
        { stdio: 'ignore' },
      );
      const own = (await fs.stat('/proc/self/ns/net')).ino;
      await eventually(
        async () =>
          (await fs.stat(`/proc/${target.pid}/ns/net`).catch(() => ({ ino: own }))).ino !== own &&
          /^Uid:\s+65535\b/m.test(await fs.readFile(`/proc/${target.pid}/status`, 'utf8').catch(() => '')),
        'the target process to run as 65535 in its netns',
        10_000,
      );
    });
    after(async () => {
      target?.kill('SIGKILL');
      ns?.remove();
      if (dir) await fs.rm(dir, { recursive: true, force: true });
    });

    /** The probe in the image as the component's DaemonSet runs it, with these capabilities added. */
    async function probe(
      caps: readonly string[],
      o: { lockMount?: boolean } = {},
    ): Promise<Map<string, { ok: boolean; detail: string }>> {
      // Each run starts from a netns without rules: a rule left by an earlier run would make
      // mesh-validation pass without this run having programmed anything.
      for (const fl of ['legacy', 'nft'])
        for (const bin of ['iptables', 'ip6tables']) ns.exec([`${bin}-${fl}`, '-t', 'nat', '-F', 'OUTPUT']);
      const { flags } = podmanRunArgs(rendered.objects, {
        volumeDirs: {
          'cni-bin-dir': path.join(dir, 'bin'),
          'cni-net-dir': path.join(dir, 'net'),
          'mesh-cni-run': path.join(dir, 'run'),
          'cni-network-config': path.join(dir, 'template'),
          'host-proc': '/proc',
          'xtables-lock': path.join(dir, 'lock'), // the component's private emptyDir at /run
        },
        env: {
          NODE_NAME: 'node-1',
          HOST_IP: '198.19.250.1',
          POD_NAME: 'mesh-cni-node-x',
          POD_NAMESPACE: 'mesh-system',
        },
      });
      const withCaps: string[] = [];
      for (let i = 0; i < flags.length; i++) {
        if (flags[i] === '--cap-add') i++;
        else if (o.lockMount === false && flags[i] === '--volume' && flags[i + 1]!.endsWith(':/run')) i++;
        else withCaps.push(flags[i]!);
      }
      for (const c of caps) withCaps.push('--cap-add', c);
      const out = await podman.ok([
        'run',
        '--rm',
        ...withCaps,
        '--volume',
        `${path.join(dir, 'probe.cjs')}:/probe.cjs:ro`,
        '--entrypoint',
        '/usr/bin/node',
        IMAGE,
        '/probe.cjs',
        String(target.pid),
        POD_IP,
      ]);
      const steps = new Map<string, { ok: boolean; detail: string }>();
      for (const line of out.trim().split('\n')) {
        const { step, ok, detail } = JSON.parse(line) as { step: string; ok: boolean; detail: string };
        steps.set(step, { ok, detail });
      }
      return steps;
    }
    const failed = (steps: Map<string, { ok: boolean }>) => [...steps].filter(([, v]) => !v.ok).map(([k]) => k);

    it('carries nsenter, iptables of both flavours, and ip', async () => {
      const version = (bin: string, arg: string) =>
        podman.ok(['run', '--rm', '--network', 'none', '--entrypoint', bin, IMAGE, arg]);
      assert.match(await version('iptables-legacy', '-V'), /^iptables v1\.8\.\d+ \(legacy\)/);
      assert.match(await version('iptables-nft', '-V'), /^iptables v1\.8\.\d+ \(nf_tables\)/);
      assert.match(await version('ip6tables-legacy-restore', '-V'), /\(legacy\)/);
      assert.match(await version('ip6tables-nft-save', '-V'), /\(nf_tables\)/);
      assert.match(await version('nsenter', '--version'), /^nsenter from util-linux/);
      assert.match(await version('ip', '-V'), /^ip utility, iproute2-/);
    });

    it("with the component's four capabilities: opens a uid-65535 process's netns through /host/proc, restores a rule of each flavour there through nsenter and fd 3, and mesh-validation passes in it", async () => {
      const caps = agentContainer(rendered.objects).securityContext?.capabilities?.add ?? [];
      const steps = await probe(caps);
      assert.deepEqual([...steps.keys()], STEPS);
      assert.deepEqual(failed(steps), [], JSON.stringify(Object.fromEntries(steps), null, 1));
    });

    // The minimum: each capability dropped in turn makes a named step fail (README, "Deploying").
    const WITHOUT: [string, string[], RegExp][] = [
      ['SYS_PTRACE', ['open'], /EACCES/],
      ['SYS_ADMIN', ['setns'], /reassociate to namespace 'ns\/net' failed: Operation not permitted/],
      [
        'NET_ADMIN',
        ['restore-legacy', 'save-legacy', 'restore-nft', 'save-nft', 'route', 'validation'],
        /unable to initialize table 'nat'/,
      ],
      ['NET_RAW', ['restore-legacy', 'save-legacy'], /unable to initialize table 'nat'/],
    ];
    it('the table covers exactly the capabilities the component adds', () => {
      assert.deepEqual(
        [...(agentContainer(rendered.objects).securityContext?.capabilities?.add ?? [])].sort(),
        WITHOUT.map(([c]) => c).sort(),
      );
    });
    it('without the private /run: iptables-legacy cannot lock (read-only root), nft is unaffected', async () => {
      const steps = await probe(agentContainer(rendered.objects).securityContext?.capabilities?.add ?? [], {
        lockMount: false,
      });
      assert.deepEqual(failed(steps), ['restore-legacy', 'save-legacy'], JSON.stringify(Object.fromEntries(steps)));
      assert.match(
        steps.get('restore-legacy')!.detail,
        /can't open lock file \/run\/xtables\.lock: Read-only file system/,
      );
    });
    for (const [cap, failing, message] of WITHOUT) {
      it(`without ${cap}: ${failing.join(', ')} fail`, async () => {
        const caps = (agentContainer(rendered.objects).securityContext?.capabilities?.add ?? []).filter(
          (c) => c !== cap,
        );
        const steps = await probe(caps);
        assert.deepEqual(failed(steps), failing, JSON.stringify(Object.fromEntries(steps), null, 1));
        assert.match(steps.get(failing[0]!)!.detail, message);
      });
    }
  });

  describe('run as deploy/ runs it, on a sandbox node', () => {
    let rendered: Rendered;
    let tree: HostTree;
    let runDir: string;
    let templateDir: string;
    let api: TestApiServer;
    let agentToken: string;
    const name = `mcni-image-agent-${process.pid}`;
    before(async () => {
      rendered = kustomize(DEPLOY_DIR);
      api = await startTestApiServer();
      for (const sa of ['mesh-cni', 'mesh-cni-plugin'])
        api.serviceAccount('mesh-system', sa, rulesFor(rendered.objects, 'mesh-system', sa));
      agentToken = api.serviceAccount('mesh-system', 'mesh-cni');
      // The service-account dir the kubelet would project: the agent's token, the CA, the namespace.
      tree = await makeHostTree({ token: agentToken, ca: api.caPem });
      await fs.rm(path.join(tree.binariesDir, 'mesh-cni'));
      await fs.writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
      runDir = path.join(tree.root, 'var-run-mesh-cni');
      templateDir = path.join(tree.root, 'configmap');
      await fs.mkdir(runDir);
      await fs.mkdir(templateDir);
      const cm = one<V1ConfigMap>(rendered.objects, 'ConfigMap');
      for (const [k, v] of Object.entries(cm.data ?? {})) await fs.writeFile(path.join(templateDir, k), v);
    });
    after(async () => {
      await podman.run(['rm', '--force', '--time', '0', name]);
      await tree.remove();
      await api?.close();
    });

    it('installs binary, orchconfig and entry with no capabilities on a read-only root, is ready, and SIGTERM takes them out', async () => {
      const ds = one<V1DaemonSet>(rendered.objects, 'DaemonSet');
      const volumeDirs: Record<string, string> = {};
      for (const v of ds.spec!.template.spec!.volumes ?? []) {
        const where: Record<string, string> = {
          '/opt/cni/bin': tree.binDir,
          '/etc/cni/net.d': tree.netDir,
          '/var/run/mesh-cni': runDir,
        };
        volumeDirs[v.name] = v.hostPath ? where[v.hostPath.path]! : templateDir;
      }
      // The host network, as the manifest says, to reach the test API server on loopback; the
      // fixed ports (monitoring 15014, ControlZ 9876) are moved to free ones so this machine's
      // own are never taken.
      const monitoringPort = await freePort();
      const { flags, args } = podmanRunArgs(rendered.objects, {
        volumeDirs,
        env: {
          NODE_NAME: 'node-1',
          HOST_IP: '198.19.250.1',
          POD_NAME: 'mesh-cni-node-abcde',
          POD_NAMESPACE: 'mesh-system',
          KUBERNETES_SERVICE_HOST: api.host,
          KUBERNETES_SERVICE_PORT: String(api.port),
          MONITORING_PORT: String(monitoringPort),
          CLEANUP_ON_EXIT: 'always',
          REPAIR_ENABLED: 'false',
        },
        extraMounts: [[tree.saDir, `${SERVICE_ACCOUNT_MOUNT}:ro`]],
      });
      assert.ok(
        flags.includes('--network') && flags[flags.indexOf('--network') + 1] === 'host',
        'the DaemonSet runs on the host network',
      );
      const primary = await fs.readFile(path.join(tree.netDir, '10-bridge.conflist'));
      await podman.ok(['run', '--detach', '--name', name, ...flags, IMAGE, ...args, '--ctrlz_port=0']);

      const binary = path.join(tree.binDir, 'mesh-cni');
      const orchconfig = path.join(tree.netDir, 'ZZZ-mesh-cni-orchconfig');
      const readyz = () =>
        podman.run([
          'exec',
          name,
          '/usr/bin/node',
          '-e',
          `fetch('http://127.0.0.1:${monitoringPort}/readyz').then(async r=>{console.log(r.status, await r.text());process.exit(r.status===200?0:1)},()=>process.exit(2))`,
        ]);
      await eventually(
        async () => (await readyz()).code === 0,
        '/readyz of the agent in the image to answer 200',
        60_000,
      ).catch(async (e: Error) => {
        const logs = await podman.run(['logs', name]);
        throw new Error(`${e.message}; /readyz: ${(await readyz()).stdout}; logs:\n${logs.stdout}${logs.stderr}`);
      });
      assert.deepEqual(
        await fs.readFile(binary),
        await fs.readFile(path.join(ROOT, 'dist/bin/mesh-cni')),
        'the plugin executable was copied whole',
      );
      assert.equal((await fs.stat(binary)).mode & 0o777, 0o755);
      assert.equal((await fs.stat(orchconfig)).mode & 0o777, 0o600);
      // The orchconfig holds the plugin's minted token; the agent's own is on no file of the node.
      const written = (JSON.parse(await fs.readFile(orchconfig, 'utf8')) as { users: { user: { token: string } }[] })
        .users[0]!.user.token;
      assert.equal(api.issuedTokens().find((t) => t.token === written)?.serviceAccount, 'mesh-system/mesh-cni-plugin');
      for (const dir of [tree.netDir, tree.binDir, runDir]) {
        for (const e of await fs.readdir(dir, { withFileTypes: true, recursive: true })) {
          if (e.isFile())
            assert.ok(
              !(await fs.readFile(path.join(e.parentPath, e.name))).includes(agentToken),
              `${path.join(e.parentPath, e.name)} holds the agent's token`,
            );
        }
      }
      assert.deepEqual(
        api.requests.filter((r) => r.status === 403).map((r) => `${r.method} ${r.path}`),
        [],
        "the agent in the image stays within deploy/'s rights",
      );
      // The default (--mesh-owned-cni-config=false): our entry spliced into the primary's file,
      // no file of our own.
      const owned = path.join(tree.netDir, '02-mesh-cni.conflist');
      assert.ok(!existsSync(owned), 'no owned config file by default');
      const conf = JSON.parse(await fs.readFile(path.join(tree.netDir, '10-bridge.conflist'), 'utf8')) as {
        plugins: { type: string; log_uds_address?: string; pod_lookup_timeout_ms?: number }[];
      };
      assert.deepEqual(
        conf.plugins.map((p) => p.type),
        ['bridge', 'mesh-cni'],
      );
      // The entry came from the ConfigMap's template (it alone sets the lookup timeout).
      assert.equal(conf.plugins[1]!.pod_lookup_timeout_ms, 10000);
      assert.equal(conf.plugins[1]!.log_uds_address, '/var/run/mesh-cni/log.sock');
      assert.ok(existsSync(path.join(runDir, 'log.sock')), 'the plugin log socket is in the host dir');

      await podman.ok(['stop', '--time', '25', name], { timeoutMs: 60_000 });
      const state = JSON.parse(await podman.ok(['inspect', '--format', '{{json .State}}', name])) as {
        ExitCode: number;
      };
      assert.equal(state.ExitCode, 0, "SIGTERM ends it with exit code 0 (not the runtime's SIGKILL)");
      assert.deepEqual(
        await fs.readFile(path.join(tree.netDir, '10-bridge.conflist')),
        primary,
        'the primary config is byte for byte the original',
      );
      assert.ok(!existsSync(orchconfig), 'orchconfig removed');
      assert.ok(!existsSync(owned), 'no owned config file left');
      assert.ok(existsSync(binary), 'binary kept: DELs of pods started while installed run it');
    });
  });
});

/**
 * Run inside the image by node: what repair in place does, step by step, against the netns of
 * process argv[2] found through the host's /proc at /host/proc; one JSON line per step. The netns
 * is held by fd and handed to nsenter as its fd 3, as src/podnetns runs programs in a pod's netns.
 * It stops after the first step when the netns cannot be opened or entered.
 */
const IN_PLACE_PROBE = `
const fs = require('fs');
const { spawnSync } = require('child_process');
const say = (step, ok, detail) => console.log(JSON.stringify({ step, ok, detail: String(detail).trim().slice(0, 400) }));
let fd;
try { fd = fs.openSync('/host/proc/' + process.argv[2] + '/ns/net', 'r'); say('open', true, ''); }
catch (e) { say('open', false, e.code); process.exit(0); }
const inNetns = (argv, input) => {
  const r = spawnSync('nsenter', ['--net=/proc/self/fd/3', '--', ...argv],
    { input, encoding: 'utf8', stdio: ['pipe', 'pipe', 'pipe', fd], timeout: 20000 });
  return { code: r.status, out: r.stdout, err: r.stderr + (r.error ? r.error.message : '') };
};
let r = inNetns(['ip', '-j', 'addr']);
if (/reassociate|setns/.test(r.err)) { say('setns', false, r.err); process.exit(0); }
say('setns', true, '');
say('addr', r.code === 0 && JSON.parse(r.out).some((l) => l.addr_info.some((a) => a.local === process.argv[3])), r.err);
// Both families, as the plugin restores them: one document per family and flavour.
for (const fl of ['legacy', 'nft']) {
  const rule = (probe, v) => '*nat\\n-A OUTPUT -d ' + probe + ' -p tcp -m tcp --dport 15002' +
    ' -m comment --comment mcni-' + fl + v + ' -j REDIRECT --to-ports 15002\\nCOMMIT\\n';
  const docs = [['iptables', rule('192.0.2.6/32', 4), 4], ['ip6tables', rule('2001:db8::6/128', 6), 6]];
  const restored = docs.map(([bin, doc]) => inNetns([bin + '-' + fl + '-restore', '--noflush', '-w', '5'], doc));
  say('restore-' + fl, restored.every((x) => x.code === 0), restored.map((x) => x.err).join(''));
  const saved = docs.map(([bin, , v]) => [inNetns([bin + '-' + fl + '-save', '-t', 'nat']), v]);
  const shows = ([x, v]) => x.code === 0 && x.out.includes('--comment mcni-' + fl + v + ' -j REDIRECT');
  say('save-' + fl, saved.every(shows), saved.map(([x]) => x.err).join(''));
}
// TPROXY mode's policy routing in the pod's netns (what the plugin adds beside the chains).
const rule = inNetns(['ip', 'rule', 'add', 'fwmark', '0x539', 'lookup', '133', 'priority', '32764']);
const route = inNetns(['ip', 'route', 'replace', 'local', 'default', 'dev', 'lo', 'table', '133']);
const shown = inNetns(['ip', 'rule', 'show']);
inNetns(['ip', 'rule', 'del', 'priority', '32764']);
say('route', rule.code === 0 && route.code === 0 && /fwmark 0x539 lookup 133/.test(shown.out), rule.err + route.err);
r = inNetns(['/usr/bin/node', '/opt/mesh-cni/mesh-validation.cjs', '--probe-timeout', '3s']);
say('validation', r.code === 0, r.err + r.out);
`;

/** A TCP port free on this machine now. */
async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as { port: number };
      srv.close(() => resolve(port));
    });
  });
}
