// Splits a byte stream into '\n'-terminated lines with a hard cap on a line's length, so a peer
// that never sends a newline costs at most `maxLineBytes` of memory: the rest of such a line is
// skipped up to its newline and reported once. A partial line is kept in one buffer of its own
// (grown by doubling up to the cap), not as a list of the chunks it came in: a peer writing a
// byte at a time would otherwise cost a Buffer object per byte on top of the byte.

export class LineSplitter {
  readonly #maxLineBytes: number;
  readonly #onLine: (line: Buffer) => void;
  readonly #onOversized: () => void;
  #pending: Buffer | null = null;
  #pendingBytes = 0;
  #skipping = false;

  constructor(maxLineBytes: number, onLine: (line: Buffer) => void, onOversized: () => void) {
    this.#maxLineBytes = maxLineBytes;
    this.#onLine = onLine;
    this.#onOversized = onOversized;
  }

  /** Bytes of a partial line held now (what this stream costs between chunks). */
  get buffered(): number {
    return this.#pending === null ? 0 : this.#pending.length;
  }

  /** Inside a line: some of it has arrived (kept or being skipped), its newline not yet. */
  get inLine(): boolean {
    return this.#pendingBytes > 0 || this.#skipping;
  }

  push(chunk: Buffer): void {
    let start = 0;
    for (let nl = chunk.indexOf(10, start); nl >= 0; nl = chunk.indexOf(10, start)) {
      if (this.#skipping) {
        this.#skipping = false;
      } else if (this.#pendingBytes + nl - start > this.#maxLineBytes) {
        this.#onOversized();
      } else if (this.#pendingBytes > 0) {
        const line = this.#take(chunk.subarray(start, nl));
        this.#onLine(line);
      } else {
        this.#onLine(chunk.subarray(start, nl));
      }
      this.reset();
      start = nl + 1;
    }
    if (this.#skipping || start === chunk.length) return;
    const rest = chunk.length - start;
    if (this.#pendingBytes + rest > this.#maxLineBytes) {
      this.#onOversized();
      this.reset();
      this.#skipping = true;
      return;
    }
    this.#keep(chunk.subarray(start));
  }

  /** End of stream: a last line without its newline still counts. */
  end(): void {
    if (!this.#skipping && this.#pendingBytes > 0) this.#onLine(this.#take(Buffer.alloc(0)));
    this.reset();
  }

  /** Forgets the partial line (the stream is being cut). */
  reset(): void {
    this.#pending = null;
    this.#pendingBytes = 0;
    this.#skipping = false;
  }

  #keep(part: Buffer): void {
    const need = this.#pendingBytes + part.length;
    if (this.#pending === null || this.#pending.length < need) {
      // Copied, never a subarray: that would keep the whole (up to 64 KiB) read buffer alive.
      const grown = Buffer.allocUnsafeSlow(
        Math.min(this.#maxLineBytes, Math.max(need, 2 * (this.#pending?.length ?? 0), 256)),
      );
      if (this.#pending !== null) this.#pending.copy(grown, 0, 0, this.#pendingBytes);
      this.#pending = grown;
    }
    part.copy(this.#pending, this.#pendingBytes);
    this.#pendingBytes = need;
  }

  #take(tail: Buffer): Buffer {
    const held = (this.#pending as Buffer).subarray(0, this.#pendingBytes);
    return tail.length === 0 ? held : Buffer.concat([held, tail]);
  }
}
