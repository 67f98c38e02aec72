import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { remoteEngine } from '../../src/engines/factory.js';
import { LlamaCppEngine } from '../../src/engines/llamacpp.js';
import { SGLangEngine } from '../../src/engines/sglang.js';
import { DEFAULT_SAMPLING, type Engine, type SamplingParams } from '../../src/engines/types.js';
import { VllmEngine } from '../../src/engines/vllm.js';

import { type Api, fakeServer, GEN_PATH, LPS, OUT } from './fake-servers.js';

const S: SamplingParams = { ...DEFAULT_SAMPLING, maxNewTokens: 16, stopTokenIds: [13], temperature: 0.7 };
const FAST = { timeoutMs: 200, retries: 2, backoffMs: 5 };

function make(api: Api, url: string, opts = FAST): Engine {
  if (api === 'sglang') return new SGLangEngine(url, opts);
  if (api === 'vllm') return new VllmEngine(url, opts);
  return new LlamaCppEngine(url, opts);
}

for (const api of ['sglang', 'vllm', 'llamacpp'] as Api[]) {
  test(`${api}: token-in/token-out request shape and result`, async () => {
    const f = await fakeServer(api);
    try {
      const e = make(api, f.url);
      const r = await e.generate([1, 2, 3], S);
      assert.deepEqual(r, { outputIds: OUT, logprobs: LPS, finishReason: 'stop' });
      const gen = f.requests.find((q) => q.path === GEN_PATH[api]);
      assert.ok(gen);
      if (api === 'sglang') {
        assert.deepEqual(gen.body.input_ids, [1, 2, 3]);
        assert.equal(gen.body.return_logprob, true);
        const sp = gen.body.sampling_params as Record<string, unknown>;
        assert.equal(sp.max_new_tokens, 16);
        assert.deepEqual(sp.stop_token_ids, [13]);
        assert.equal(sp.no_stop_trim, true);
        assert.equal(sp.skip_special_tokens, false);
        // neutral penalties, so no model default (generation_config.json) changes what is sampled
        assert.deepEqual([sp.repetition_penalty, sp.frequency_penalty, sp.presence_penalty], [1, 0, 0]);
      } else if (api === 'vllm') {
        assert.deepEqual(gen.body.prompt, [1, 2, 3]);
        assert.equal(gen.body.model, 'tiny-model');
        assert.equal(gen.body.max_tokens, 16);
        assert.equal(gen.body.return_token_ids, true);
        assert.equal(gen.body.logprobs, 0);
        const b = gen.body;
        assert.deepEqual([b.repetition_penalty, b.frequency_penalty, b.presence_penalty], [1, 0, 0]);
      } else {
        assert.deepEqual(gen.body.prompt, [1, 2, 3]);
        assert.equal(gen.body.n_predict, 16);
        assert.equal(gen.body.return_tokens, true);
        assert.equal(gen.body.n_probs, 1);
        assert.equal(gen.body.top_k, 0, 'top_k -1 means off, which llama.cpp spells 0');
        assert.equal(gen.body.repeat_penalty, 1);
      }
    } finally {
      await f.close();
    }
  });

  test(`${api}: 5xx, dropped connections and slow responses are retried`, async () => {
    const f = await fakeServer(api);
    try {
      const e = make(api, f.url);
      f.modes.push('503', 'drop');
      assert.equal((await e.generate([1], S)).finishReason, 'stop');
      f.modes.push('slow'); // 400 ms > 200 ms per-attempt timeout, then ok
      assert.deepEqual((await e.generate([1], S)).outputIds, OUT);
      const gens = f.requests.filter((q) => q.path === GEN_PATH[api]).length;
      assert.equal(gens, 5);
    } finally {
      await f.close();
    }
  });

  test(`${api}: persistent failure and 4xx are reported, not thrown or lost`, async () => {
    const f = await fakeServer(api);
    try {
      const e = make(api, f.url);
      f.modes.push('503', '503', '503');
      const r = await e.generate([1], S);
      assert.equal(r.finishReason, 'error');
      assert.match(r.error ?? '', /failed after 3 attempts: HTTP 503/);
      f.modes.push('400');
      const r2 = await e.generate([1], S);
      assert.equal(r2.finishReason, 'error');
      assert.match(r2.error ?? '', /HTTP 400: .*input too long/);
      await f.close();
      const r3 = await e.generate([1], S);
      assert.equal(r3.finishReason, 'error');
      assert.match(r3.error ?? '', /failed after 3 attempts/);
    } finally {
      await f.close().catch(() => {});
    }
  });

  test(`${api}: server-side abort returns the partial output; caller abort returns 'abort'`, async () => {
    const f = await fakeServer(api);
    try {
      const e = make(api, f.url);
      f.modes.push('abort');
      const r = await e.generate([1], S);
      assert.equal(r.finishReason, 'abort');
      assert.deepEqual(r.outputIds, [11]);
      assert.deepEqual(r.logprobs, [-0.1]);
      f.modes.push('slow');
      const ac = new AbortController();
      setTimeout(() => ac.abort(), 50);
      const r2 = await make(api, f.url, { timeoutMs: 5000, retries: 2, backoffMs: 5 }).generate(
        [1],
        S,
        ac.signal,
      );
      assert.equal(r2.finishReason, 'abort');
      assert.match(r2.error ?? '', /aborted by caller/);
    } finally {
      await f.close();
    }
  });
}

