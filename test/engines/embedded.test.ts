import assert from 'node:assert/strict';
import { getEventListeners } from 'node:events';
import { test } from 'node:test';
import { EmbeddedEngine } from '../../src/engines/embedded.js';
import { DEFAULT_SAMPLING, type GenerateResult, type SamplingParams } from '../../src/engines/types.js';

const S = { ...DEFAULT_SAMPLING, maxNewTokens: 3 };

// a worker whose calls finish only when the test says so
function heldWorker() {
  const calls: { prompts: number[][]; sampling: SamplingParams; signals?: (AbortSignal | undefined)[] }[] =
    [];
  const release: (() => void)[] = [];
  const worker = {
    generate(prompts: number[][], sampling: SamplingParams, signals?: (AbortSignal | undefined)[]) {
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

test('each request reaches the worker as it comes, with its own sampling, while earlier ones still run', async () => {
  const { worker, calls, release } = heldWorker();
  const e = new EmbeddedEngine(worker);
  const first = e.generate([1], { ...S, seed: 5 });
  const second = e.generate([2], { ...S, temperature: 0.5 });
  assert.equal(calls.length, 2, 'the second did not wait for the first');
  assert.deepEqual(
    calls.map((c) => c.prompts),
    [[[1]], [[2]]],
  );
  assert.equal(calls[0].sampling.seed, 5);
  assert.equal(calls[1].sampling.temperature, 0.5);
  release[1]();
  assert.deepEqual((await second).outputIds, [2, 7, 7], 'answered before the first ends');
  release[0]();
  assert.deepEqual((await first).outputIds, [1, 7, 7]);
  assert.equal(e.calls, 2);
});

test('an aborted request answers at once, the worker gets its signal, the others are served intact', async () => {
  const { worker, calls, release } = heldWorker();
  const e = new EmbeddedEngine(worker);
  const acs = [0, 1, 2].map(() => new AbortController());
  const rs = acs.map((ac, i) => e.generate([10 + i], S, ac.signal));
  acs[1].abort();
  assert.deepEqual(await rs[1], {
    outputIds: [],
    logprobs: [],
    finishReason: 'abort',
    error: 'aborted by caller',
  });
  assert.equal(calls[1].signals?.[0], acs[1].signal, 'the worker gets the row its signal, to stop it');
  const pre = new AbortController();
  pre.abort();
  assert.equal((await e.generate([99], S, pre.signal)).finishReason, 'abort');
  assert.equal(calls.length, 3, 'a request aborted before it was sent never reaches the worker');
  for (const r of release) r();
  assert.deepEqual(
    (await Promise.all([rs[0], rs[2]])).map((r) => r.outputIds),
    [
      [10, 7, 7],
      [12, 7, 7],
    ],
  );
  for (const ac of acs) assert.equal(getEventListeners(ac.signal, 'abort').length, 0);
});

test('a failing worker answers each request with an error naming the cause', async () => {
  const e = new EmbeddedEngine({
    generate: async () => {
      throw new Error('CUDA OOM');
    },
  });
  const f = await Promise.all([e.generate([1], S), e.generate([2], S)]);
  for (const r of f) {
    assert.equal(r.finishReason, 'error');
    assert.match(r.error ?? '', /embedded worker failed: CUDA OOM/);
  }
});

test("load() is the worker engine's report; a capacity set by the user wins; a worker without one gets the default", async () => {
  const report = { running: 3, queued: 1, usedTokens: 800, capacityTokens: 4096, blockTokens: 16 };
  const worker = { generate: async () => [], engineLoad: async () => report };
  assert.deepEqual(await new EmbeddedEngine(worker).load(), report);
  assert.equal((await new EmbeddedEngine(worker, { capacityTokens: 1000 }).load()).capacityTokens, 1000);
  assert.equal(
    (
      await new EmbeddedEngine({
        ...worker,
        engineLoad: async () => ({ ...report, capacityTokens: 0 }),
      }).load()
    ).capacityTokens,
    262_144,
  );
  assert.deepEqual(await new EmbeddedEngine({ generate: async () => [] }).load(), {
    capacityTokens: 262_144,
    queued: 0,
  });
});
