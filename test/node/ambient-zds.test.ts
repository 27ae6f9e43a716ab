// The ZDS codec against bytes derived by hand from zds.proto, not from any protobuf library.
//
// How each golden datagram below was derived (protobuf wire format):
// - a field's tag is the varint (field number << 3 | wire type); wire types: 0 varint, 1 fixed64,
//   2 length-delimited, 3/4 start/end group, 5 fixed32. Every field of ZDS is < 16: one byte.
//     WorkloadRequest.add = 1, LEN:    1 << 3 | 2 = 0x0a
//     WorkloadRequest.del = 2, LEN:    2 << 3 | 2 = 0x12
//     WorkloadRequest.snapshot_sent = 3, LEN: 3 << 3 | 2 = 0x1a
//     WorkloadRequest.keep = 5, LEN:   5 << 3 | 2 = 0x2a
//     AddWorkload.uid = 1 -> 0x0a; AddWorkload.workload_info = 2 -> 0x12
//     WorkloadInfo.name = 1 -> 0x0a; .namespace = 2 -> 0x12; .service_account = 3 -> 0x1a
//     KeepWorkload.uid = 1 -> 0x0a;   DelWorkload.uid = 2 -> 0x12 (uid is field 2 there)
//     ZdsHello.version = 1, varint: 1 << 3 | 0 = 0x08
//     WorkloadResponse.ack = 1 -> 0x0a; Ack.error = 1 -> 0x0a
// - a length-delimited field is tag, length (varint), bytes; a string is its UTF-8 bytes;
// - proto3 leaves a string holding "" out; a message (a oneof member, workload_info) set but
//   empty is still written, as tag + length 0.
// - varint: 7 bits a byte, low group first, high bit set on every byte but the last
//   (146 = 0b1_0010010 -> 0x92 0x01).
// The names are ours (a shop in namespace orders), not any test data of the reference.

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  ZdsDecodeError,
  decodeWorkloadRequest,
  decodeWorkloadResponse,
  decodeZdsHello,
  encodeWorkloadRequest,
  encodeWorkloadResponse,
  encodeZdsHello,
  type WorkloadRequest,
  type WorkloadResponse,
} from '../../src/ambient/zds.ts';

/** Hex with spaces and comments allowed: the fixtures are written in groups. */
function hex(...parts: string[]): Buffer {
  return Buffer.from(parts.join('').replaceAll(' ', ''), 'hex');
}

// 36 bytes: "7c0a3e52-1f4b-4d8e-9a61-2b5c8d0e4f17" in ASCII (0-9 are 0x30-0x39, a-f 0x61-0x66, - 0x2d).
const UID = '7c0a3e52-1f4b-4d8e-9a61-2b5c8d0e4f17';
const UID_HEX = '37633061 33653532 2d 31663462 2d 34643865 2d 39613631 2d 326235633864306534663137';
// 63 bytes: "0123456789" six times, then "abc".
const UID63 = '0123456789'.repeat(6) + 'abc';
const UID63_HEX = '30313233343536373839'.repeat(6) + '616263';
// 63 bytes: "n" (0x6e) 63 times, a pod name at the label-value length limit.
const NAME63 = 'n'.repeat(63);
const NAME63_HEX = '6e'.repeat(63);

const SHOP = { name: 'shop-7d9f', namespace: 'orders', serviceAccount: 'shop' };
// "shop-7d9f" = 73 68 6f 70 2d 37 64 39 66 (9); "orders" = 6f 72 64 65 72 73 (6); "shop" = 73 68 6f 70 (4)
const SHOP_INFO_HEX = '0a 09 73686f702d37643966  12 06 6f7264657273  1a 04 73686f70'; // 2+9 + 2+6 + 2+4 = 25 = 0x19

