// A throwaway CA and a server certificate it signed, made with the openssl CLI (node:crypto cannot
// issue X.509 certificates). SANs cover how tests and kubectl dial a local server.

import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

export interface TestCerts {
  readonly caPem: string;
  readonly certPem: string;
  readonly keyPem: string;
}

export async function makeTestCerts(cn = 'mesh-cni-test-apiserver'): Promise<TestCerts> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'mcni-certs-'));
  try {
    const f = (n: string) => path.join(dir, n);
    const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
    await run('openssl', [
      'req',
      '-x509',
      ...ec,
      '-keyout',
      f('ca.key'),
      '-out',
      f('ca.crt'),
      '-days',
      '2',
      '-subj',
      `/CN=${cn}-ca`,
      '-addext',
      'basicConstraints=critical,CA:TRUE',
      '-addext',
      'keyUsage=critical,keyCertSign,cRLSign',
    ]);
    await run('openssl', [
      'req',
      '-new',
      ...ec,
      '-keyout',
      f('server.key'),
      '-out',
      f('server.csr'),
      '-subj',
      `/CN=${cn}`,
    ]);
    await writeFile(
      f('ext.cnf'),
      [
        'basicConstraints=CA:FALSE',
        'keyUsage=critical,digitalSignature,keyEncipherment',
        'extendedKeyUsage=serverAuth',
        'subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost',
        '',
      ].join('\n'),
    );
    await run('openssl', [
      'x509',
      '-req',
      '-in',
      f('server.csr'),
      '-CA',
      f('ca.crt'),
      '-CAkey',
      f('ca.key'),
      '-CAcreateserial',
      '-out',
      f('server.crt'),
      '-days',
      '2',
      '-extfile',
      f('ext.cnf'),
    ]);
    const [caPem, certPem, keyPem] = await Promise.all(
      [f('ca.crt'), f('server.crt'), f('server.key')].map((p) => readFile(p, 'utf8')),
    );
    return { caPem: caPem!, certPem: certPem!, keyPem: keyPem! };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
