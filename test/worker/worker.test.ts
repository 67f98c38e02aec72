import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { byteToUnicode } from '../../src/tokenizer/index.js';
import { initModelDir, PolicyWorker } from '../../src/worker/index.js';
import { maxAbsDiff, sampling, TEST_CONFIG } from './helpers.js';

let w: PolicyWorker;
const prompts = [
  [1, 2, 3, 4, 5],
  [7, 8],
  [9, 10, 11],
];

before(async () => {
  w = await PolicyWorker.start({ threads: 1 });
  await w.init(TEST_CONFIG, 11);
});
after(async () => {
  await w?.close();
});

test("the worker's hello names its torch and device: here a CPU with the threads asked for", () => {
  assert.equal(w.info?.world, 1);
  assert.match(w.info?.torch ?? '', /^\d+\.\d+/);
  assert.equal(w.info?.device, 'cpu (1 thread)');
});

test('generation is deterministic under a seed, and the seed matters', { timeout: 60_000 }, async () => {
  const a = await w.generate(prompts, sampling({ seed: 5 }));
  const b = await w.generate(prompts, sampling({ seed: 5 }));
  const c = await w.generate(prompts, sampling({ seed: 6 }));
  assert.deepEqual(a, b);
  assert.notDeepEqual(
    a.map((r) => r.outputIds),
    c.map((r) => r.outputIds),
  );
  for (const r of a) {
    assert.equal(r.outputIds.length, 12);
    assert.equal(r.logprobs.length, 12);
    assert.equal(r.finishReason, 'length');
  }
});

test('generate logprobs equal logprobs() on the same tokens (left-padded batch, T=1 and T=0.7)', {
  timeout: 60_000,
}, async () => {
  for (const temperature of [1, 0.7]) {
    const gen = await w.generate(prompts, sampling({ seed: 1, temperature, maxNewTokens: 20 }));
    const scored = await w.logprobs(
      prompts.map((p, i) => [...p, ...gen[i].outputIds]),
      { temperature },
    );
    prompts.forEach((p, i) => {
      assert.equal(scored[i].logprobs[0], 0);
      const diff = maxAbsDiff(scored[i].logprobs.slice(p.length), gen[i].logprobs);
      assert.ok(diff <= 1e-4, `T=${temperature} row ${i}: max abs diff ${diff}`);
      assert.ok(scored[i].entropy.slice(1).every((e) => e > 0 && e <= Math.log(64) + 1e-4));
    });
  }
});

test('greedy, top-k 1 and stop token ids', { timeout: 60_000 }, async () => {
  const greedy = await w.generate(prompts, sampling({ temperature: 0 }));
  const topk1 = await w.generate(prompts, sampling({ topK: 1, seed: 3 }));
  assert.deepEqual(
    greedy.map((r) => r.outputIds),
    topk1.map((r) => r.outputIds),
  );
  const topP = await w.generate(prompts, sampling({ topP: 1e-6, seed: 4 }));
  assert.deepEqual(
    greedy.map((r) => r.outputIds),
    topP.map((r) => r.outputIds),
  );
  // stop at the third greedy token of row 0: it is emitted, included, and the row finishes with 'stop'
  const stopId = greedy[0].outputIds[2];
  const stopped = await w.generate(prompts, sampling({ temperature: 0, stopTokenIds: [stopId] }));
  const at = greedy[0].outputIds.indexOf(stopId);
  assert.deepEqual(stopped[0].outputIds, greedy[0].outputIds.slice(0, at + 1));
  assert.equal(stopped[0].finishReason, 'stop');
  stopped.forEach((r, i) => {
    // rows that finish early must not disturb the others (finished rows are dropped from the batch)
    const j = greedy[i].outputIds.indexOf(stopId);
    assert.deepEqual(r.outputIds, j < 0 ? greedy[i].outputIds : greedy[i].outputIds.slice(0, j + 1));
    assert.ok(maxAbsDiff(r.logprobs, greedy[i].logprobs.slice(0, r.logprobs.length)) <= 1e-5);
  });
  // teacher-forced argmax flags agree with greedy decoding: every greedy token is the argmax, a changed one is not
  const seq = [...prompts[0], ...greedy[0].outputIds];
  const other = seq.map((t, i) => (i === seq.length - 1 ? (t + 1) % TEST_CONFIG.vocab_size : t));
  const [scored, changed] = await w.logprobs([seq, other]);
  assert.deepEqual(
    scored.argmax.slice(prompts[0].length),
    greedy[0].outputIds.map(() => true),
  );
  assert.equal(changed.argmax[seq.length - 1], false);
  assert.equal(scored.argmax[0], false);
  const zero = await w.generate(prompts, sampling({ maxNewTokens: 0 }));
  assert.deepEqual(zero[0], {
    outputIds: [],
    logprobs: [],
    finishReason: 'length',
    cachedTokens: 0,
    retractions: 0,
  });
});