const GOLDEN_REQUESTS: readonly { readonly name: string; readonly req: WorkloadRequest; readonly bytes: Buffer }[] = [
  {
    name: 'snapshot_sent: the oneof member set, empty',
    req: { kind: 'snapshot_sent' },
    bytes: hex('1a 00'),
  },
  {
    // KeepWorkload = 0a 24 <uid 36> -> 38 = 0x26 bytes
    name: 'keep',
    req: { kind: 'keep', uid: UID },
    bytes: hex('2a 26', '0a 24', UID_HEX),
  },
  {
    name: 'keep with an empty uid (the uid field left out)',
    req: { kind: 'keep', uid: '' },
    bytes: hex('2a 00'),
  },
  {
    // DelWorkload = 12 24 <uid 36> (uid is field 2: tag 0x12) -> 38 = 0x26 bytes
    name: 'del',
    req: { kind: 'del', uid: UID },
    bytes: hex('12 26', '12 24', UID_HEX),
  },
  {
    name: 'del with an empty uid',
    req: { kind: 'del', uid: '' },
    bytes: hex('12 00'),
  },
  {
    // AddWorkload = 0a 24 <uid 36> 12 19 <info 25> -> 2+36 + 2+25 = 65 = 0x41 bytes
    name: 'add with workload info',
    req: { kind: 'add', uid: UID, info: SHOP },
    bytes: hex('0a 41', '0a 24', UID_HEX, '12 19', SHOP_INFO_HEX),
  },
  {
    // AddWorkload = 0a 24 <uid 36> 12 00 -> 40 = 0x28 bytes
    name: 'add with workload info of empty strings (the info written, empty)',
    req: { kind: 'add', uid: UID, info: { name: '', namespace: '', serviceAccount: '' } },
    bytes: hex('0a 28', '0a 24', UID_HEX, '12 00'),
  },
  {
    name: 'add without workload info',
    req: { kind: 'add', uid: UID, info: null },
    bytes: hex('0a 26', '0a 24', UID_HEX),
  },
  {
    name: 'add with an empty uid and no info',
    req: { kind: 'add', uid: '', info: null },
    bytes: hex('0a 00'),
  },
  {
    // name "café-ü": 63 61 66, é = U+00E9 = c3 a9, 2d, ü = U+00FC = c3 bc -> 8 bytes
    // namespace "名前空間": 名 U+540D = e5 90 8d, 前 U+524D = e5 89 8d, 空 U+7A7A = e7 a9 ba,
    //   間 U+9593 = e9 96 93 -> 12 bytes
    // service account "sa-🚀": 73 61 2d, U+1F680 = f0 9f 9a 80 -> 7 bytes
    // info = 2+8 + 2+12 + 2+7 = 33 = 0x21; AddWorkload = 2+36 + 2+33 = 73 = 0x49
    name: 'add with unicode names (UTF-8, lengths in bytes)',
    req: { kind: 'add', uid: UID, info: { name: 'café-ü', namespace: '名前空間', serviceAccount: 'sa-🚀' } },
    bytes: hex(
      '0a 49',
      '0a 24',
      UID_HEX,
      '12 21',
      '0a 08 636166c3a92dc3bc',
      '12 0c e5908d e5898d e7a9ba e99693',
      '1a 07 73612d f09f9a80',
    ),
  },
  {
    // KeepWorkload = 0a 3f <uid 63> -> 65 = 0x41
    name: 'keep with a 63-byte uid',
    req: { kind: 'keep', uid: UID63 },
    bytes: hex('2a 41', '0a 3f', UID63_HEX),
  },
  {
    // info = 0a 3f <name 63> 12 06 <orders> 1a 04 <shop> = 65 + 8 + 6 = 79 = 0x4f
    // AddWorkload = 0a 3f <uid 63> 12 4f <info 79> = 65 + 81 = 146 -> varint 92 01 (two bytes)
    name: 'add with a 63-byte uid and name (a length over 127: a two-byte varint)',
    req: { kind: 'add', uid: UID63, info: { ...SHOP, name: NAME63 } },
    bytes: hex('0a 92 01', '0a 3f', UID63_HEX, '12 4f', '0a 3f', NAME63_HEX, '12 06 6f7264657273', '1a 04 73686f70'),
  },
];

