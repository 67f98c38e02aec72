import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { fitEngineModel, parseSamples } from '../../src/engines/calibrate.js';
import { SGLangEngine } from '../../src/engines/sglang.js';
import { DEFAULT_SAMPLING } from '../../src/engines/types.js';
import { VllmEngine } from '../../src/engines/vllm.js';
import { modelWeights, syncPlan } from '../../src/recipe/weight-sync.js';
import { PolicyWorker } from '../../src/worker/index.js';
import { TEST_CONFIG } from '../worker/helpers.js';
import { type Api, fakeServer, GEN_PATH, type StepTiming } from './fake-servers.js';

// bench/engine-probe.ts against the fake servers made to take time like a batching engine: the constants it fits
// are the fake's, within timer noise.

// not spawnSync: the fake servers answer from this process's event loop
const probe = (...args: string[]) =>
  new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
    execFile(
      process.execPath,
      ['--import', 'tsx', 'bench/engine-probe.ts', ...args],
      { encoding: 'utf8' },
      (err, stdout, stderr) => resolve({ code: err ? Number(err.code) : 0, stdout, stderr }),
    );
  });

// 20 µs a prefill token: 82 ms across the prefills' span, which a loaded host's timer jitter (a few ms, CI runs test
// files side by side) does not move by 30 % as it could the 20 ms that 5 µs gave
const TIMING: StepTiming = { stepMs: 3, kvMs: 4e-4, seqMs: 0.2, prefillMs: 1, prefillPerTokenMs: 0.02 };
const near = (got: number, want: number, what: string) =>
  assert.ok(Math.abs(got - want) <= 0.3 * want, `${what}: ${got} against the fake's ${want}`);

const prompts = (api: Api, f: { requests: { path: string; body: Record<string, unknown> }[] }) =>
  f.requests
    .filter((q) => q.path === GEN_PATH[api])
    .map((q) => (api === 'sglang' ? q.body.input_ids : q.body.prompt) as number[]);

