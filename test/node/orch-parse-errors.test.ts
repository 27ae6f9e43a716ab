// An orchconfig holds a token: an error about a file that does not parse must say which file,
// what kind of error and where, never the text around it. The agent's (--orchconfig, YAML, read
// by client-node's js-yaml, which quotes the lines around an error) becomes the plugin token's
// last error on /readyz and in logs; the plugin's (JSON, V8 quotes the input) goes into the CNI
// error the runtime shows in pod events.

import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { OrchconfigError, parseOrchconfig } from '../../cni-plugin/orch/orchconfig.ts';
import { buildSettings } from '../../src/config/settings.ts';
import { orchKubeConfig } from '../../src/orch/client.ts';
import { tempDir } from '../helpers/plugin.ts';
import { orchClientArgs } from '../../src/partargs.ts';

const SECRET = 'eyJhbGciOiJSUzI1NiJ9.c2VjcmV0LXRva2VuLWRvLW5vdC1sZWFr.sig';
const leaks = /eyJ|c2Vj|\.sig/;

describe('orchconfig parse errors name the file and place, never its text', () => {
  const tmp = tempDir();
  after(() => tmp.remove());

  it("the agent's --orchconfig (YAML)", () => {
    const file = path.join(tmp.dir, 'agent-orchconfig');
    writeFileSync(
      file,
      `apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user:\n    token: ${SECRET}\n   bad: [indent\n`,
    );
    let message = '';
    try {
      orchKubeConfig(orchClientArgs(buildSettings({ orchconfig: file }, {})));
    } catch (e) {
      message = (e as Error).message;
    }
    assert.match(
      message,
      new RegExp(`${file.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')}.*not valid YAML \\(.*line \\d+ column \\d+\\)`),
    );
    assert.doesNotMatch(message, leaks);
    assert.doesNotMatch(message, /token:/);
  });

  it("the plugin's orchconfig (JSON)", () => {
    for (const text of [
      SECRET,
      `{"users": [{"name": "u", "user": {"token": ${SECRET}}}]}`,
      `{"users": [{"name": "u", "user": {"token": "${SECRET}"}}]`,
    ]) {
      assert.throws(
        () => parseOrchconfig(text, '/etc/cni/net.d/ZZZ-mesh-cni-orchconfig'),
        (e: Error) => {
          assert.ok(e instanceof OrchconfigError);
          // Line and column where V8 gives a position (not for an unexpected character).
          assert.match(
            e.message,
            /^\/etc\/cni\/net\.d\/ZZZ-mesh-cni-orchconfig is not JSON \(install-cni writes it as JSON\): (unexpected character|expected ',' or '\}' after property value at line 1 column \d+)$/,
          );
          assert.doesNotMatch(e.message, leaks);
          return true;
        },
      );
    }
  });
});
