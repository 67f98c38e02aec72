import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { getEventListeners } from 'node:events';
import { test } from 'node:test';
import { runRollouts } from '../../src/agent/loop.js';
import { agentTemplate } from '../../src/agent/template.js';
import { EmbeddedEngine } from '../../src/engines/embedded.js';
import { DEFAULT_SAMPLING, type EngineLoad } from '../../src/engines/types.js';
import { buildCharTokenizer, ChatTemplate, tokenizerFromFiles } from '../../src/tokenizer/index.js';
import { findPython, PYTHON_DIR } from '../../src/util/python.js';
import { MODEL_PRESETS, PolicyWorker } from '../../src/worker/index.js';
import { encodeFrame, type Frame, FrameReader, packRagged } from '../../src/worker/protocol.js';
import { FakeRunner } from '../agent/helpers.js';

test('EmbeddedEngine over a real torch PolicyWorker: concurrent trajectories share decode steps, later turns reuse KV', {
  timeout: 180_000,
}, async () => {
  const tok = tokenizerFromFiles(buildCharTokenizer());
  const worker = await PolicyWorker.start({ threads: 1 });
  try {
    await worker.init({ ...MODEL_PRESETS.tiny, vocab_size: tok.vocabSize }, 7);
    const engine = new EmbeddedEngine(worker, { capacityTokens: 1 << 20 });
    const template = agentTemplate(tok, { chat: ChatTemplate.named('compact') });
    const ts = await runRollouts({
      engines: [engine],
      schedulerOptions: { pollMs: 0 },
      template,
      runner: new FakeRunner(),
      problems: [
        { id: 'a', question: '1+1?' },
        { id: 'b', question: '2+2?' },
      ],
      n: 3,
      maxResponseTokens: 24,
      sampling: { temperature: 1, seed: 3 },
    });
    assert.equal(ts.length, 6);
    for (const t of ts) {
      assert.notEqual(t.finish, 'error', t.error);
      assert.ok(t.responseIds.length > 0 && t.responseIds.length <= 24);
      assert.equal(t.responseLogprobs.length, t.responseIds.length);
      t.responseIds.forEach((id, i) => {
        assert.ok(id >= 0 && id < tok.vocabSize);
        if (t.responseMask[i] === 1)
          assert.ok(t.responseLogprobs[i] <= 0 && Number.isFinite(t.responseLogprobs[i]));
      });
    }
    const gens = ts.reduce((a, t) => a + t.events.filter((e) => e.kind === 'generation').length, 0);
    assert.equal(engine.calls, gens, 'one worker call per generation');
    const st = await worker.engineLoad();
    assert.ok(
      st.decodeSteps < st.generatedTokens / 2,
      `${st.decodeSteps} decode steps for ${st.generatedTokens} tokens`,
    );
    if (gens > ts.length) assert.ok(st.cachedTokens > 0, 'a later turn reused the keys of the earlier ones');
    assert.equal(st.usedTokens, 0, 'every KV block is back in the pool');
  } finally {
    await worker.close();
  }
});

test('seeded requests run together on a real worker, and each draws what it draws alone', {
  timeout: 120_000,
}, async () => {
  const worker = await PolicyWorker.start({ threads: 1 });
  try {
    await worker.init({ ...MODEL_PRESETS.tiny, vocab_size: 64 }, 7);
    const engine = new EmbeddedEngine(worker);
    const s = { ...DEFAULT_SAMPLING, temperature: 1, maxNewTokens: 24 };
    const prompts = [
      [1, 2, 3],
      [4, 5],
      [1, 2, 3],
      [9, 8, 7, 6, 5, 4, 3],
    ];
    const seeds = [11, 12, 13, 14];
    const batched = await Promise.all(prompts.map((p, i) => engine.generate(p, { ...s, seed: seeds[i] })));
    const st = await worker.engineLoad();
    assert.ok(st.decodeSteps < 2 * 24, `${st.decodeSteps} decode steps for 4 × 24 tokens: they ran together`);
    for (const [i, p] of prompts.entries()) {
      const alone = await engine.generate(p, { ...s, seed: seeds[i] });
      assert.deepEqual(alone.outputIds, batched[i].outputIds, `row ${i}`);
      alone.logprobs.forEach((lp, t) => {
        assert.ok(Math.abs(lp - batched[i].logprobs[t]) < 1e-4, `row ${i} token ${t}`);
      });
    }
    assert.notDeepEqual(batched[0].outputIds, batched[2].outputIds, 'same prompt, another seed');
  } finally {
    await worker.close();
  }
});

