import assert from 'node:assert/strict';
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { EmbeddedEngine } from '../../src/engines/embedded.js';
import { ServeEngine, type ServeWorker } from '../../src/engines/serve.js';
import { SGLangEngine } from '../../src/engines/sglang.js';
import type { SamplingParams, WeightMeta } from '../../src/engines/types.js';
import { parseRecipe } from '../../src/recipe/config.js';
import { EmbeddedPolicy } from '../../src/recipe/policy.js';
import { BroadcastSync } from '../../src/recipe/weight-sync.js';
import { Tokenizer } from '../../src/tokenizer/index.js';
import { PolicyWorker } from '../../src/worker/index.js';
import { initModelDir } from '../../src/worker/init-model.js';
import { SpawnRunner } from '../sandbox/helpers.js';
import { maxAbsDiff, sampling } from '../worker/helpers.js';
import { type ServeProcess, startServe } from './serve-process.js';

// A real `rstar2 serve` process on a tiny random model, driven by the project's SGLang client and by plain fetch
// for the OpenAI routes, against the embedded engine on the same weights in this process.

const dir = mkdtempSync(join(tmpdir(), 'rstar2-serve-'));
const m1 = join(dir, 'm1');
const m2 = join(dir, 'm2');
const ENV = { RSTAR2_KV_TOKENS: '4096' }; // a small pool: the test's requests are short
let served: ServeProcess | undefined;
let url = '';
let worker: PolicyWorker | undefined;
let eos = 0;

before(async () => {
  await initModelDir({ preset: 'tiny', out: m1, seed: 1 });
  await initModelDir({ preset: 'tiny', out: m2, seed: 2 });
  eos = Number(JSON.parse(readFileSync(join(m1, 'config.json'), 'utf8')).eos_token_id);
  served = await startServe(m1, { env: ENV, args: ['--bucket-timeout', '10'] });
  url = served.url;
  worker = await PolicyWorker.start({ threads: 1, env: ENV });
  await worker.load(m1);
});

after(async () => {
  await worker?.close();
  await served?.stop();
  rmSync(dir, { recursive: true, force: true });
});

const post = async (path: string, body: unknown) => {
  const r = await fetch(url + path, { method: 'POST', body: JSON.stringify(body) });
  return { status: r.status, body: (await r.json()) as Record<string, unknown> };
};

const PROMPT = [5, 17, 33, 2, 80, 81, 82, 9];

async function assertSame(client: SGLangEngine, s: SamplingParams, what: string): Promise<number[]> {
  const embedded = new EmbeddedEngine(worker as PolicyWorker);
  const [a, b] = [await client.generate(PROMPT, s), await embedded.generate(PROMPT, s)];
  assert.equal(a.finishReason, b.finishReason, `${what}: ${a.error ?? ''}`);
  assert.deepEqual(a.outputIds, b.outputIds, what);
  assert.ok(maxAbsDiff(a.logprobs, b.logprobs) < 1e-4, `${what}: logprobs ${a.logprobs} vs ${b.logprobs}`);
  return a.outputIds;
}

