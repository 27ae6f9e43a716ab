// Splits a byte stream into '\n'-terminated lines with a hard cap on a line's length, so a peer
// that never sends a newline costs at most `maxLineBytes` of memory: the rest of such a line is
// skipped up to its newline and reported once.

export class LineSplitter {
  private readonly maxLineBytes: number;
  private readonly onLine: (line: Buffer) => void;
  private readonly onOversized: () => void;
  private pending: Buffer[] = [];
  private pendingBytes = 0;
  private skipping = false;

  constructor(maxLineBytes: number, onLine: (line: Buffer) => void, onOversized: () => void) {
    this.maxLineBytes = maxLineBytes;
    this.onLine = onLine;
    this.onOversized = onOversized;
  }

  push(chunk: Buffer): void {
    let start = 0;
    for (let nl = chunk.indexOf(10, start); nl >= 0; nl = chunk.indexOf(10, start)) {
      if (this.skipping) {
        this.skipping = false;
      } else if (this.pendingBytes + nl - start > this.maxLineBytes) {
        this.onOversized();
      } else if (this.pendingBytes > 0) {
        this.pending.push(chunk.subarray(start, nl));
        this.onLine(Buffer.concat(this.pending, this.pendingBytes + nl - start));
      } else {
        this.onLine(chunk.subarray(start, nl));
      }
      this.pending = [];
      this.pendingBytes = 0;
      start = nl + 1;
    }
    if (this.skipping || start === chunk.length) return;
    const rest = chunk.length - start;
    if (this.pendingBytes + rest > this.maxLineBytes) {
      this.onOversized();
      this.skipping = true;
      this.pending = [];
      this.pendingBytes = 0;
      return;
    }
    // Copy: a subarray would keep the whole (up to 64 KiB) chunk alive for a few bytes.
    this.pending.push(Buffer.from(chunk.subarray(start)));
    this.pendingBytes += rest;
  }

  /** End of stream: a last line without its newline still counts. */
  end(): void {
    if (!this.skipping && this.pendingBytes > 0) this.onLine(Buffer.concat(this.pending, this.pendingBytes));
    this.pending = [];
    this.pendingBytes = 0;
    this.skipping = false;
  }
}
