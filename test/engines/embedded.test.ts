import assert from 'node:assert/strict';
import { getEventListeners } from 'node:events';
import { test } from 'node:test';
import { type BatchSampling, EmbeddedEngine } from '../../src/engines/embedded.js';
import { DEFAULT_SAMPLING, type GenerateResult } from '../../src/engines/types.js';

const S = { ...DEFAULT_SAMPLING, maxNewTokens: 3 };

// a worker whose calls finish only when the test says so
function heldWorker() {
  const calls: { prompts: number[][]; sampling: BatchSampling; signals?: (AbortSignal | undefined)[] }[] = [];
  const release: (() => void)[] = [];
  const worker = {
    generate(prompts: number[][], sampling: BatchSampling, signals?: (AbortSignal | undefined)[]) {
      calls.push({ prompts, sampling, signals });
      return new Promise<GenerateResult[]>((res) => {
        release.push(() =>
          res(
            prompts.map((p) => ({ outputIds: [p[0], 7, 7], logprobs: [-1, -1, -1], finishReason: 'length' })),
          ),
        );
      });
    },
  };
  return { worker, calls, release };
}
const tick = () => new Promise((r) => setImmediate(r));

test('an aborted request answers at once, queued or running, and the others are served intact', async () => {
  const { worker, calls, release } = heldWorker();
  const e = new EmbeddedEngine(worker);
  const acs = [0, 1, 2, 3].map(() => new AbortController());
  const running = e.generate([10], S, acs[0].signal);
  await tick(); // [10] runs alone; the next three queue behind it
  const queued = [1, 2, 3].map((i) => e.generate([10 + i], S, acs[i].signal));
  await tick();
  assert.equal(calls.length, 1);
  assert.equal((await e.load()).queued, 3);

  acs[2].abort();
  assert.deepEqual(await queued[1], {
    outputIds: [],
    logprobs: [],
    finishReason: 'abort',
    error: 'aborted by caller',
  });
  assert.equal((await e.load()).queued, 2, 'the aborted request left the queue');
  acs[0].abort();
  assert.equal((await running).finishReason, 'abort', 'a running request does not wait for its batch');
  assert.equal(calls[0].signals?.[0], acs[0].signal, 'the worker gets each row its signal, to stop it');

  release[0]();
  await tick();
  await tick();
  assert.deepEqual(calls[1].prompts, [[11], [13]], 'the aborted request never reached the worker');
  release[1]();
  assert.deepEqual(
    (await Promise.all([queued[0], queued[2]])).map((r) => r.outputIds),
    [
      [11, 7, 7],
      [13, 7, 7],
    ],
  );
  for (const ac of acs) assert.equal(getEventListeners(ac.signal, 'abort').length, 0);
});

test('requests that differ only in seed share a batch, each row with its own seed', async () => {
  const { worker, calls, release } = heldWorker();
  const e = new EmbeddedEngine(worker);
  const rs = [
    e.generate([1], { ...S, seed: 5 }),
    e.generate([2], { ...S, seed: 6 }),
    e.generate([3], S),
    e.generate([4], { ...S, temperature: 0.5, seed: 7 }), // other sampling: its own batch
  ];
  await tick();
  assert.equal(calls.length, 1);
  assert.deepEqual(calls[0].prompts, [[1], [2], [3]]);
  assert.deepEqual(calls[0].sampling.seeds, [5, 6, null]);
  assert.equal(calls[0].sampling.seed, undefined);
  release[0]();
  await tick();
  await tick();
  assert.deepEqual(calls[1].sampling.seeds, [7]);
  assert.equal(calls[1].sampling.temperature, 0.5);
  release[1]();
  await Promise.all(rs);
  assert.equal(e.batches, 2);
});
