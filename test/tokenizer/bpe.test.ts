import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import {
  buildCharTokenizer,
  MARKER_TOKENS,
  SPECIAL_TOKENS,
  saveTokenizer,
  Tokenizer,
  tokenizerFromFiles,
  trainBpeTokenizer,
} from '../../src/tokenizer/index.js';
import { Rng } from '../../src/util/index.js';

const tmpDirs: string[] = [];
function tempDir(prefix: string): string {
  const d = mkdtempSync(join(tmpdir(), prefix));
  tmpDirs.push(d);
  return d;
}
after(() => {
  for (const d of tmpDirs) rmSync(d, { recursive: true, force: true });
});

function corpus(n: number, seed: number): string[] {
  const rng = new Rng(seed);
  const out: string[] = [];
  for (let i = 0; i < n; i++) {
    const a = rng.int(0, 999);
    const b = rng.int(0, 999);
    out.push(
      `<|im_start|>user\nWhat is ${a} + ${b}?<|im_end|>\n<|im_start|>assistant\n<reason>Let me compute it with python.` +
        `<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "print(${a} + ${b})", "input": ""}}\n</tool_call><|im_end|>` +
        `<|im_start|>user\n<tool_response>\nTool call success\nstdout: ${a + b}\n\nexecution time: 0.01s\n</tool_response><|im_end|>\n` +
        `<|im_start|>assistant\n<reason>The answer is ${a + b}.</reason> <answer>\\boxed{${a + b}}</answer><|im_end|>`,
    );
  }
  return out;
}

test('trained BPE shortens sequences, round-trips, and keeps markers as single tokens', () => {
  const docs = corpus(300, 1);
  const files = trainBpeTokenizer(docs, 512);
  const bpe = tokenizerFromFiles(files);
  const chars = tokenizerFromFiles(buildCharTokenizer());
  assert.ok(bpe.vocabSize <= 512 && bpe.vocabSize > 300, `vocab ${bpe.vocabSize}`);
  const held = corpus(20, 2);
  let nBpe = 0;
  let nChar = 0;
  for (const d of held) {
    const ids = bpe.encode(d);
    assert.equal(bpe.decode(ids), d);
    nBpe += ids.length;
    nChar += chars.encode(d).length;
  }
  assert.ok(nBpe < nChar * 0.6, `bpe ${nBpe} tokens vs char ${nChar}`);
  for (const t of [...SPECIAL_TOKENS, ...MARKER_TOKENS]) assert.deepEqual(bpe.encode(t), [bpe.idOf(t)]);
  // text never seen in training still round-trips through byte tokens
  for (const s of ['日本語 😀 ∑', 'ünïcödé\r\n\ttabs', '']) assert.equal(bpe.decode(bpe.encode(s)), s);
  // digits stay one token each (Qwen2 split), so numbers are learnable digit by digit
  assert.equal(bpe.encode('12345').length, 5);
});

test('BPE training is deterministic and the files load from disk', () => {
  const docs = corpus(100, 3);
  const a = trainBpeTokenizer(docs, 400);
  const b = trainBpeTokenizer(docs, 400);
  assert.deepEqual(a, b);
  const dir = tempDir('rstar2-bpe-');
  saveTokenizer(a, dir);
  const tok = Tokenizer.load(dir);
  const s = docs[0];
  assert.deepEqual(tok.encode(s), tokenizerFromFiles(a).encode(s));
  assert.equal(tok.decode(tok.encode(s)), s);
});

test('vocab budget and minFrequency bound the merges; bad sizes are rejected', () => {
  const docs = corpus(50, 4);
  const small = tokenizerFromFiles(trainBpeTokenizer(docs, 300));
  assert.equal(small.vocabSize, 300);
  const rare = tokenizerFromFiles(trainBpeTokenizer(['abcabc xyz'], 5000, { minFrequency: 1 }));
  assert.ok(rare.vocabSize < 300);
  assert.throws(() => trainBpeTokenizer(docs, 100), /vocabSize must be an integer >= 267/);
  assert.throws(() => trainBpeTokenizer(docs, 300.5), /vocabSize must be an integer/);
});