for (const api of ['sglang', 'vllm'] as const) {
  test(`${api}: ignoreEos asks the server for exactly maxNewTokens, and only when set`, async () => {
    const f = await fakeServer(api);
    try {
      const e = api === 'sglang' ? new SGLangEngine(f.url) : new VllmEngine(f.url);
      const r = await e.generate([1, 2], { ...DEFAULT_SAMPLING, maxNewTokens: 9, ignoreEos: true });
      assert.equal(r.outputIds.length, 9);
      assert.equal(r.finishReason, 'length');
      assert.equal((await e.generate([1, 2], { ...DEFAULT_SAMPLING, maxNewTokens: 9 })).outputIds.length, 3);
      const flags = f.requests
        .filter((q) => q.path === GEN_PATH[api])
        .map(
          (q) => (api === 'sglang' ? (q.body.sampling_params as Record<string, unknown>) : q.body).ignore_eos,
        );
      assert.deepEqual(flags, [true, undefined]);
    } finally {
      await f.close();
    }
  });

  test(`${api}: the probe's samples fit the fake engine's step and prefill times`, async () => {
    const f = await fakeServer(api);
    const dir = mkdtempSync(join(tmpdir(), 'rstar2-probe-'));
    try {
      f.timing = TIMING;
      f.load = { used: 0, running: 0, waiting: 0 };
      const out = join(dir, 'samples.jsonl');
      const r = await probe(
        ...['--engine', `${api}+${f.url}`, '--batches', '1,16', '--contexts', '128,896'],
        ...['--prefills', '256,1024,4096', '--steps', '8,40', '--reps', '3', '--vocab-range', '100,200'],
        ...['--out', out],
      );
      assert.equal(r.code, 0, r.stderr);
      const { steps, prefills } = parseSamples(readFileSync(out, 'utf8'));
      assert.equal(steps.length, 4);
      assert.equal(prefills.length, 3);
      // each point's slope is the fake's step at its batch and KV
      for (const s of steps)
        near(
          s.ms,
          TIMING.stepMs + TIMING.kvMs * s.kv + TIMING.seqMs * s.batch,
          `step at ${JSON.stringify(s)}`,
        );
      const m = fitEngineModel(steps, prefills);
      near(m.stepBaseMs, TIMING.stepMs, 'step base');
      near(m.kvMsPerToken, TIMING.kvMs, 'per KV token');
      near(m.seqMs, TIMING.seqMs, 'per sequence');
      near(m.prefillMsPerToken, TIMING.prefillPerTokenMs, 'prefill per token');
      assert.match(r.stdout, /^fit: step [\d.]+ ms \+ [\d.]+ ns\/KV token/m);
      assert.ok(r.stdout.includes(`npx tsx bench/scheduler-sim.ts --calibrate ${out} --comm-ms 0`), r.stdout);
      // every prompt fresh, drawn from the vocabulary range, and every request generating all its tokens
      const sent = prompts(api, f);
      assert.equal(new Set(sent.map((p) => p.join())).size, sent.length);
      assert.ok(sent.flat().every((id) => id >= 100 && id < 200));
    } finally {
      await f.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
}

test('points whose KV would not fit the pool are skipped and named', async () => {
  const f = await fakeServer('sglang'); // a pool of 123,456 tokens in pages of 16
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-probe-'));
  try {
    // batch 2 must count as one batch on a loaded host (see below): its answers may come back up to N1 = 12
    // steps of 20 ms apart (with N1 = 4 a CI run beside a torch test saw them further apart)
    f.timing = { ...TIMING, stepMs: 20 };
    const out = join(dir, 'samples.jsonl');
    const r = await probe(
      ...['--engine', `sglang+${f.url}`, '--batches', '2,1000', '--contexts', '128'],
      ...['--prefills', '64', '--steps', '12,24', '--reps', '1', '--out', out],
    );
    assert.equal(r.code, 0, r.stderr);
    assert.match(
      r.stdout,
      /skipped, over the KV pool of 123456 tokens: batch 1000 × context 128 \(160000 KV tokens\)/,
    );
    const { steps } = parseSamples(readFileSync(out, 'utf8'));
    assert.deepEqual(
      steps.map((s) => s.batch),
      [2],
    );
    // warm-up, batch 2 at 12 and at 24 new tokens, one prefill: nothing sent at batch 1000
    assert.equal(prompts('sglang', f).length, 1 + 2 + 2 + 1);
    assert.match(r.stdout, /no fit: /); // one decode point fits nothing
  } finally {
    await f.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a point whose batch was prefilled over more than N1 steps is left out and named', async () => {
  const f = await fakeServer('vllm');
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-probe-'));
  try {
    // one request prefilled per step: at batch 16 the first has 8 tokens before the last starts. Steps of 20 ms,
    // so batch 2's two requests may reach the server up to 80 ms apart on a loaded host (with 3 ms steps, one CI
    // run saw them 33 steps apart) and still count as one batch
    f.timing = { ...TIMING, stepMs: 20, admitPerStep: 1 };
    const out = join(dir, 'samples.jsonl');
    const r = await probe(
      ...['--engine', `vllm+${f.url}`, '--batches', '2,16', '--contexts', '128'],
      ...['--prefills', '64', '--steps', '4,12', '--reps', '1', '--out', out],
    );
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /^batch 2 × context 128: [\d.]+ ms per step/m);
    assert.match(r.stdout, /^batch 16 × context 128: left out, answers spread over \d+ steps, more than N1/m);
    assert.match(r.stdout, /left out, not measured at their whole batch: batch 16 × context 128;/);
    assert.deepEqual(
      parseSamples(readFileSync(out, 'utf8')).steps.map((s) => s.batch),
      [2],
    );
  } finally {
    await f.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('refused: an engine that is not SGLang or vLLM, an unreachable server, a context beyond the model', async () => {
  const dead = await fakeServer('sglang');
  const live = await fakeServer('vllm'); // context 32,768 tokens
  try {
    dead.dead = true;
    const [llama, plain, down, long, steps] = await Promise.all([
      probe('--engine', `llamacpp+${live.url}`),
      probe('--engine', live.url),
      probe('--engine', `sglang+${dead.url}`),
      probe('--engine', `vllm+${live.url}`, '--contexts', '512,40000'),
      probe('--engine', `vllm+${live.url}`, '--steps', '96,32'),
    ]);
    for (const r of [llama, plain]) {
      assert.equal(r.code, 2);
      assert.match(r.stderr, /measures SGLang or vLLM servers/);
    }
    assert.equal(down.code, 2);
    assert.ok(down.stderr.includes(`cannot read the server at ${dead.url}`), down.stderr);
    assert.equal(long.code, 2);
    assert.match(
      long.stderr,
      /--contexts 40000: 40000 \+ 96 new tokens do not fit the model's context 32768/,
    );
    assert.match(steps.stderr, /--steps: two new-token counts N1,N2 with N1 < N2/);
    assert.equal(prompts('vllm', live).length, 0);
  } finally {
    await dead.close();
    await live.close();
  }
});

test('the probe first says what the server is and what a weight sync to it would send', {
  timeout: 60_000,
}, async () => {
  const sg = await fakeServer('sglang');
  const vl = await fakeServer('vllm');
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-probe-'));
  const worker = await PolicyWorker.start({ threads: 1 });
  try {
    await worker.init(TEST_CONFIG, 1);
    await worker.save(join(dir, 'model'));
    const small = ['--batches', '1', '--contexts', '16', '--prefills', '16', '--steps', '2,4', '--reps', '1'];
    const [s, v] = await Promise.all([
      probe(
        '--engine',
        `sglang+${sg.url}`,
        ...small,
        '--out',
        join(dir, 's.jsonl'),
        '--model',
        join(dir, 'model'),
      ),
      probe('--engine', `vllm+${vl.url}`, ...small, '--out', join(dir, 'v.jsonl'), '--sync-dtype', 'float16'),
    ]);
    assert.equal(s.code, 0, s.stderr);
    assert.match(
      s.stdout,
      /^engine sglang:\S+: version 0\.5\.12\.dev20260509\+g096ad02b0, dtype not reported, logprobs after temperature, seeds ignored, KV pool 123456 tokens \(blocks of 16\)$/m,
    );
    assert.match(
      s.stdout,
      /^ {2}sglang:\S+ ignores sampling_seed \(started without --enable-deterministic-inference\)/m,
    );
    // an SGLang under --dtype auto serves this float32 model in float16, as vLLM would
    const w = modelWeights(TEST_CONFIG, 'float16');
    const mib = (syncPlan(w, 2 ** 30).bytes / 2 ** 20).toFixed(1);
    assert.match(
      s.stdout,
      new RegExp(
        `^weight sync: broadcast to its 1 rank\\(s\\) in float16: ${w.names.length} tensors, ${mib} MiB, 1 update call\\(s\\) of at most 512 MiB`,
        'm',
      ),
    );
    assert.equal(v.code, 0, v.stderr);
    assert.match(
      v.stdout,
      /^engine vllm:\S+: version \S+, dtype bfloat16, logprobs raw_logprobs, seeds honoured, temperature ≤ 2/m,
    );
    assert.match(
      v.stdout,
      /^ {2}vllm:\S+: --logprobs-mode raw_logprobs: .*--logprobs-mode processed_logprobs/m,
    );
    assert.match(
      v.stdout,
      /^weight sync: disk \(vllm:\S+ serves bfloat16 and the trainer would send float16/m,
    );
  } finally {
    await Promise.all([worker.close(), sg.close(), vl.close()]);
    rmSync(dir, { recursive: true, force: true });
  }
});