test('load(): capacity and live usage from each backend', async () => {
  const sg = await fakeServer('sglang');
  const vl = await fakeServer('vllm');
  const ll = await fakeServer('llamacpp');
  try {
    // one rank, then two data-parallel ranks (engine cores), each with half the pool: the same totals
    for (const dp of [1, 2] as const) {
      sg.dp = dp;
      vl.dp = dp;
      assert.deepEqual(await new SGLangEngine(sg.url).load(), {
        capacityTokens: 123456,
        usedTokens: 1500,
        running: 3,
        queued: 1,
        blockTokens: 16,
      });
      assert.deepEqual(await new VllmEngine(vl.url).load(), {
        capacityTokens: 16000,
        usedTokens: 1500,
        running: 3,
        queued: 1,
        blockTokens: 16,
      });
    }
    assert.deepEqual(await new LlamaCppEngine(ll.url).load(), {
      capacityTokens: 8192,
      running: 1,
      queued: 0,
    });
    // a given capacity replaces the server's; its page size, which decides what a prefix miss is, still counts
    const given = await new SGLangEngine(sg.url, { capacityTokens: 77 }).load();
    assert.deepEqual([given.capacityTokens, given.blockTokens], [77, 16]);
  } finally {
    await Promise.all([sg.close(), vl.close(), ll.close()]);
  }
});

test('weight-update hooks call the documented endpoints', async () => {
  const sg = await fakeServer('sglang');
  const vl = await fakeServer('vllm');
  try {
    const ckpt = mkdtempSync(join(tmpdir(), 'rstar2-ckpt-'));
    writeFileSync(join(ckpt, 'config.json'), '{}');
    writeFileSync(join(ckpt, 'model.safetensors'), 'weights v5');
    await new SGLangEngine(sg.url).updateWeightsFromDisk(ckpt, 'v5');
    const u = sg.requests.find((q) => q.path === '/update_weights_from_disk');
    assert.deepEqual(u?.body, { model_path: ckpt, weight_version: 'v5' });
    assert.equal(sg.reloads.length, 1);
    // a directory it cannot load is SGLang's 400, reported
    await assert.rejects(
      new SGLangEngine(sg.url).updateWeightsFromDisk('/ckpt/step-5', 'v5'),
      /HTTP 400: .*Failed to get weights iterator: \/ckpt\/step-5/,
    );
    // vLLM reloads the directory it was started with: only that one may be the sync directory
    const served = mkdtempSync(join(tmpdir(), 'rstar2-vllm-model-'));
    writeFileSync(join(served, 'model.safetensors'), 'weights v1');
    vl.modelPath = served;
    await assert.rejects(
      new VllmEngine(vl.url).updateWeightsFromDisk('/ckpt'),
      new RegExp(`serves ${served}, not the sync directory /ckpt: .*Start it with --model /ckpt`),
    );
    assert.equal(vl.requests.filter((q) => q.path === '/collective_rpc').length, 0);
    vl.requests.length = 0;
    await new VllmEngine(vl.url).updateWeightsFromDisk(`${served}/`);
    assert.deepEqual(
      vl.requests.map((q) => q.path),
      ['/v1/models', '/collective_rpc', '/reset_prefix_cache'],
      'the old weights’ cached prefixes are dropped after the reload',
    );
    assert.deepEqual(vl.requests[1].body, { method: 'reload_weights' });
    writeFileSync(join(served, 'model.safetensors'), 'weights v2');
    await new VllmEngine(vl.url).updateWeightsFromDisk(served);
    assert.equal(vl.reloads.length, 2);
    assert.notEqual(vl.reloads[0], vl.reloads[1]); // each reload read what the directory held then
    // broadcast sync covers tensor-parallel ranks; data-parallel servers are refused by name
    assert.equal(await new SGLangEngine(sg.url).weightGroupRanks(), 1);
    assert.equal(await new VllmEngine(vl.url).weightGroupRanks(), 1);
    sg.dp = 2;
    vl.dp = 2;
    await assert.rejects(new SGLangEngine(sg.url).weightGroupRanks(), /dp_size 2/);
    await assert.rejects(new VllmEngine(vl.url).weightGroupRanks(), /2 data-parallel engine cores/);
  } finally {
    await Promise.all([sg.close(), vl.close()]);
  }
});

test('bad engine URLs are rejected with a clear message', () => {
  assert.throws(() => new SGLangEngine('localhost:30000'), /invalid engine URL 'localhost:30000'/);
  assert.throws(() => new VllmEngine('not a url'), /invalid engine URL/);
});

test('remoteEngine picks the backend from the spec prefix or the default', () => {
  assert.ok(remoteEngine('http://127.0.0.1:30000') instanceof SGLangEngine);
  assert.ok(remoteEngine('vllm+http://127.0.0.1:8000') instanceof VllmEngine);
  assert.ok(remoteEngine('llamacpp+http://127.0.0.1:8080') instanceof LlamaCppEngine);
  assert.ok(remoteEngine('http://127.0.0.1:8000', { backend: 'vllm' }) instanceof VllmEngine);
  assert.equal(remoteEngine('sglang+http://h:1/').name, 'sglang:http://h:1');
  assert.throws(() => remoteEngine('tgi+http://h:1'), /unknown engine backend 'tgi'/);
});
