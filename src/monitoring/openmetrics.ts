// Prometheus text exposition -> OpenMetrics 1.0 text, for scrapers that ask for it.
// prom-client can render OpenMetrics itself, but only by switching the whole shared registry and
// renaming counters in place (it strips `_total` from each counter object), which would change
// what the next Prometheus-format scrape prints. Converting the rendered text keeps the registry
// untouched and is a pure function.

export const OPENMETRICS_CONTENT_TYPE = 'application/openmetrics-text; version=1.0.0; charset=utf-8';

/** True when an Accept header prefers or allows OpenMetrics (as Prometheus sends it). */
export function wantsOpenMetrics(accept: string | undefined): boolean {
  if (!accept) return false;
  return accept.split(',').some((part) => {
    const [type, ...params] = part
      .trim()
      .split(';')
      .map((p) => p.trim());
    if (type?.toLowerCase() !== 'application/openmetrics-text') return false;
    const q = params.find((p) => p.startsWith('q='));
    return q === undefined || Number(q.slice(2)) > 0;
  });
}

const META = /^# (HELP|TYPE) (\S+)(?: (.*))?$/;

export function toOpenMetrics(text: string): string {
  // First pass: which families are counters, and their OpenMetrics family name.
  const counters = new Map<string, string>();
  for (const line of text.split('\n')) {
    const m = META.exec(line);
    if (m && m[1] === 'TYPE' && m[3] === 'counter' && m[2]) counters.set(m[2], m[2].replace(/_total$/, ''));
  }
  const out: string[] = [];
  for (const line of text.split('\n')) {
    if (line === '') continue; // OpenMetrics allows no blank lines.
    const m = META.exec(line);
    if (m && m[2]) {
      const name = counters.get(m[2]) ?? m[2];
      if (m[1] === 'TYPE') out.push(`# TYPE ${name} ${m[3] === 'untyped' ? 'unknown' : (m[3] ?? 'unknown')}`);
      else out.push(`# HELP ${name} ${(m[3] ?? '').replace(/(?<!\\)"/g, '\\"')}`);
      continue;
    }
    if (line.startsWith('#')) continue;
    const nameEnd = line.search(/[{ ]/);
    const sample = nameEnd < 0 ? line : line.slice(0, nameEnd);
    // A counter's samples are `<family>_total`; prom-client prints a counter not named *_total bare.
    if (counters.has(sample) && !sample.endsWith('_total')) out.push(`${sample}_total${line.slice(sample.length)}`);
    else out.push(line);
  }
  out.push('# EOF');
  return out.join('\n') + '\n';
}
