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
// Ambient: `ipset version`; as the ambient component runs the image (in a test netns standing for
// the node), a hash:ip comment set is made, filled and destroyed with NET_ADMIN alone (and not
// without it); the seqpacket addon listens on ztunnel's socket in its mounted dir (0600, root's:
// uid 65534 is refused, root gets a message with a netns fd), and a netns made after the start
// appears under /host/var/run/netns (read-only, HostToContainer) and is entered through fd 3;
// and the agent itself runs ambient mode so, with the component's RBAC on the test API server.
// Native nftables: the image's nft is at least 1.0.1 and older than 1.1.2, and as the
// native-nftables component runs the image (in a test netns standing for the node) `nft -j list
// tables` answers with NET_ADMIN alone (not without it); a table with a set the image's nft writes
// there is read back by this machine's nft (`nft -j list ruleset`); the agent chooses nftables,
// writes native_nftables: true and is ready, and without NET_ADMIN it is not ready.
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
import { forwardLoopback, makePodman, type Podman } from '../helpers/podman.ts';
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
      // The component used as docs/install.md says: from an operator's kustomization next to deploy/.
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

    // The minimum: each capability dropped in turn makes a named step fail (docs/install.md, "Deploying").
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

  describe('ambient: ipset, the netns dir, the ztunnel socket, with the ambient component as it runs the image', () => {
    const POD_IP = '198.18.78.2';
    const SET_IP = '198.18.78.5';
    let dir: string;
    let rendered: Rendered;
    /** Stands for the node: the container's network namespace, as hostNetwork makes it the node's. */
    let node: Netns;
    /** The pod's netns, made by `ip netns add` (as a runtime does) after the container started. */
    const podNs = `mcni-amb-pod-${process.pid}`;
    const name = `mcni-image-ambient-${process.pid}`;
    before(async () => {
      dir = await fs.mkdtemp(path.join(os.tmpdir(), 'mcni-image-ambient-'));
      await fs.chmod(dir, 0o755);
      const rel = path.relative(dir, DEPLOY_DIR);
      await fs.writeFile(
        path.join(dir, 'kustomization.yaml'),
        `resources:\n  - ${rel}\ncomponents:\n  - ${rel}/overlays/ambient\n`,
      );
      rendered = kustomize(dir);
      await fs.writeFile(path.join(dir, 'probe.cjs'), AMBIENT_PROBE);
      // The host's side of the socket checks, with the build's addon (copied: a rebuild may replace dist/).
      await fs.copyFile(path.join(ROOT, 'dist/native/seqpacket.node'), path.join(dir, 'seqpacket.node'));
      await fs.writeFile(path.join(dir, 'peer.cjs'), ZTUNNEL_PEER);
      for (const f of ['seqpacket.node', 'peer.cjs', 'probe.cjs']) await fs.chmod(path.join(dir, f), 0o644);
      for (const d of ['bin', 'net', 'run', 'template', 'lock']) await fs.mkdir(path.join(dir, d));
      // The kubelet's DirectoryOrCreate makes the ztunnel dir 0755, root's.
      await fs.mkdir(path.join(dir, 'ztunnel'), { mode: 0o755 });
      node = new Netns('ambnode');
    });
    after(async () => {
      await podman.run(['rm', '--force', '--time', '0', name]);
      await run('ip', ['netns', 'del', podNs]);
      node?.remove();
      if (dir) await fs.rm(dir, { recursive: true, force: true });
    });

    /** `podman run` flags of the ambient render, in the node netns, with these capabilities. */
    function runFlags(
      caps: readonly string[],
      o: {
        volumeDirs?: Record<string, string>;
        env?: Record<string, string>;
        extraMounts?: (readonly [string, string])[];
      } = {},
    ): string[] {
      const { flags } = podmanRunArgs(rendered.objects, {
        volumeDirs: {
          'cni-bin-dir': path.join(dir, 'bin'),
          'cni-net-dir': path.join(dir, 'net'),
          'mesh-cni-run': path.join(dir, 'run'),
          'cni-network-config': path.join(dir, 'template'),
          'host-proc': '/proc',
          'xtables-lock': path.join(dir, 'lock'),
          'host-netns': '/run/netns',
          'ztunnel-socket': path.join(dir, 'ztunnel'),
          ...o.volumeDirs,
        },
        env: {
          NODE_NAME: 'node-1',
          HOST_IP: '198.19.250.1',
          POD_NAME: 'mesh-cni-node-y',
          POD_NAMESPACE: 'mesh-system',
          ...o.env,
        },
        network: `ns:${node.path}`,
        ...(o.extraMounts ? { extraMounts: o.extraMounts } : {}),
      });
      const out: string[] = [];
      for (let i = 0; i < flags.length; i++) {
        if (flags[i] === '--cap-add') i++;
        // mountPropagation: HostToContainer is a slave mount (podman's rslave).
        else if (flags[i] === '--volume' && flags[i + 1]!.endsWith(':/host/var/run/netns:ro'))
          out.push(flags[i]!, `${flags[++i]!},rslave`);
        else out.push(flags[i]!);
      }
      for (const c of caps) out.push('--cap-add', c);
      return out;
    }
    const probeArgs = ['--volume', '', '--entrypoint', '/usr/bin/node', IMAGE, '/probe.cjs'];
    const withProbe = (args: string[]) => {
      const a = [...probeArgs];
      a[1] = `${path.join(dir, 'probe.cjs')}:/probe.cjs:ro`;
      return [...args, ...a];
    };
    const steps = (out: string) =>
      new Map(
        out
          .trim()
          .split('\n')
          .filter((l) => l.startsWith('{'))
          .map((l) => {
            const { step, ok, detail } = JSON.parse(l) as { step: string; ok: boolean; detail: string };
            return [step, { ok, detail }] as const;
          }),
      );
    const ambientCaps = () => agentContainer(rendered.objects).securityContext?.capabilities?.add ?? [];

    it('carries ipset, which runs (`ipset version` asks the kernel: root with NET_ADMIN alone)', async () => {
      const base = ['run', '--rm', '--network', 'none', '--user', '0:0', '--cap-drop', 'ALL'];
      const v = await podman.ok([...base, '--cap-add', 'NET_ADMIN', '--entrypoint', 'ipset', IMAGE, 'version']);
      assert.match(v, /^ipset v\d+\.\d+, protocol version: \d+/);
      const none = await podman.run([...base, '--entrypoint', 'ipset', IMAGE, 'version']);
      assert.match(none.stderr, /Kernel error received: Operation not permitted/);
    });

    it('ipset needs NET_ADMIN and nothing more: a hash:ip comment set is made, filled and destroyed in the node netns', async () => {
      const only = steps(await podman.ok(['run', '--rm', ...withProbe(runFlags(['NET_ADMIN'])), 'ipset', SET_IP]));
      assert.deepEqual(Object.fromEntries(only), { ipset: { ok: true, detail: '' } });
      assert.equal(node.exec(['ipset', 'list', '-n']).trim(), '', 'the set is gone from the node netns');
      const without = steps(
        await podman.ok([
          'run',
          '--rm',
          ...withProbe(runFlags(ambientCaps().filter((c) => c !== 'NET_ADMIN'))),
          'ipset',
          SET_IP,
        ]),
      );
      assert.equal(without.get('ipset')?.ok, false);
      assert.match(without.get('ipset')!.detail, /Operation not permitted|permission/i);
    });

    it("with the component's capabilities: ipset, a netns the runtime made after the start opened read-only and entered, a 0600 ztunnel socket only root reaches, a netns fd sent over it", async () => {
      await podman.ok([
        'run',
        '--detach',
        '--name',
        name,
        ...withProbe(runFlags(ambientCaps())),
        'all',
        SET_IP,
        podNs,
        POD_IP,
      ]);
      const logs = async () => {
        const r = await podman.run(['logs', name]);
        return r.stdout + r.stderr;
      };
      await eventually(async () => (await logs()).includes('"step":"listen"'), 'the agent side to listen', 30_000);
      const sock = path.join(dir, 'ztunnel', 'ztunnel.sock');
      const st = await fs.lstat(sock);
      assert.ok(st.isSocket());
      assert.deepEqual([st.mode & 0o7777, st.uid], [0o600, 0], 'the socket is 0600, root');
      // Any other user on the node is refused by the socket's mode (ztunnel's pod runs as uid 0).
      const peerArgs = [path.join(dir, 'peer.cjs'), path.join(dir, 'seqpacket.node'), sock];
      const peer = (user: string[]) =>
        user.length ? run('setpriv', [...user, process.execPath, ...peerArgs]) : run(process.execPath, peerArgs);
      const nobody = await peer(['--reuid', '65534', '--regid', '65534', '--clear-groups', '--']);
      assert.match(nobody.stdout, /^connect -13\b/m, `uid 65534: ${nobody.stdout}${nobody.stderr}`);
      // The pod's netns appears after the agent started: HostToContainer brings it in.
      for (const argv of [
        ['netns', 'add', podNs],
        ['-n', podNs, 'link', 'add', 'mcni-a0', 'type', 'veth', 'peer', 'name', 'mcni-a1'],
        ['-n', podNs, 'addr', 'add', `${POD_IP}/24`, 'dev', 'mcni-a0'],
      ]) {
        const r = await run('ip', argv);
        assert.equal(r.code, 0, `ip ${argv.join(' ')}: ${r.stderr}`);
      }
      const root = await peer([]);
      const want = (await fs.stat(`/run/netns/${podNs}`)).ino;
      // It ends after the send, or at the first step that failed (then named by the check below).
      await eventually(async () => /"step":"accept-send"|"ok":false/.test(await logs()), 'the agent side', 40_000);
      await podman.ok(['wait', name], { timeoutMs: 60_000 });
      const s = steps(await logs());
      assert.deepEqual(
        [...s].filter(([, v]) => !v.ok).map(([k, v]) => `${k}: ${v.detail}`),
        [],
      );
      assert.match(root.stdout, new RegExp(`^got 5 hello netns ${want}$`, 'm'), `root: ${root.stdout}${root.stderr}`);
      assert.deepEqual([...s.keys()], ['ipset', 'listen', 'netns-open', 'netns-enter', 'accept-send']);
      assert.equal(node.exec(['ipset', 'list', '-n']).trim(), '');
    });

    it('the agent in the image runs ambient mode with exactly what the component grants: ready, both sockets, the host rule and probe set in the node netns, no 403; SIGTERM (uninstall) takes them out', async () => {
      const agentName = `${name}-agent`;
      const api = await startTestApiServer();
      let tree: HostTree | undefined;
      let forward: { close(): Promise<void> } | undefined;
      try {
        for (const sa of ['mesh-cni', 'mesh-cni-plugin'])
          api.serviceAccount('mesh-system', sa, rulesFor(rendered.objects, 'mesh-system', sa));
        const agentToken = api.serviceAccount('mesh-system', 'mesh-cni');
        api.upsertNamespace({ metadata: { name: 'default' } });
        tree = await makeHostTree({ token: agentToken, ca: api.caPem });
        await fs.rm(path.join(tree.binariesDir, 'mesh-cni'));
        await fs.writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
        const runDir = path.join(tree.root, 'var-run-mesh-cni');
        const templateDir = path.join(tree.root, 'configmap');
        const ztunnelDir = path.join(tree.root, 'var-run-ztunnel');
        for (const d of [runDir, templateDir, ztunnelDir]) await fs.mkdir(d, { mode: 0o755 });
        const cm = one<V1ConfigMap>(rendered.objects, 'ConfigMap');
        for (const [k, v] of Object.entries(cm.data ?? {})) await fs.writeFile(path.join(templateDir, k), v);
        // The API server listens on this machine's loopback; the container is in the node netns.
        forward = await forwardLoopback(node.path, api.port);
        const primary = await fs.readFile(path.join(tree.netDir, '10-bridge.conflist'));
        const flags = runFlags(ambientCaps(), {
          volumeDirs: {
            'cni-bin-dir': tree.binDir,
            'cni-net-dir': tree.netDir,
            'mesh-cni-run': runDir,
            'cni-network-config': templateDir,
            'ztunnel-socket': ztunnelDir,
          },
          env: {
            KUBERNETES_SERVICE_HOST: '127.0.0.1',
            KUBERNETES_SERVICE_PORT: String(api.port),
            CLEANUP_ON_EXIT: 'always',
            REPAIR_ENABLED: 'false',
            // Here even root cannot open /proc/1/ns/net (a quirk of this machine's sandbox): the
            // agent's own netns, the node netns of this test, stands for the host's.
            HOST_NETNS_PATH: '/proc/self/ns/net',
          },
          extraMounts: [[tree.saDir, `${SERVICE_ACCOUNT_MOUNT}:ro`]],
        });
        await podman.ok(['run', '--detach', '--name', agentName, ...flags, IMAGE, '--ctrlz_port=0']);
        const readyz = () =>
          podman.run([
            'exec',
            agentName,
            '/usr/bin/node',
            '-e',
            "fetch('http://127.0.0.1:15014/readyz').then(async r=>{console.log(r.status, await r.text());process.exit(r.status===200?0:1)},()=>process.exit(2))",
          ]);
        await eventually(
          async () => (await readyz()).code === 0,
          '/readyz of the ambient agent to answer 200',
          60_000,
        ).catch(async (e: Error) => {
          const logs = await podman.run(['logs', agentName]);
          throw new Error(`${e.message}; /readyz: ${(await readyz()).stdout}; logs:\n${logs.stdout}${logs.stderr}`);
        });
        const zds = await fs.lstat(path.join(ztunnelDir, 'ztunnel.sock'));
        assert.ok(zds.isSocket(), 'the ZDS socket is in the host dir');
        assert.deepEqual([zds.mode & 0o7777, zds.uid], [0o600, 0]);
        assert.ok((await fs.lstat(path.join(runDir, 'pluginevent.sock'))).isSocket(), "the plugin's /cmdadd socket");
        const conf = JSON.parse(await fs.readFile(path.join(tree.netDir, '10-bridge.conflist'), 'utf8')) as {
          plugins: { type: string; ambient_enabled?: boolean; pluginevent_uds_address?: string }[];
        };
        assert.equal(conf.plugins[1]?.ambient_enabled, true);
        assert.equal(conf.plugins[1]?.pluginevent_uds_address, '/var/run/mesh-cni/pluginevent.sock');
        const nodeRules = () =>
          ['iptables-legacy-save', 'iptables-nft-save'].map((b) => node.exec([b, '-t', 'nat'])).join('');
        assert.match(nodeRules(), /-A POSTROUTING -j MESH_POSTRT/, "the probe SNAT rule in the node's netns");
        assert.match(node.exec(['ipset', 'list', '-n']), /^mesh-inpod-probes-v4$/m);
        assert.deepEqual(
          api.requests.filter((r) => r.status === 403).map((r) => `${r.method} ${r.path}`),
          [],
          'the agent stays within the rights of deploy/ with the ambient component',
        );
        await podman.ok(['stop', '--time', '25', agentName], { timeoutMs: 60_000 });
        const state = JSON.parse(await podman.ok(['inspect', '--format', '{{json .State}}', agentName])) as {
          ExitCode: number;
        };
        assert.equal(state.ExitCode, 0);
        assert.doesNotMatch(nodeRules(), /MESH_POSTRT/, 'the uninstall removed the host rule');
        assert.doesNotMatch(node.exec(['ipset', 'list', '-n']), /mesh-inpod-probes/, 'and the probe sets');
        assert.deepEqual(await fs.readFile(path.join(tree.netDir, '10-bridge.conflist')), primary);
      } finally {
        await podman.run(['rm', '--force', '--time', '0', agentName]);
        await forward?.close();
        await tree?.remove();
        await api.close();
      }
    });
  });

  describe("native nftables: the image's nft, with the native-nftables component as it runs the image", () => {
    let dir: string;
    let rendered: Rendered;
    /** Stands for the node: the container's network namespace, as hostNetwork makes it the node's. */
    let node: Netns;
    const name = `mcni-image-nft-${process.pid}`;
    before(async () => {
      dir = await fs.mkdtemp(path.join(os.tmpdir(), 'mcni-image-nft-'));
      await fs.chmod(dir, 0o755);
      const rel = path.relative(dir, DEPLOY_DIR);
      await fs.writeFile(
        path.join(dir, 'kustomization.yaml'),
        `resources:\n  - ${rel}\ncomponents:\n  - ${rel}/overlays/native-nftables\n`,
      );
      rendered = kustomize(dir);
      // What the agent's ambient host table holds, in kind: a set with elements, a base chain, a rule with a counter.
      await fs.writeFile(path.join(dir, 'table.nft'), NFT_TABLE);
      await fs.chmod(path.join(dir, 'table.nft'), 0o644);
      for (const d of ['bin', 'net', 'run', 'template']) await fs.mkdir(path.join(dir, d));
      node = new Netns('nftnode');
    });
    after(async () => {
      await podman.run(['rm', '--force', '--time', '0', name]);
      node?.remove();
      if (dir) await fs.rm(dir, { recursive: true, force: true });
    });

    const componentCaps = () => agentContainer(rendered.objects).securityContext?.capabilities?.add ?? [];
    /** `podman run` flags of the component's render, in the node netns, with these capabilities. */
    function runFlags(
      caps: readonly string[],
      o: { volumeDirs?: Record<string, string>; env?: Record<string, string>; extraMounts?: [string, string][] } = {},
    ): string[] {
      const { flags } = podmanRunArgs(rendered.objects, {
        volumeDirs: {
          'cni-bin-dir': path.join(dir, 'bin'),
          'cni-net-dir': path.join(dir, 'net'),
          'mesh-cni-run': path.join(dir, 'run'),
          'cni-network-config': path.join(dir, 'template'),
          ...o.volumeDirs,
        },
        env: {
          NODE_NAME: 'node-1',
          HOST_IP: '198.19.250.1',
          POD_NAME: 'mesh-cni-node-n',
          POD_NAMESPACE: 'mesh-system',
          ...o.env,
        },
        network: `ns:${node.path}`,
        ...(o.extraMounts ? { extraMounts: o.extraMounts } : {}),
      });
      const out: string[] = [];
      for (let i = 0; i < flags.length; i++) {
        if (flags[i] === '--cap-add') i++;
        else out.push(flags[i]!);
      }
      for (const c of caps) out.push('--cap-add', c);
      return out;
    }
    const nft = (caps: readonly string[], args: readonly string[], extra: readonly string[] = []) =>
      podman.run(['run', '--rm', ...runFlags(caps), ...extra, '--entrypoint', 'nft', IMAGE, ...args]);

    it("carries nft of at least 1.0.1 and older than 1.1.2 (Debian bookworm's 1.0.6)", async () => {
      const v = await podman.ok(['run', '--rm', '--network', 'none', '--entrypoint', 'nft', IMAGE, '--version']);
      const m = /^nftables v(\d+)\.(\d+)\.(\d+)\b/.exec(v);
      assert.ok(m, `nft --version: ${v}`);
      const n = m.slice(1).map(Number) as [number, number, number];
      const atLeast = (a: readonly number[]) => n[0] - a[0]! || n[1] - a[1]! || n[2] - a[2]!;
      assert.ok(atLeast([1, 0, 1]) >= 0, `${v.trim()}: the agent needs nft >= 1.0.1`);
      assert.ok(atLeast([1, 1, 2]) < 0, `${v.trim()}: nft 1.1.2 and later write sets older nft crashes on`);
    });

    it('the component grants NET_ADMIN alone: `nft -j list tables` answers in the node netns with it (no NET_RAW), and not without it', async () => {
      assert.deepEqual(componentCaps(), ['NET_ADMIN']);
      const listed = await nft(componentCaps(), ['-j', 'list', 'tables']);
      assert.equal(listed.code, 0, listed.stderr);
      const json = JSON.parse(listed.stdout) as { nftables: { metainfo?: { json_schema_version: number } }[] };
      assert.equal(json.nftables[0]?.metainfo?.json_schema_version, 1);
      const without = await nft([], ['-j', 'list', 'tables']);
      assert.notEqual(without.code, 0);
      assert.match(without.stderr, /Operation not permitted/);
    });

    it("what the image's nft writes in the node netns, this machine's nft reads back (`nft -j list ruleset`)", async () => {
      const wrote = await nft(
        componentCaps(),
        ['-f', '/table.nft'],
        ['--volume', `${path.join(dir, 'table.nft')}:/table.nft:ro`],
      );
      assert.equal(wrote.code, 0, wrote.stderr);
      try {
        const r = await run('ip', ['netns', 'exec', node.name, 'nft', '-j', 'list', 'ruleset']);
        assert.equal(r.code, 0, `the host's nft: ${r.stderr} (exit ${r.code})`);
        const items = (JSON.parse(r.stdout) as { nftables: Record<string, { name?: string; elem?: unknown[] }>[] })
          .nftables;
        const set = items.find((i) => i.set?.name === 'mcni_probes')?.set;
        assert.deepEqual(set?.elem, ['198.18.79.5', '198.18.79.6']);
        assert.ok(items.some((i) => i.chain?.name === 'postrouting'));
        assert.equal(items.filter((i) => i.rule).length, 1);
        // And as text, the way a node's admin reads it.
        assert.match(node.exec(['nft', 'list', 'table', 'inet', 'mcni_image']), /ip daddr @mcni_probes counter/);
      } finally {
        node.exec(['nft', 'delete', 'table', 'inet', 'mcni_image']);
      }
    });

    it('the agent in the image chooses nftables in the node netns and is ready; without NET_ADMIN it is not ready, saying so', async () => {
      const api = await startTestApiServer();
      let tree: HostTree | undefined;
      let forward: { close(): Promise<void> } | undefined;
      try {
        for (const sa of ['mesh-cni', 'mesh-cni-plugin'])
          api.serviceAccount('mesh-system', sa, rulesFor(rendered.objects, 'mesh-system', sa));
        const agentToken = api.serviceAccount('mesh-system', 'mesh-cni');
        tree = await makeHostTree({ token: agentToken, ca: api.caPem });
        await fs.rm(path.join(tree.binariesDir, 'mesh-cni'));
        await fs.writeFile(path.join(tree.netDir, '10-bridge.conflist'), BRIDGE_CONFLIST);
        const runDir = path.join(tree.root, 'var-run-mesh-cni');
        const templateDir = path.join(tree.root, 'configmap');
        for (const d of [runDir, templateDir]) await fs.mkdir(d, { mode: 0o755 });
        const cm = one<V1ConfigMap>(rendered.objects, 'ConfigMap');
        for (const [k, v] of Object.entries(cm.data ?? {})) await fs.writeFile(path.join(templateDir, k), v);
        // The API server listens on this machine's loopback; the container is in the node netns.
        forward = await forwardLoopback(node.path, api.port);
        const start = async (caps: readonly string[]) => {
          await podman.run(['rm', '--force', '--time', '0', name]);
          const flags = runFlags(caps, {
            volumeDirs: {
              'cni-bin-dir': tree!.binDir,
              'cni-net-dir': tree!.netDir,
              'mesh-cni-run': runDir,
              'cni-network-config': templateDir,
            },
            env: {
              KUBERNETES_SERVICE_HOST: '127.0.0.1',
              KUBERNETES_SERVICE_PORT: String(api.port),
              CLEANUP_ON_EXIT: 'always',
              REPAIR_ENABLED: 'false',
            },
            extraMounts: [[tree!.saDir, `${SERVICE_ACCOUNT_MOUNT}:ro`]],
          });
          await podman.ok(['run', '--detach', '--name', name, ...flags, IMAGE, '--ctrlz_port=0']);
        };
        const readyz = () =>
          podman.run([
            'exec',
            name,
            '/usr/bin/node',
            '-e',
            "fetch('http://127.0.0.1:15014/readyz').then(async r=>{console.log(r.status, await r.text());process.exit(r.status===200?0:1)},()=>process.exit(2))",
          ]);
        const logs = async () => {
          const r = await podman.run(['logs', name]);
          return r.stdout + r.stderr;
        };
        const choice = async () => {
          await eventually(async () => /redirect backend/.test(await logs()), 'the backend choice in the log', 60_000);
          return (await logs()).split('\n').find((l) => l.includes('redirect backend'))!;
        };
        const entry = async () =>
          (
            JSON.parse(await fs.readFile(path.join(tree!.netDir, '10-bridge.conflist'), 'utf8')) as {
              plugins: { type: string; native_nftables?: boolean }[];
            }
          ).plugins.find((p) => p.type === 'mesh-cni');

        await start(componentCaps());
        assert.match(await choice(), /\bbackend\W+nftables\b/);
        assert.doesNotMatch(await choice(), /cannot/, 'the node can: no reason given');
        await eventually(async () => (await readyz()).code === 0, '/readyz of the agent to answer 200', 60_000).catch(
          async (e: Error) => {
            throw new Error(`${e.message}; /readyz: ${(await readyz()).stdout}; logs:\n${await logs()}`);
          },
        );
        await eventually(
          async () => (await entry())?.native_nftables === true,
          'native_nftables: true in our entry',
          30_000,
        );
        assert.deepEqual(
          api.requests.filter((r) => r.status === 403).map((r) => `${r.method} ${r.path}`),
          [],
          'the agent stays within the rights of deploy/ with the component',
        );
        await podman.ok(['stop', '--time', '25', name], { timeoutMs: 60_000 });

        // Without NET_ADMIN the probe cannot list the node's tables: --native-nftables=true is not ready.
        await start([]);
        assert.match(await choice(), /\bbackend\W+nftables\b[^]*Operation not permitted/);
        await eventually(
          async () => /^503 [^]*nftables: [^]*Operation not permitted/.test((await readyz()).stdout),
          '/readyz to say 503, naming the refused nft',
          60_000,
        ).catch(async (e: Error) => {
          throw new Error(`${e.message}; /readyz: ${(await readyz()).stdout}; logs:\n${await logs()}`);
        });
        await podman.ok(['stop', '--time', '25', name], { timeoutMs: 60_000 });
      } finally {
        await podman.run(['rm', '--force', '--time', '0', name]);
        await forward?.close();
        await tree?.remove();
        await api.close();
      }
    });
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

/**
 * Run inside the image by node, as the ambient component runs it: argv mode ('ipset' | 'all'), the
 * IP for the probe set, the pod's netns name and IP. One JSON line per step. ipset in the
 * container's netns (the node's); then, with 'all': the addon listens on the ztunnel socket, the
 * pod's netns (made after the start) is opened under /host/var/run/netns and entered through fd 3,
 * and its fd is sent to the first peer that connects.
 */
const AMBIENT_PROBE = `
const fs = require('fs');
const { spawnSync } = require('child_process');
const say = (step, ok, detail) => console.log(JSON.stringify({ step, ok, detail: String(detail).trim().slice(0, 400) }));
const sleep = (ms) => Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
const [mode, setIp, podNs, podIp] = process.argv.slice(2);
const sh = (argv, fd) => {
  const stdio = ['ignore', 'pipe', 'pipe', ...(fd === undefined ? [] : [fd])];
  const r = spawnSync(argv[0], argv.slice(1), { encoding: 'utf8', timeout: 20000, stdio });
  return { code: r.status, out: r.stdout || '', err: (r.stderr || '') + (r.error ? r.error.message : '') };
};
const set = 'mcni-amb-probes-v4';
const made = sh(['ipset', 'create', set, 'hash:ip', 'comment']);
if (made.code !== 0) say('ipset', false, made.err);
else {
  const added = sh(['ipset', 'add', set, setIp, 'comment', 'pod-uid-1']);
  const saved = sh(['ipset', 'save', set]);
  const gone = sh(['ipset', 'destroy', set]);
  const listed = saved.out.includes('add ' + set + ' ' + setIp + ' comment "pod-uid-1"');
  say('ipset', added.code === 0 && listed && gone.code === 0, added.err + saved.err + gone.err + (listed ? '' : saved.out));
}
if (mode === 'ipset') process.exit(0);
const m = { exports: {} };
process.dlopen(m, '/opt/mesh-cni/native/seqpacket.node');
const n = m.exports;
const sock = '/var/run/ztunnel/ztunnel.sock';
const l = n.socket();
const b = n.bind(l, sock, 0o600);
const li = n.listen(l, 8);
say('listen', l >= 0 && b === 0 && li === 0, [l, b, li].join(' '));
let fd;
const until = Date.now() + 30000;
for (;;) {
  try { fd = fs.openSync('/host/var/run/netns/' + podNs, 'r'); break; }
  catch (e) { if (Date.now() > until) { say('netns-open', false, e.code); process.exit(0); } sleep(100); }
}
say('netns-open', true, '');
// The test gives the pod its address right after ip netns add: wait for it.
let a;
const until1 = Date.now() + 10000;
do {
  a = sh(['nsenter', '--net=/proc/self/fd/3', '--', 'ip', '-j', 'addr'], fd);
} while (a.code === 0 && !a.out.includes('"local":"' + podIp + '"') && Date.now() < until1 && sleep(100) !== 'x');
say('netns-enter', a.code === 0 && a.out.includes('"local":"' + podIp + '"'), a.err + a.out);
let c = -11;
const until2 = Date.now() + 30000;
while (c < 0 && Date.now() < until2) { c = n.accept(l); if (c < 0) sleep(50); }
const s = c >= 0 ? n.send(c, Buffer.from('hello'), [fd]) : c;
say('accept-send', c >= 0 && s === 5, c + ' ' + s);
n.close(l);
fs.unlinkSync(sock);
`;

/** ztunnel's side, on the host: connect to the socket (argv: addon, socket), print the errno or what came. */
const ZTUNNEL_PEER = `
const m = { exports: {} };
process.dlopen(m, process.argv[2]);
const n = m.exports;
const fd = n.socket();
const c = n.connect(fd, process.argv[3]);
console.log('connect', c);
if (c !== 0) process.exit(0);
const buf = Buffer.alloc(64);
const until = Date.now() + 30000;
let r;
for (;;) {
  r = n.recv(fd, buf);
  if (Array.isArray(r) || r !== -11 || Date.now() > until) break;
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 50);
}
if (!Array.isArray(r)) { console.log('recv', r); process.exit(0); }
const [bytes, , ...fds] = r;
const ino = fds.length === 1 ? require('fs').fstatSync(fds[0]).ino : -1;
console.log('got', bytes, buf.subarray(0, bytes).toString(), 'netns', ino);
`;

/**
 * Written by the image's nft in the node netns, read back by the host's: a set with elements (the
 * kind nft 1.1.2 and later give user data older nft crashes on), a base chain, a rule with a counter.
 */
const NFT_TABLE = `table inet mcni_image {
	set mcni_probes {
		type ipv4_addr
		elements = { 198.18.79.5, 198.18.79.6 }
	}
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip daddr @mcni_probes counter snat ip to 198.18.79.1
	}
}
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