describe('ambient ZDS codec: golden bytes', () => {
  it('the hand-written ASCII of the fixtures is right', () => {
    assert.equal(hex(UID_HEX).toString('latin1'), UID);
    assert.equal(hex(UID63_HEX).length, 63);
    assert.equal(hex(NAME63_HEX).length, 63);
  });

  for (const g of GOLDEN_REQUESTS) {
    it(`WorkloadRequest ${g.name}: encodes to the bytes and decodes back`, () => {
      assert.equal(encodeWorkloadRequest(g.req).toString('hex'), g.bytes.toString('hex'));
      assert.deepEqual(decodeWorkloadRequest(g.bytes), g.req);
    });
  }

  it('the 149-byte add is one datagram well under the 1024-byte buffer', () => {
    const last = GOLDEN_REQUESTS.at(-1)!;
    assert.equal(encodeWorkloadRequest(last.req).length, 3 + 146);
  });

  const hellos: readonly [string, number, string][] = [
    ['V1: tag 08, varint 1', 1, '08 01'],
    ['NOT_USED (0): proto3 leaves the default out, no bytes', 0, ''],
    ['a version from the future (2)', 2, '08 02'],
    ['300: a two-byte varint (300 = 0b10_0101100 -> ac 02)', 300, '08 ac 02'],
  ];
  for (const [name, version, bytes] of hellos) {
    it(`ZdsHello ${name}`, () => {
      assert.equal(encodeZdsHello({ version }).toString('hex'), hex(bytes).toString('hex'));
      assert.deepEqual(decodeZdsHello(hex(bytes)), { version });
    });
  }

  it('ZdsHello: a negative enum value (sign-extended to a 10-byte varint) decodes as the int32', () => {
    assert.deepEqual(decodeZdsHello(hex('08 ffffffffffffffffff 01')), { version: -1 });
  });

  const responses: readonly [string, WorkloadResponse, string][] = [
    ['ack: the member set, Ack empty', { ack: { error: '' } }, '0a 00'],
    // "no netns" = 6e 6f 20 6e 65 74 6e 73 (8); Ack = 0a 08 <8> -> 10 = 0x0a
    ['nack "no netns"', { ack: { error: 'no netns' } }, '0a 0a 0a 08 6e6f206e65746e73'],
    // "ü" = c3 bc (2); Ack = 0a 02 c3 bc -> 4
    ['nack "ü"', { ack: { error: 'ü' } }, '0a 04 0a 02 c3bc'],
    ['no payload at all', { ack: null }, ''],
  ];
  for (const [name, resp, bytes] of responses) {
    it(`WorkloadResponse ${name}`, () => {
      assert.equal(encodeWorkloadResponse(resp).toString('hex'), hex(bytes).toString('hex'));
      assert.deepEqual(decodeWorkloadResponse(hex(bytes)), resp);
    });
  }
});

describe('ambient ZDS codec: unknown fields are skipped, repeats merged', () => {
  it('skips an unknown varint field (field 2, 10 ac 02) before the version', () => {
    assert.deepEqual(decodeZdsHello(hex('10 ac02  08 01')), { version: 1 });
  });

  it('skips unknown fixed32 (field 9: 4d), fixed64 (10: 51), bytes (11: 5a) and a group (12: 63..64)', () => {
    const bytes = hex('4d 01020304', '51 0102030405060708', '5a 02 ffff', '63 08 05 64', '0a 00');
    assert.deepEqual(decodeWorkloadResponse(bytes), { ack: { error: '' } });
  });

  it('skips nested groups (12 start 63, 13 start 6b, 13 end 6c, 12 end 64)', () => {
    assert.deepEqual(decodeWorkloadResponse(hex('63 6b 08 01 6c 64', '0a 00')), { ack: { error: '' } });
  });

  it('skips an unknown field inside Ack (field 2 varint: 10 07) and reads its error', () => {
    assert.deepEqual(decodeWorkloadResponse(hex('0a 05 10 07 0a 01 78')), { ack: { error: 'x' } });
  });

  it('skips the unused oneof number 4 (22) and a reserved WorkloadInfo field 4 (trust_domain: 22)', () => {
    assert.deepEqual(decodeWorkloadRequest(hex('22 02 08 01', '2a 00')), { kind: 'keep', uid: '' });
    // AddWorkload = 12 05 <info 5>; info = 22 03 646f6d (field 4, "dom") -> add body 7 bytes
    assert.deepEqual(decodeWorkloadRequest(hex('0a 07 12 05 22 03 646f6d')), {
      kind: 'add',
      uid: '',
      info: { name: '', namespace: '', serviceAccount: '' },
    });
  });

  it('skips fields inside SnapshotSent (it has none)', () => {
    assert.deepEqual(decodeWorkloadRequest(hex('1a 02 08 01')), { kind: 'snapshot_sent' });
  });

  it('a scalar field sent twice keeps the last value', () => {
    assert.deepEqual(decodeZdsHello(hex('08 02 08 01')), { version: 1 });
  });

  it('of two oneof members the last wins (keep, then del "x")', () => {
    assert.deepEqual(decodeWorkloadRequest(hex('2a 00', '12 03 12 01 78')), { kind: 'del', uid: 'x' });
  });

  it('the same oneof member twice is merged (add{uid "a"}, add{info{namespace "n"}})', () => {
    assert.deepEqual(decodeWorkloadRequest(hex('0a 03 0a 01 61', '0a 05 12 03 12 01 6e')), {
      kind: 'add',
      uid: 'a',
      info: { name: '', namespace: 'n', serviceAccount: '' },
    });
  });

  it('round-trips requests of every kind and length', () => {
    for (let n = 0; n < 300; n += 7) {
      const s = 'ü'.repeat(n);
      for (const req of [
        { kind: 'add', uid: s, info: { name: s, namespace: 'x', serviceAccount: '' } },
        { kind: 'keep', uid: s },
        { kind: 'del', uid: s },
      ] as const) {
        assert.deepEqual(decodeWorkloadRequest(encodeWorkloadRequest(req)), req);
      }
    }
  });
});