test('GRPO loss and clip fraction match a hand-computed example', { timeout: 60_000 }, async () => {
  // Ratios chosen to hit every branch: A>0 clipped high, A>0 unclipped, A<0 dual-clipped at c=3,
  // A<0 clipped low. Per-token loss by hand (eps_low 0.2, eps_high 0.28, c 3):
  //   A=+1, r=1.5: max(-1.5, -1.28) = -1.28 (clipped)      A=+1, r=0.5: max(-0.5, -0.8) = -0.5
  //   A=-1, r=5:   min(3, max(5, 1.28)) = 3                 A=-1, r=0.5: min(3, max(0.5, 0.8)) = 0.8 (clipped)
  // The masked-out token (mask 0) contributes nothing. token-mean = (-1.28 - 0.5 + 3 + 0.8) / 4 = 0.505
  const seqA = [3, 14, 15, 9];
  const seqB = [2, 6, 5, 3];
  const [lpA, lpB] = (await w.logprobs([seqA, seqB])).map((r) => r.logprobs);
  const old = (lp: number[], ratios: number[]) => lp.map((x, t) => (t === 0 ? 0 : x - Math.log(ratios[t])));
  const stats = await w.trainStep(
    {
      loss: 'grpo',
      sequences: [
        { ids: seqA, mask: [0, 1, 1, 0], advantage: 1, oldLogprobs: old(lpA, [1, 1.5, 0.5, 7]) },
        { ids: seqB, mask: [0, 0, 1, 1], advantage: -1, oldLogprobs: old(lpB, [1, 9, 5, 0.5]) },
      ],
    },
    { lr: 0 },
  );
  assert.ok(Math.abs(stats.loss - 0.505) < 1e-5, `loss ${stats.loss}`);
  assert.equal(stats.clipFrac, 2 / 4);
  assert.equal(stats.trainedTokens, 4);
  assert.equal(stats.tokens, 8);
  assert.ok(stats.gradNorm > 0);
});

test('SFT loss is the token-mean NLL over mask=1 tokens; entropy is reported over them', {
  timeout: 60_000,
}, async () => {
  const seqs = [
    [1, 2, 3, 4, 5, 6],
    [7, 8, 9],
  ];
  const masks = [
    [0, 0, 1, 1, 0, 1],
    [0, 1, 1],
  ];
  const scored = await w.logprobs(seqs);
  let nll = 0;
  let ent = 0;
  let n = 0;
  seqs.forEach((_, i) => {
    masks[i].forEach((m, t) => {
      if (!m) return;
      nll -= scored[i].logprobs[t];
      ent += scored[i].entropy[t];
      n++;
    });
  });
  // microBatchTokens 4 forces one sequence per micro-batch: the token-mean must not depend on that
  const stats = await w.trainStep(
    { loss: 'sft', sequences: seqs.map((ids, i) => ({ ids, mask: masks[i] })) },
    { lr: 0, microBatchTokens: 4 },
  );
  assert.equal(stats.microBatches, 2);
  assert.ok(Math.abs(stats.loss - nll / n) < 1e-5, `${stats.loss} vs ${nll / n}`);
  assert.ok(Math.abs(stats.entropy - ent / n) < 1e-5);
  assert.equal(stats.clipFrac, 0);
  // micro-mean-batch: each micro-batch's token-mean weighted by its share of sequences
  const perSeq = seqs.map((_, i) => {
    const ts = masks[i].flatMap((m, t) => (m ? [-scored[i].logprobs[t]] : []));
    return ts.reduce((a, b) => a + b, 0) / ts.length;
  });
  const verl = await w.trainStep(
    { loss: 'sft', sequences: seqs.map((ids, i) => ({ ids, mask: masks[i] })) },
    { lr: 0, microBatchTokens: 4, lossAgg: 'micro-mean-batch' },
  );
  assert.ok(Math.abs(verl.loss - (perSeq[0] + perSeq[1]) / 2) < 1e-5, `${verl.loss}`);
});

test('training lowers the SFT loss; warmup scales the learning rate', { timeout: 60_000 }, async () => {
  const local = await PolicyWorker.start({ threads: 1 });
  try {
    await local.init(TEST_CONFIG, 3);
    const batch = {
      loss: 'sft' as const,
      sequences: [{ ids: [1, 2, 3, 4, 1, 2, 3, 4], mask: [0, 1, 1, 1, 1, 1, 1, 1] }],
    };
    const first = await local.trainStep(batch, { lr: 1e-2, warmupSteps: 4 });
    assert.ok(Math.abs(first.lr - 2.5e-3) < 1e-12);
    let last = first;
    for (let i = 0; i < 8; i++) last = await local.trainStep(batch, { lr: 1e-2, warmupSteps: 4 });
    assert.equal(last.lr, 1e-2);
    assert.equal(last.step, 9);
    assert.ok(last.loss < first.loss * 0.5, `${first.loss} -> ${last.loss}`);
  } finally {
    await local.close();
  }
});

