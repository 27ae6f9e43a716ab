// The plain-text tables the benches print: a header, a dashed rule, a row a line, columns padded
// to their widest cell and parted by " | ". Pure but for printTable's console.log.

/** The table's lines; the first `leftCols` columns are left-aligned, the rest right-aligned. */
export function tableLines(
  head: readonly string[],
  rows: readonly (readonly string[])[],
  leftCols = head.length,
): string[] {
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (r: readonly string[]) =>
    r.map((c, i) => (i < leftCols ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join(' | ');
  return [line(head), widths.map((w) => '-'.repeat(w)).join('-|-'), ...rows.map(line)];
}

/** Prints tableLines(head, rows, leftCols). */
export function printTable(head: readonly string[], rows: readonly (readonly string[])[], leftCols?: number): void {
  for (const l of tableLines(head, rows, leftCols)) console.log(l);
}