describe('ambient ZDS codec: malformed input is refused', () => {
  const bad: readonly [string, (b: Buffer) => unknown, string, RegExp][] = [
    ['a truncated varint (08 80)', decodeZdsHello, '08 80', /ZdsHello: truncated varint .* at byte 1$/],
    ['a truncated tag (80)', decodeZdsHello, '80', /truncated varint .* at byte 0$/],
    ['a varint over 10 bytes', decodeZdsHello, '08 ffffffffffffffffffff 01', /varint longer than 64 bits at byte 1$/],
    ['a 10th varint byte over 1', decodeZdsHello, '08 ffffffffffffffffff 02', /varint longer than 64 bits at byte 1$/],
    [
      'a length past the end (0a 05 0a 00)',
      decodeWorkloadResponse,
      '0a 05 0a 00',
      /WorkloadResponse: field 1's length 5 runs past the end \(2 bytes left\) at byte 1$/,
    ],
    [
      'a nested length past the end (Ack error of length 5 in 2 bytes)',
      decodeWorkloadResponse,
      '0a 02 0a 05',
      /ZDS Ack: field 1's length 5 runs past the end \(0 bytes left\) at byte 3$/,
    ],
    ['a length of 2^32-1', decodeWorkloadResponse, '0a ffffffff0f', /field 1's length 4294967295 runs past the end/],
    [
      'ack sent as a varint (wrong wire type)',
      decodeWorkloadResponse,
      '08 01',
      /field 1 \(ack\) has wire type 0 \(varint\), expected 2 \(length-delimited\) at byte 0$/,
    ],
    [
      'version sent as bytes (wrong wire type)',
      decodeZdsHello,
      '0a 00',
      /field 1 \(version\) has wire type 2 \(length-delimited\), expected 0 \(varint\)/,
    ],
    ['add sent as a varint', decodeWorkloadRequest, '08 01', /field 1 \(add\) has wire type 0/],
    ['AddWorkload.uid as a fixed32', decodeWorkloadRequest, '0a 05 0d 01020304', /AddWorkload: field 1 \(uid\)/],
    ['wire type 6', decodeWorkloadResponse, '0e', /wire type 6 \(field 1\) does not exist at byte 0$/],
    ['wire type 7', decodeWorkloadResponse, '0f', /wire type 7 \(field 1\) does not exist/],
    ['field number 0', decodeWorkloadResponse, '00 01', /field number 0 is not allowed at byte 0$/],
    // tag 2^32 = field 2^29 (one past the largest, 2^29-1), varint 80 80 80 80 10
    ['a field number past 2^29-1', decodeWorkloadResponse, '8080808010 00', /field number 536870912 is out of range/],
    ['an end-group without its start', decodeWorkloadResponse, '0c', /end-group for field 1 without its start-group/],
    ['a group that never ends', decodeWorkloadResponse, '63 08 05', /group 12 has no end-group/],
    ['a group ended by another field', decodeWorkloadResponse, '63 6c', /end-group for field 13 inside group 12/],
    ['a truncated fixed32', decodeWorkloadResponse, '4d 0102', /field 9 \(fixed32\) runs past the end/],
    ['a truncated fixed64', decodeWorkloadResponse, '51 01020304', /field 10 \(fixed64\) runs past the end/],
    [
      'an Ack error that is not UTF-8',
      decodeWorkloadResponse,
      '0a 03 0a 01 ff',
      /field 1 \(error\) is not valid UTF-8/,
    ],
    ['a uid that is not UTF-8', decodeWorkloadRequest, '2a 03 0a 01 c3', /KeepWorkload: field 1 \(uid\) is not valid/],
    ['a request with no payload', decodeWorkloadRequest, '', /WorkloadRequest: no payload/],
    ['a request with only unknown fields', decodeWorkloadRequest, '22 00', /no payload/],
  ];
  for (const [name, decode, bytes, message] of bad) {
    it(`refuses ${name}`, () => {
      assert.throws(
        () => decode(hex(bytes)),
        (e: unknown) => {
          assert.ok(e instanceof ZdsDecodeError, String(e));
          assert.match(e.message, /^cannot decode ZDS /);
          assert.match(e.message, message);
          return true;
        },
      );
    });
  }

  it('refuses groups nested deeper than 100', () => {
    const deep = hex('63'.repeat(101) + '64'.repeat(101));
    assert.throws(() => decodeWorkloadResponse(deep), /groups nested deeper than 100/);
  });

  it('refuses to encode a uid with a lone surrogate (it has no UTF-8 form)', () => {
    assert.throws(() => encodeWorkloadRequest({ kind: 'del', uid: 'a\ud800' }), /DelWorkload\.uid is not well-formed/);
  });
});
