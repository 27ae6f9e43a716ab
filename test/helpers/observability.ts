// Helpers for the observability tests: HTTP requests with a bounded wait, promtool, and a
// capturing log sink.

import { spawn } from 'node:child_process';
import http from 'node:http';

export interface HttpResult {
  readonly status: number;
  readonly headers: http.IncomingHttpHeaders;
  readonly body: string;
}

export function request(url: string, opts: { method?: string; headers?: Record<string, string>; body?: string; timeoutMs?: number } = {}): Promise<HttpResult> {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method: opts.method ?? 'GET', headers: opts.headers, timeout: opts.timeoutMs ?? 10_000 }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (body += d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
    });
    req.on('timeout', () => req.destroy(new Error(`timed out: ${opts.method ?? 'GET'} ${url}`)));
    req.on('error', reject);
    req.end(opts.body);
  });
}

/** Runs a command with stdin, bounded by a timeout. */
export function runWithInput(cmd: string, args: readonly string[], input: string, timeoutMs = 30_000): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['pipe', 'pipe', 'pipe'], timeout: timeoutMs });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
    child.stdin.end(input);
  });
}

/** `promtool check metrics` on an exposition; resolves with its complaints (empty when clean). */
export async function promtoolProblems(text: string): Promise<string> {
  const r = await runWithInput('promtool', ['check', 'metrics'], text);
  return r.code === 0 ? '' : `exit ${r.code}: ${r.stdout}${r.stderr}`;
}

/** A log sink that keeps every line, for tests. */
export function captureSink(): { write(line: string): void; lines: string[]; text(): string } {
  const lines: string[] = [];
  return { write: (line) => void lines.push(line), lines, text: () => lines.join('') };
}