test('the SGLang client gets from rstar2 serve what the embedded engine gives on the same weights', {
  timeout: 120_000,
}, async () => {
  const lines: string[] = [];
  const client = new SGLangEngine(url, { log: (l) => lines.push(l) });
  const greedy = await assertSame(
    client,
    sampling({ temperature: 0, maxNewTokens: 10, stopTokenIds: [eos] }),
    'greedy',
  );
  assert.ok(greedy.length > 0);
  // a seeded sample at temperature 1 draws the same tokens in the server's batch as in the embedded one
  const seeded = sampling({ temperature: 1, maxNewTokens: 10, seed: 7, stopTokenIds: [eos] });
  await assertSame(client, seeded, 'seeded');
  const other = await client.generate(PROMPT, { ...seeded, seed: 8 });
  assert.notDeepEqual(other.outputIds, (await client.generate(PROMPT, seeded)).outputIds);

  // what the trainer reads before a run: version, dtype, seeds, the KV pool (no warning about SGLang's version)
  const report = await client.describe();
  assert.equal(report.seeds, true);
  assert.equal(report.dtype, 'float32');
  assert.equal(report.kv.capacityTokens, 4096);
  assert.equal(report.kv.blockTokens, 16);
  assert.deepEqual(report.notes, []);
  assert.deepEqual(await client.weightGroupRanks(), 1);
  assert.deepEqual(await client.context(), { tokens: 4096, spare: 1, maxInput: 4095 });

  // the prefix cache serves a repeated prompt (whole blocks of 16), until it is flushed
  const long = Array.from({ length: 40 }, (_, i) => (i * 7) % 250);
  await client.generate(long, seeded);
  const again = await client.generate(long, seeded);
  assert.equal(again.cachedTokens, 32);
  const flushed = await fetch(`${url}/flush_cache`, { method: 'POST' });
  assert.equal(flushed.status, 200);
  assert.equal((await client.generate(long, seeded)).cachedTokens, 0);
  assert.deepEqual(lines, []);
});

test('load reports KV in use while requests run', { timeout: 120_000 }, async () => {
  const client = new SGLangEngine(url, { log: () => {} });
  const long = sampling({ temperature: 1, maxNewTokens: 400, seed: 1, ignoreEos: true });
  const running = Promise.all([1, 2, 3].map((i) => client.generate([...PROMPT, i], long)));
  let busiest = 0;
  let seen = 0;
  for (let i = 0; i < 200 && seen < 3; i++) {
    const l = await client.load();
    busiest = Math.max(busiest, l.usedTokens ?? 0);
    seen = Math.max(seen, (l.running ?? 0) + (l.queued ?? 0));
    await new Promise((r) => setTimeout(r, 20));
  }
  const done = await running;
  assert.ok(done.every((r) => r.outputIds.length === 400));
  assert.ok(busiest > PROMPT.length, `KV tokens in use at most ${busiest}`);
  assert.ok(seen >= 2, `at most ${seen} requests seen at once`);
  // a flush while requests run is refused, as SGLang refuses it
  const busy = client.generate(PROMPT, long);
  await new Promise((r) => setTimeout(r, 50));
  const refused = await fetch(`${url}/flush_cache`, { method: 'POST' });
  const text = await refused.text();
  await busy;
  assert.equal(refused.status, 400, text);
  assert.match(text, /running or waiting/);
});

