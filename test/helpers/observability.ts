// Helpers for the observability tests: HTTP requests with a bounded wait, promtool, and a
// capturing log sink.

import http from 'node:http';
import { run } from './netns.ts';

export interface HttpResult {
  readonly status: number;
  readonly headers: http.IncomingHttpHeaders;
  readonly body: string;
}

export function request(
  url: string,
  opts: { method?: string; headers?: Record<string, string>; body?: string; timeoutMs?: number } = {},
): Promise<HttpResult> {
  return new Promise((resolve, reject) => {
    const req = http.request(
      url,
      { method: opts.method ?? 'GET', headers: opts.headers, timeout: opts.timeoutMs ?? 10_000 },
      (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (d: string) => (body += d));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
      },
    );
    req.on('timeout', () => req.destroy(new Error(`timed out: ${opts.method ?? 'GET'} ${url}`)));
    req.on('error', reject);
    req.end(opts.body);
  });
}

/** `promtool check metrics` on an exposition; resolves with its complaints (empty when clean). */
export async function promtoolProblems(text: string): Promise<string> {
  const r = await run('promtool', ['check', 'metrics'], { input: text });
  return r.code === 0 ? '' : `exit ${r.code}: ${r.stdout}${r.stderr}`;
}

/** A log sink that keeps every line, for tests. */
export function captureSink(): { write(line: string): void; lines: string[]; text(): string } {
  const lines: string[] = [];
  return { write: (line) => void lines.push(line), lines, text: () => lines.join('') };
}
