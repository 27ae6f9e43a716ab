// The benches' plain-text tables (scripts/bench/lib/table.ts), one helper for every bench that
// prints one: the layout their figures in the docs are read from.

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { tableLines } from '../../scripts/bench/lib/table.ts';

describe('bench tables', () => {
  it('pads each column to its widest cell, left-aligned unless told, with a dashed rule', () => {
    assert.deepEqual(
      tableLines(
        ['pods', 'p50 ms'],
        [
          ['1', '12.5'],
          ['1000', '3'],
        ],
      ),
      ['pods | p50 ms', '-----|-------', '1    | 12.5  ', '1000 | 3     '],
    );
  });

  it('right-aligns the columns after the first leftCols', () => {
    assert.deepEqual(
      tableLines(
        ['role', 'rss MiB'],
        [
          ['lookup', '41.2'],
          ['baseline', '7.0'],
        ],
        1,
      ),
      ['role     | rss MiB', '---------|--------', 'lookup   |    41.2', 'baseline |     7.0'],
    );
  });
});