test('an update from disk changes what is served and bumps the version; a bad one leaves the old weights', {
  timeout: 120_000,
}, async () => {
  const client = new SGLangEngine(url, { log: () => {} });
  const greedy = sampling({ temperature: 0, maxNewTokens: 10, stopTokenIds: [eos] });
  const before = await client.generate(PROMPT, greedy);
  // another shape is refused before anything loads
  const wide = join(dir, 'wide');
  cpSync(m2, wide, { recursive: true });
  const cfg = JSON.parse(readFileSync(join(wide, 'config.json'), 'utf8'));
  writeFileSync(join(wide, 'config.json'), JSON.stringify({ ...cfg, hidden_size: 256 }));
  for (const [path, why] of [
    [wide, /hidden_size is 256, the served model's 128/],
    [join(dir, 'missing'), /no such directory/],
  ] as const) {
    const r = await post('/update_weights_from_disk', { model_path: path, weight_version: 'bad' });
    assert.equal(r.status, 400);
    assert.equal(r.body.success, undefined);
    assert.match(String(r.body.message), why);
  }
  // weights that do not load (a truncated file) fail whole: the old model serves on
  const broken = join(dir, 'broken');
  cpSync(m2, broken, { recursive: true });
  writeFileSync(
    join(broken, 'model.safetensors'),
    readFileSync(join(m2, 'model.safetensors')).subarray(0, 5000),
  );
  await assert.rejects(client.updateWeightsFromDisk(broken, 'bad'), /HTTP 400.*old weights serve on/);
  assert.deepEqual((await client.generate(PROMPT, greedy)).outputIds, before.outputIds);

  await client.updateWeightsFromDisk(m2, 'v2');
  await worker?.load(m2);
  const after = await assertSame(client, greedy, 'greedy on m2');
  assert.notDeepEqual(after, before.outputIds);
  const info = (await (await fetch(`${url}/get_model_info`)).json()) as Record<string, unknown>;
  assert.equal(info.weight_version, 'v2');
  assert.equal(info.model_path, m2);
  const raw = await post('/generate', { input_ids: PROMPT, sampling_params: { max_new_tokens: 2 } });
  assert.equal((raw.body.meta_info as Record<string, unknown>).weight_version, 'v2');
  assert.deepEqual(await (await fetch(`${url}/get_weight_version`)).json(), { weight_version: 'v2' });
});

test("a trainer broadcasts to rstar2 serve: it serves the trainer's weights; a push failing part-way leaves the old", {
  timeout: 180_000,
}, async () => {
  const trainer = await PolicyWorker.start({ threads: 1, env: ENV });
  // bucket `spoil` goes to the server with a name the model lacks, or never (`stall`)
  class Flaky extends SGLangEngine {
    calls = 0;
    spoil = 0;
    stall = false;
    override async updateWeightsFromDistributed(
      meta: WeightMeta,
      group: string,
      opts?: { version?: string; last?: boolean },
    ): Promise<void> {
      if (++this.calls === this.spoil) {
        if (this.stall) return new Promise(() => {});
        meta = { ...meta, names: meta.names.map((n) => `${n}.stale`) };
      }
      return super.updateWeightsFromDistributed(meta, group, opts);
    }
  }
  const lines: string[] = [];
  const greedy = sampling({ temperature: 0, maxNewTokens: 10, stopTokenIds: [eos] });
  const version = async () =>
    ((await (await fetch(`${url}/get_weight_version`)).json()) as { weight_version: string }).weight_version;
  try {
    await trainer.load(m1); // the server serves m2 since the disk update
    const engine = new Flaky(url, { log: () => {} });
    const opts = { backend: 'gloo' as const, timeoutS: 30, bucketTimeoutS: 5, bucketBytes: 256 << 10 };
    const sync = new BroadcastSync(trainer, [engine], { ...opts, log: (l) => lines.push(l) });
    assert.equal(await sync.push('v3'), true, lines.join('\n'));
    assert.ok(engine.calls > 3, `${engine.calls} buckets`);
    const own = await new EmbeddedEngine(trainer).generate(PROMPT, greedy);
    const served = await engine.generate(PROMPT, greedy);
    assert.deepEqual(served.outputIds, own.outputIds);
    assert.ok(maxAbsDiff(served.logprobs, own.logprobs) < 1e-4);
    assert.equal(await version(), 'v3');

    // the next update: its third bucket names weights the model lacks; the two before it were held, not loaded
    await trainer.trainStep(
      { loss: 'sft', sequences: [{ ids: PROMPT, mask: PROMPT.map((_, i) => (i ? 1 : 0)) }] },
      { lr: 5e-2 },
    );
    assert.notDeepEqual((await new EmbeddedEngine(trainer).generate(PROMPT, greedy)).logprobs, own.logprobs);
    engine.calls = 0;
    engine.spoil = 3;
    const t0 = Date.now();
    assert.equal(await sync.push('v4'), false);
    assert.match(
      lines.join('\n'),
      /warning: weight sync: broadcast failed: .*HTTP 400.*no weight 'model\.\S+\.stale'.*old weights serve on \(\d+ tensors received before it were dropped\).*through disk/,
    );
    const after = await engine.generate(PROMPT, greedy);
    assert.deepEqual(after.outputIds, served.outputIds);
    assert.ok(maxAbsDiff(after.logprobs, served.logprobs) < 1e-6, 'the old weights, whole');
    assert.equal(await version(), 'v3');
    // the trainer's send of the bucket no one receives ends at the bucket's deadline, not the join's 30 s
    await trainer.logprobs([PROMPT]);
    assert.ok(Date.now() - t0 < 25_000, `the trainer was held ${Date.now() - t0} ms`);

    // an engine that stops answering part-way: the push fails at that bucket's deadline; a new group works after
    const stalled = new Flaky(url, { log: () => {} });
    stalled.spoil = 2;
    stalled.stall = true;
    const again = new BroadcastSync(trainer, [stalled], { ...opts, log: (l) => lines.push(l) });
    assert.equal(await again.push('v5'), false);
    // whichever comes first: the bucket's deadline here, or the trainer's send timing out as soon
    assert.match(lines.at(-1) ?? '', /bucket 2 of \d+ did not arrive within 5 s|Timed out waiting 5000ms/);
    assert.deepEqual((await engine.generate(PROMPT, greedy)).outputIds, served.outputIds);
    const fresh = new BroadcastSync(trainer, [new SGLangEngine(url, { log: () => {} })], {
      ...opts,
      log: (l) => lines.push(l),
    });
    assert.equal(await fresh.push('v6'), true, lines.join('\n'));
    const trained = await new EmbeddedEngine(trainer).generate(PROMPT, greedy);
    const now = await engine.generate(PROMPT, greedy);
    assert.ok(maxAbsDiff(now.logprobs, trained.logprobs) < 1e-4);
    assert.equal(await version(), 'v6');
  } finally {
    await trainer.close();
  }
});

test('bad requests get 4xx naming the problem', { timeout: 60_000 }, async () => {
  const cases: [string, unknown, number, RegExp][] = [
    [
      '/generate',
      { input_ids: PROMPT, sampling_params: { max_new_tokens: 4, beam: 2 } },
      400,
      /beam is not a sampling parameter/,
    ],
    [
      '/generate',
      { input_ids: PROMPT, sampling_params: { repetition_penalty: 1.2 } },
      400,
      /repetition_penalty = 1.2 is not served/,
    ],
    ['/generate', { input_ids: [1, 999999] }, 400, /input_ids\[1\] = 999999 is not a token id/],
    ['/generate', { input_ids: [] }, 400, /non-empty list of token ids/],
    ['/generate', { input_ids: PROMPT, stream: true }, 400, /stream is not served/],
    [
      '/generate',
      { input_ids: PROMPT, sampling_params: { max_new_tokens: 5000 } },
      400,
      /maximum context length of 4096/,
    ],
    [
      '/generate',
      { input_ids: PROMPT, return_logprob: true, logprob_start_len: 0 },
      400,
      /logprob_start_len/,
    ],
    ['/generate', {}, 400, /send input_ids/],
    [
      '/update_weights_from_distributed',
      { names: ['x'], dtypes: ['float32'], shapes: [[1]], group_name: 'nope' },
      400,
      /no weight update group/,
    ],
    [
      '/init_weights_update_group',
      { master_address: '127.0.0.1', master_port: 1, world_size: 2, rank_offset: 0, group_name: 'g' },
      400,
      /rank_offset/,
    ],
    ['/v1/completions', { prompt: PROMPT, max_tokens: 4, echo: true }, 400, /echo is not served/],
    ['/v1/completions', { prompt: PROMPT, model: 'gpt-4' }, 404, /gpt-4.*does not exist/],
    ['/v1/chat/completions', { messages: [{ role: 'wizard', content: 'x' }] }, 400, /role must be/],
    [
      '/v1/chat/completions',
      { messages: [{ role: 'user', content: 'x' }], tool_choice: 'required' },
      400,
      /tool_choice/,
    ],
  ];
  for (const [path, body, status, why] of cases) {
    const r = await post(path, body);
    const message = String((r.body.error as { message?: string } | undefined)?.message ?? r.body.message);
    assert.equal(r.status, status, `${path} ${JSON.stringify(body)}: ${message}`);
    assert.match(message, why, path);
  }
  const notJson = await fetch(`${url}/generate`, { method: 'POST', body: '{"input_ids": [1,' });
  assert.equal(notJson.status, 400);
  assert.match(await notJson.text(), /not JSON/);
  assert.equal((await fetch(`${url}/nope`)).status, 404);
  assert.equal((await fetch(`${url}/generate`)).status, 405);
});

test("OpenAI routes: models, completions by text and by ids, chat with the model's template; metrics count them", {
  timeout: 120_000,
}, async () => {
  const models = (await (await fetch(`${url}/v1/models`)).json()) as { data: Record<string, unknown>[] };
  assert.equal(models.data[0].id, 'm1'); // the directory it started with
  assert.equal(models.data[0].max_model_len, 4096);
  const tok = Tokenizer.load(m1);
  const text = await post('/v1/completions', { prompt: 'hello', max_tokens: 6, temperature: 0, logprobs: 0 });
  assert.equal(text.status, 200, JSON.stringify(text.body));
  const choice = (text.body.choices as Record<string, unknown>[])[0];
  const ids = choice.token_ids as number[];
  const byIds = await post('/v1/completions', { prompt: tok.encode('hello'), max_tokens: 6, temperature: 0 });
  assert.deepEqual((byIds.body.choices as Record<string, unknown>[])[0].token_ids, ids);
  assert.equal((choice.logprobs as { token_logprobs: number[] }).token_logprobs.length, ids.length);
  const stopped = ids.indexOf(eos);
  assert.equal(choice.text, tok.decode(stopped >= 0 ? ids.slice(0, stopped) : ids, { skipSpecial: true }));
  const usage = text.body.usage as Record<string, number>;
  assert.equal(usage.prompt_tokens, tok.encode('hello').length);
  assert.equal(usage.completion_tokens, ids.length);
  // n samples with a seed: each its own, the same again for the same seed
  const n = await post('/v1/completions', { prompt: 'hi', max_tokens: 8, n: 2, seed: 3 });
  const [c0, c1] = n.body.choices as Record<string, unknown>[];
  assert.notDeepEqual(c0.token_ids, c1.token_ids);
  const n2 = await post('/v1/completions', { prompt: 'hi', max_tokens: 8, n: 2, seed: 3 });
  assert.deepEqual((n2.body.choices as Record<string, unknown>[])[1].token_ids, c1.token_ids);

  const chat = await post('/v1/chat/completions', {
    model: 'm1',
    messages: [{ role: 'user', content: [{ type: 'text', text: '1+1?' }] }],
    max_tokens: 5,
    temperature: 0,
  });
  assert.equal(chat.status, 200, JSON.stringify(chat.body));
  const rendered = tok.encode(
    (await import('../../src/tokenizer/index.js')).ChatTemplate.fromTokenizer(tok).render(
      [{ role: 'user', content: '1+1?' }],
      { addGenerationPrompt: true, vars: tok.templateVars() },
    ),
  );
  assert.equal((chat.body.usage as Record<string, number>).prompt_tokens, rendered.length);
  const msg = (chat.body.choices as { message: Record<string, unknown> }[])[0].message;
  assert.equal(msg.role, 'assistant');
  assert.equal(typeof msg.content, 'string');

  const metrics = await (await fetch(`${url}/metrics`)).text();
  const value = (name: string) => Number(new RegExp(`^${name}\\{[^}]*\\} (\\S+)$`, 'm').exec(metrics)?.[1]);
  assert.ok(value('sglang:num_requests_total') >= 6, metrics);
  assert.ok(value('sglang:generation_tokens_total') >= 6 + 6 + 16 + 5);
  assert.equal(value('sglang:max_total_num_tokens'), 4096);
  assert.equal(value('rstar2:weight_updates_total'), 3); // the disk update and the two broadcasts above
});

test('chat: tool calls the model writes come back as tool_calls', async () => {
  const tok = Tokenizer.load(m1);
  const said = 'let me run it <tool_call>{"name": "python", "arguments": {"code": "print(2)"}}</tool_call>';
  let prompt: number[] = [];
  const stub: ServeWorker = {
    info: null,
    restarts: 0,
    generate: async (prompts) => {
      prompt = prompts[0];
      const outputIds = [...tok.encode(said), eos];
      return [{ outputIds, logprobs: outputIds.map(() => -0.5), finishReason: 'stop', cachedTokens: 0 }];
    },
    engineLoad: async () =>
      ({
        capacityTokens: 4096,
        usedTokens: 0,
        running: 0,
        queued: 0,
        blockTokens: 16,
        maxLen: 4096,
      }) as never,
    load: async () => ({}) as never,
    flushCache: async () => {},
    joinWeightGroupAsEngine: async () => {},
    receiveWeights: async () => ({ applied: 0 }),
  };
  const e = new ServeEngine(stub, m1);
  const tools = [
    {
      type: 'function',
      function: {
        name: 'python',
        description: 'run code',
        parameters: { type: 'object', properties: { code: { type: 'string' } }, required: ['code'] },
      },
    },
  ];
  const r = await e.chat(
    { messages: [{ role: 'user', content: 'what is 1+1' }], tools },
    new AbortController().signal,
  );
  const choice = (r.choices as Record<string, unknown>[])[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  const m = choice.message as {
    content: string;
    tool_calls: { type: string; function: Record<string, string> }[];
  };
  assert.equal(m.content, 'let me run it');
  assert.deepEqual(
    m.tool_calls.map((c) => [c.type, c.function.name, JSON.parse(c.function.arguments)]),
    [['function', 'python', { code: 'print(2)' }]],
  );
  // the tools reached the prompt through the model's template
  assert.match(tok.decode(prompt), /python/);
  // a worker that died and was restarted serves the loaded directory again: the version says so
  e.setWeightVersion('v9');
  assert.equal(e.weightVersion, 'v9');
  stub.restarts = 1;
  assert.equal(e.weightVersion, 'default');
  // without tools the same text is plain content
  const plain = await e.chat({ messages: [{ role: 'user', content: 'x' }] }, new AbortController().signal);
  assert.equal(
    ((plain.choices as Record<string, unknown>[])[0].message as { content: string }).content,
    said,
  );
});

test("a run's first sync pushes the trainer's weights before its first rollout, by disk and by broadcast", {
  timeout: 300_000,
}, async () => {
  const client = new SGLangEngine(url, { log: () => {} });
  const recipe = parseRecipe({ model: { path: m1, threads: 1 }, stages: [{ type: 'rl', steps: 1 }] });
  const req = {
    problems: [{ id: 'p', question: 'What is 1+1?', answer: '2' }],
    n: 2,
    maxResponseTokens: 12,
    maxTurns: 1,
    temperature: 1,
    seed: 1,
  };
  for (const mode of ['disk', 'nccl'] as const) {
    // the engine serves other weights than the trainer starts from: they must be replaced, never trusted
    await client.updateWeightsFromDisk(m2, 'other');
    const lines: string[] = [];
    const policy = await EmbeddedPolicy.create(recipe, {
      engines: [new SGLangEngine(url, { log: () => {} })],
      syncDir: join(dir, `sync-${mode}`),
      runner: new SpawnRunner(),
      log: (l) => lines.push(l),
      weightSync: { mode, backend: 'gloo', timeoutS: 30, bucketTimeoutS: 10 },
    });
    try {
      const trajs = await policy.rollout(req);
      const info = (await (await fetch(`${url}/get_model_info`)).json()) as Record<string, unknown>;
      assert.equal(info.weight_version, 'v1', lines.join('\n'));
      if (mode === 'nccl')
        assert.ok(
          lines.some((l) => /^weight sync v1: broadcast/.test(l)),
          lines.join('\n'),
        );
      else assert.equal(info.model_path, join(dir, 'sync-disk'));
      // the first rollout ran on the trainer's weights: its logprobs are the trainer's own scoring of it
      const scored = await policy.recomputeLogprobs(trajs, 1);
      assert.equal(trajs.length, 2);
      for (const [i, t] of trajs.entries()) {
        assert.ok(t.responseIds.length > 0);
        assert.ok(maxAbsDiff(t.responseLogprobs, scored[i]) < 1e-4, `${mode}: trajectory ${i}`);
      }
    } finally {
      await policy.close();
    }
  }
});