test('bad input is rejected with a clear error and the worker keeps serving', {
  timeout: 60_000,
}, async () => {
  await assert.rejects(
    w.trainStep({ loss: 'grpo', sequences: [{ ids: [1, 2], mask: [0, 1] }] }, { lr: 1 }),
    /advantage must be a finite number/,
  );
  await assert.rejects(
    w.trainStep({ loss: 'sft', sequences: [{ ids: [1, 2, 3], mask: [0, 1] }] }, { lr: 1 }),
    /mask has length 2, ids has 3/,
  );
  await assert.rejects(w.generate([[1, 999]], sampling()), /outside the vocabulary/);
  await assert.rejects(
    w.generate([[1]], sampling({ stopStrings: ['x'] })),
    /stopStrings need a tokenizer.json/,
  );
  const ok = await w.generate([[1]], sampling({ maxNewTokens: 2 }));
  assert.equal(ok[0].outputIds.length, 2);
});

test('model dir from `model init`: loads, and stop strings end generation once decoded text contains them', {
  timeout: 120_000,
}, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-worker-'));
  try {
    const info = await initModelDir({ preset: 'tiny', out: dir, seed: 1, worker: { threads: 1 } });
    assert.ok(info.params > 0.7e6 && info.params < 1.2e6, `tiny has ${info.params} params`);
    const local = await PolicyWorker.start({ threads: 1 });
    try {
      const loaded = await local.load(dir);
      assert.equal(loaded.params, info.params);
      const prompt = [[72, 105]];
      const free = await local.generate(prompt, sampling({ temperature: 0, maxNewTokens: 40 }));
      // the char tokenizer maps ids 0..255 to bytes; stop at the first printable ASCII byte generated
      const j = free[0].outputIds.findIndex((id) => id >= 33 && id < 127 && id !== 92);
      assert.ok(j >= 0, 'expected a printable byte among 40 greedy tokens');
      const ch = byteToUnicode()[free[0].outputIds[j]];
      const stopped = await local.generate(
        prompt,
        sampling({ temperature: 0, maxNewTokens: 40, stopStrings: [ch] }),
      );
      assert.deepEqual(stopped[0].outputIds, free[0].outputIds.slice(0, j + 1));
      assert.equal(stopped[0].finishReason, 'stop');
    } finally {
      await local.close();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('micro-batches group sequences by length, so short ones are not padded to long ones', {
  timeout: 60_000,
}, async () => {
  const long = Array.from({ length: 30 }, (_, i) => 1 + (i % 9));
  const short = [2, 3, 4];
  const sequences = [long, short, long, short].map((ids) => ({ ids, mask: ids.map((_, i) => (i ? 1 : 0)) }));
  const scored = await w.logprobs(sequences.map((s) => s.ids));
  const tokens = 2 * long.length + 2 * short.length;
  // in batch order, [long, short] twice would pad every short sequence to 30 tokens
  const stats = await w.trainStep({ loss: 'sft', sequences }, { lr: 0, microBatchTokens: 200 });
  assert.equal(stats.tokens, tokens);
  assert.equal(stats.paddedTokens, tokens);
  assert.equal(stats.microBatches, 2);
  const nll = scored.flatMap((s) => s.logprobs.slice(1)).reduce((a, b) => a - b, 0);
  assert.ok(Math.abs(stats.loss - nll / (tokens - 4)) < 1e-5, `${stats.loss} vs ${nll / (tokens - 4)}`);
});

test('writes to fd 1 from C code (NCCL_DEBUG logs there) never reach the frame stream', {
  timeout: 60_000,
}, async () => {
  // sitecustomize runs before the worker's main: a thread writing straight to fd 1, as a C library would, from
  // 0.5 s on (the worker moves fd 1 within its first 0.1 s), then leaving a mark that it ran
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-fd1-'));
  const mark = join(dir, 'wrote');
  writeFileSync(
    join(dir, 'sitecustomize.py'),
    'import os, threading, time\n' +
      'def spam():\n    time.sleep(0.5)\n    for _ in range(400):\n        os.write(1, b"NCCL INFO junk\\n"); time.sleep(0.005)\n' +
      `    open(${JSON.stringify(mark)}, "w").close()\n` +
      'threading.Thread(target=spam, daemon=True).start()\n',
  );
  const v = await PolicyWorker.start({ threads: 1, env: { PYTHONPATH: dir } });
  try {
    await v.init(TEST_CONFIG, 11);
    for (let i = 0; i < 100 && !existsSync(mark); i++) {
      assert.equal((await v.logprobs(prompts))[0].logprobs.length, prompts[0].length);
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.ok(existsSync(mark), 'the fd 1 writer never finished: the test proved nothing');
    assert.equal((await v.logprobs(prompts))[0].logprobs.length, prompts[0].length);
  } finally {
    await v.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