test('the worker stops a row of a running generate on a cancel frame; a late cancel is ignored', {
  timeout: 120_000,
}, async () => {
  const py = spawn(findPython(), ['-u', '-m', 'rstar2_worker'], {
    env: { ...process.env, PYTHONPATH: PYTHON_DIR, RSTAR2_THREADS: '1', OMP_NUM_THREADS: '1' },
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  const reader = new FrameReader();
  const waiting = new Map<number, (f: Frame) => void>();
  py.stdout.on('data', (c: Buffer) => {
    for (const f of reader.push(c)) waiting.get(Number(f.header.id))?.(f);
  });
  const send = (h: Record<string, unknown>, arrays = {}) => py.stdin.write(encodeFrame(h, arrays));
  const reply = (id: number) => new Promise<Frame>((res) => waiting.set(id, res));
  const generate = (id: number, prompts: number[][], maxNewTokens: number) => {
    const { flat, lens } = packRagged(prompts, 'prompts');
    send({ op: 'generate', id, sampling: { ...DEFAULT_SAMPLING, maxNewTokens } }, { ids: flat, lens });
    return reply(id);
  };
  const outLens = (f: Frame) => Array.from(f.arrays.out_lens);
  try {
    await reply(0); // hello
    send({ op: 'init', id: 1, config: { ...MODEL_PRESETS.tiny, vocab_size: 64 }, seed: 0 });
    await reply(1);
    const long = generate(2, [[1, 2], [3, 4], [5]], 10000);
    // long enough for a first token on a loaded host (300 ms gave none beside other test files and jobs)
    await new Promise((r) => setTimeout(r, 1000));
    send({ op: 'cancel', target: 2, rows: [0] });
    send({ op: 'cancel', target: 2, rows: [2] });
    await new Promise((r) => setTimeout(r, 500));
    send({ op: 'cancel', target: 2, rows: [1] });
    const f = await long;
    assert.deepEqual((f.header.result as { finish: string[] }).finish, ['abort', 'abort', 'abort']);
    const n = outLens(f);
    assert.ok(
      n.every((x) => x > 0 && x < 10000),
      `lengths ${n}`,
    );
    // a cancel aimed at a generate that ended is dropped, and rows not cancelled run to the end
    send({ op: 'cancel', target: 2, rows: [0] });
    const g = generate(3, [[1, 2], [3]], 30);
    send({ op: 'cancel', target: 3, rows: [1] });
    const h = await g;
    assert.deepEqual((h.header.result as { finish: string[] }).finish, ['length', 'abort']);
    assert.equal(outLens(h)[0], 30);
  } finally {
    py.stdin.end();
    py.kill();
  }
});

test('PolicyWorker.generate stops each row once its signal aborts, and keeps no listeners', {
  timeout: 120_000,
}, async () => {
  const worker = await PolicyWorker.start({ threads: 1 });
  try {
    await worker.init({ ...MODEL_PRESETS.tiny, vocab_size: 64 }, 7);
    const acs = [new AbortController(), new AbortController()];
    const s = { ...DEFAULT_SAMPLING, maxNewTokens: 1000 };
    const run = worker.generate([[1, 2], [3], [4]], s, [acs[0].signal, acs[1].signal, undefined]);
    setTimeout(() => {
      for (const ac of acs) ac.abort();
    }, 200);
    const [a, b, c] = await run;
    assert.deepEqual([a.finishReason, b.finishReason, c.finishReason], ['abort', 'abort', 'length']);
    assert.ok(a.outputIds.length < 1000 && b.outputIds.length < 1000 && c.outputIds.length === 1000);
    const [late] = await worker.generate([[5]], s, [acs[0].signal]);
    assert.equal(late.finishReason, 'abort', 'a row whose caller aborted before it was sent stops at once');
    assert.ok(late.outputIds.length < 10, `${late.outputIds.length} tokens`);
    for (const ac of acs) assert.equal(getEventListeners(ac.signal, 'abort').length, 0);
  } finally {
    await worker.close();
  }
});

test('two built-in engines started side by side are two workers, each told its place, both serving', {
  timeout: 180_000,
}, async () => {
  const { mkdtempSync, rmSync } = await import('node:fs');
  const { tmpdir } = await import('node:os');
  const { join } = await import('node:path');
  const { initModelDir } = await import('../../src/worker/index.js');
  const { openRolloutStack } = await import('../../src/agent/stack.js');
  const model = mkdtempSync(join(tmpdir(), 'rstar2-two-engines-'));
  try {
    await initModelDir({ preset: 'tiny', out: join(model, 'm'), force: true, worker: { threads: 1 } });
    const stack = await openRolloutStack({
      engines: ['embedded', 'embedded'],
      model: join(model, 'm'),
      template: 'compact',
      sandbox: new FakeRunner(),
      scheduler: { policy: 'round-robin', pollMs: 0 },
    });
    try {
      const ts = await runRollouts({
        scheduler: stack.scheduler,
        template: stack.template,
        runner: stack.runner,
        problems: [0, 1, 2, 3].map((i) => ({ id: `p${i}`, question: `${i}+1?` })),
        n: 2,
        maxResponseTokens: 16,
        sampling: { temperature: 1, seed: 1 },
      });
      assert.equal(ts.length, 8);
      assert.ok(
        ts.every((t) => t.finish !== 'error'),
        ts.find((t) => t.finish === 'error')?.error,
      );
      const calls = stack.engines.map((e) => (e as EmbeddedEngine).calls);
      assert.ok(
        calls.every((c) => c > 0),
        `calls per engine ${calls}`,
      );
      const loads = (await Promise.all(stack.engines.map((e) => e.load()))) as (EngineLoad & {
        slot?: string;
      })[];
      assert.ok(loads.every((l) => l.capacityTokens > 0));
      assert.deepEqual(
        loads.map((l) => l.slot),
        ['0/2', '1/2'],
      );
    } finally {
      await stack.close();
    }
  } finally {
    rmSync(model, { recursive: true, force: true });
  }
});
