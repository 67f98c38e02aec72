import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Scheduler } from '../../src/engines/scheduler.js';
import { SGLangEngine } from '../../src/engines/sglang.js';
import { DEFAULT_SAMPLING } from '../../src/engines/types.js';
import { VllmEngine } from '../../src/engines/vllm.js';
import { fakeServer, OUT } from './fake-servers.js';

// The scheduler against fake SGLang / vLLM servers: it reads their load endpoints, keeps a trajectory on
// its engine, moves it when the engine stops answering, and avoids an engine whose cache is full.

const FAST = { timeoutMs: 300, retries: 1, backoffMs: 5 };
const S = { ...DEFAULT_SAMPLING, maxNewTokens: 16 };

test('kv-predict polls SGLang /v1/loads and vLLM /metrics and keeps each trajectory on its engine', async () => {
  const sg = await fakeServer('sglang');
  const vl = await fakeServer('vllm');
  try {
    const s = await Scheduler.create([new SGLangEngine(sg.url, FAST), new VllmEngine(vl.url, FAST)], {
      pollMs: 0,
      policy: 'kv-predict',
    });
    s.lengths.seed([100, 200]);
    sg.load = { used: 40_000, running: 5, waiting: 2 };
    vl.load = { used: 8000, running: 1, waiting: 0 };
    await s.poll();
    assert.ok(sg.requests.some((r) => r.path === '/v1/loads?include=core'));
    assert.ok(vl.requests.some((r) => r.path === '/metrics'));
    assert.deepEqual(s.ledger.observed, [40_000, 8000]);
    assert.deepEqual(s.ledger.foreign, [true, true], 'requests we did not send count as foreign load');
    const leases = await Promise.all(
      Array.from({ length: 6 }, (_, i) => s.acquire(2000, undefined, 50, `p${i}`)),
    );
    for (const l of leases) {
      const before = l.index;
      for (let turn = 0; turn < 3; turn++) {
        const r = await l.generate([1, 2, 3, ...Array(turn * 3).fill(7)], S);
        assert.deepEqual(r.outputIds, OUT);
      }
      assert.equal(l.index, before, 'sticky: every turn on the engine it was placed on');
    }
    const gens = (f: typeof sg, path: string) => f.requests.filter((r) => r.path === path).length;
    const onSg = leases.filter((l) => l.index === 0).length;
    assert.equal(gens(sg, '/generate'), 3 * onSg);
    assert.equal(gens(vl, '/v1/completions'), 3 * (6 - onSg));
    for (const l of leases) l.release();
    await s.close();
  } finally {
    await Promise.all([sg.close(), vl.close()]);
  }
});

test('an engine that stops answering: its trajectories move to another engine, nothing is lost', async () => {
  const a = await fakeServer('sglang');
  const b = await fakeServer('sglang');
  try {
    const s = await Scheduler.create([new SGLangEngine(a.url, FAST), new SGLangEngine(b.url, FAST)], {
      pollMs: 0,
    });
    const leases = await Promise.all(Array.from({ length: 4 }, () => s.acquire(1000, undefined, 10, 'p')));
    assert.deepEqual(
      leases.map((l) => l.index),
      [0, 1, 0, 1],
    );
    a.dead = true;
    const results = await Promise.all(leases.map((l) => l.generate([1, 2, 3], S)));
    for (const r of results) assert.deepEqual(r.outputIds, OUT, r.error);
    assert.deepEqual(
      leases.map((l) => l.index),
      [1, 1, 1, 1],
    );
    assert.deepEqual(s.down, [true, false]);
    const next = await s.acquire(1000, undefined, 10);
    assert.equal(next.index, 1, 'a down engine gets no new trajectories');
    a.dead = false;
    await s.poll();
    assert.deepEqual(s.down, [false, false], 'a poll that succeeds brings it back');
    for (const l of [...leases, next]) l.release();
    const stats = s.endRollout();
    assert.equal(stats.moved, 2);
    // with every engine gone the call's error is returned, the trajectory is not dropped silently
    a.dead = true;
    b.dead = true;
    const last = await s.acquire(1000, undefined, 10);
    const r = await last.generate([1], S);
    assert.equal(r.finishReason, 'error');
    last.release();
    await s.close();
  } finally {
    await Promise.all([a.close(), b.close()]);
  }
});

test('an engine reporting a full cache gets no new work under kv-predict or kv-budget; placed work stays', async () => {
  const full = await fakeServer('sglang');
  const free = await fakeServer('sglang');
  try {
    for (const policy of ['kv-predict', 'kv-budget'] as const) {
      full.load = { used: 0, running: 0, waiting: 0 };
      free.load = { used: 0, running: 0, waiting: 0 };
      const s = await Scheduler.create([new SGLangEngine(full.url, FAST), new SGLangEngine(free.url, FAST)], {
        pollMs: 0,
        policy,
      });
      s.lengths.seed([500]);
      const first = await s.acquire(1000, undefined, 10);
      assert.equal(first.index, 0);
      full.load = { used: 123_456, running: 40, waiting: 12 }; // someone else filled it
      await s.poll();
      const placed = await Promise.all(Array.from({ length: 5 }, () => s.acquire(1000, undefined, 10)));
      assert.deepEqual(
        placed.map((l) => l.index),
        [1, 1, 1, 1, 1],
        policy,
      );
      assert.deepEqual((await first.generate([1, 2], S)).outputIds, OUT);
      assert.equal(first.index, 0, 'sticky even on a full engine: the engine queues it');
      for (const l of [first, ...placed]) l.release();
      await s.close();
    }
  } finally {
    await Promise.all([full.close(), free.close()]);
  }
});

for (const api of ['sglang', 'vllm'] as const)
  test(`${api}: a returning turn whose prefix was evicted counts as re-prefilled tokens and lowers the over-commit`, async () => {
    const f = await fakeServer(api);
    try {
      const engine = api === 'sglang' ? new SGLangEngine(f.url, FAST) : new VllmEngine(f.url, FAST);
      const s = await Scheduler.create([engine], { pollMs: 0, policy: 'kv-predict' });
      s.lengths.seed([100]); // placed by kv-predict: only then do its misses move the over-commit
      const prompt = Array.from({ length: 40 }, (_, i) => i + 1);
      const l = await s.acquire(1000, undefined, prompt.length);
      f.cached = 0;
      await l.generate(prompt, S); // first turn: nothing was cached before, nothing re-prefilled
      const before = s.overcommit.value;
      // 40 + 3 output tokens, all but the last sampled one computed (42), kept whole: SGLang reports 42 cached,
      // vLLM whole 16-token blocks only, 32
      f.cached = api === 'sglang' ? 42 : 32;
      const turn2 = [...prompt, ...OUT, 9, 9];
      await l.generate(turn2, S);
      assert.equal(s.overcommit.value, before, 'a prefix kept whole is no miss');
      f.cached = 2; // 47 tokens computed before, only 2 still cached
      await l.generate([...turn2, ...OUT, 9, 9], S);
      assert.ok(s.overcommit.value < before);
      l.release();
      const stats = s.endRollout();
      assert.equal(stats.reprefilled_tokens, 45);
      assert.equal(stats.prefix_misses, 1);
      await s.close();
    } finally {
      await f.close();
    }
  });
