import assert from 'node:assert/strict';
import { test } from 'node:test';
import { encodeFrame, FrameReader, packRagged, unpackRagged } from '../../src/worker/protocol.js';

test('frames round-trip headers and raw arrays, across arbitrary chunk boundaries', () => {
  const ids = new Int32Array([1, -2, 3, 2147483647]);
  const lp = new Float32Array([-0.5, -1.25, 3.5]);
  const a = encodeFrame({ op: 'x', id: 7, nested: { k: [1, 2] } }, { ids, lp });
  const b = encodeFrame({ op: 'y', id: 8 });
  const both = Buffer.concat([a, b]);
  const r = new FrameReader();
  const frames = [];
  for (let i = 0; i < both.length; i += 3) frames.push(...r.push(both.subarray(i, i + 3)));
  assert.equal(frames.length, 2);
  assert.equal(frames[0].header.op, 'x');
  assert.deepEqual(frames[0].header.nested, { k: [1, 2] });
  assert.deepEqual(Array.from(frames[0].arrays.ids), [1, -2, 3, 2147483647]);
  assert.ok(frames[0].arrays.lp instanceof Float32Array);
  assert.deepEqual(Array.from(frames[0].arrays.lp), [-0.5, -1.25, 3.5]);
  assert.equal(frames[1].header.op, 'y');
  assert.deepEqual(frames[1].arrays, {});
});

test('ragged packing keeps order and lengths, and rejects non-integers', () => {
  const seqs = [[1, 2, 3], [], [4]];
  const { flat, lens } = packRagged(seqs, 'p');
  assert.deepEqual(Array.from(lens), [3, 0, 1]);
  assert.deepEqual(unpackRagged(flat, lens), seqs);
  assert.throws(() => packRagged([[1, 2.5]], 'prompts'), /prompts\[0\]\[1\] = 2.5 is not a 32-bit integer/);
});

test('stray output on the frame stream is named at once, not read as a length to wait for', () => {
  const r = new FrameReader();
  assert.equal(r.push(encodeFrame({ op: 'hello', id: 0 })).length, 1);
  // "NCCL" read as a little-endian length would be ~1.3 GB
  assert.throws(
    () => r.push(Buffer.from('NCCL INFO Bootstrap : Using eth0\n')),
    /stray bytes on the frame stream.*NCCL INFO/,
  );
});
