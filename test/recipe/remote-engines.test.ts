import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync } from 'node:fs';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { LlamaCppEngine } from '../../src/engines/llamacpp.js';
import { SGLangEngine } from '../../src/engines/sglang.js';
import { parseRecipe } from '../../src/recipe/config.js';
import { EmbeddedPolicy } from '../../src/recipe/policy.js';
import { Trainer } from '../../src/recipe/trainer.js';
import { readJsonl } from '../../src/util/jsonl.js';
import { PolicyWorker } from '../../src/worker/index.js';
import { SpawnRunner } from '../sandbox/helpers.js';
import { maxAbsDiff } from '../worker/helpers.js';

// Training with a remote rollout engine: a small server that speaks SGLang's /generate,
// /get_server_info and /update_weights_from_disk, backed by a second torch worker that really loads the
// weights it is told to. After the run its weights must be exactly the trainer's.

process.env.RSTAR2_NO_PROGRESS = '1';

const recipe = parseRecipe({
  name: 'remote',
  model: { threads: 1 },
  eval: { n: 2, maxResponseTokens: 32, maxTurns: 2 },
  stages: [
    { type: 'sft', steps: 2, batchSize: 4, demos: 20, checkpointEvery: 2 },
    {
      type: 'rl',
      steps: 2,
      promptsPerStep: 2,
      groupSize: 2,
      oversample: 2,
      maxResponseTokens: 32,
      maxTurns: 2,
      checkpointEvery: 2,
      roc: { minZeroRewardTraceNum: 1, minNonZeroRewardTraceNum: 1, rejectEqualReward: false },
    },
  ],
});

interface Served {
  url: string;
  worker: PolicyWorker;
  updates: { model_path: string; weight_version?: string }[];
  generates: number;
  close(): Promise<void>;
}

async function sglangOverWorker(): Promise<Served> {
  const worker = await PolicyWorker.start({ threads: 1 });
  const s = { updates: [] as Served['updates'], generates: 0 };
  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    let raw = '';
    for await (const c of req) raw += c;
    const body = raw ? JSON.parse(raw) : {};
    const reply = (o: unknown) =>
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(o));
    if (req.url === '/get_server_info') return reply({ max_total_num_tokens: 100_000 });
    if (req.url === '/update_weights_from_disk') {
      s.updates.push(body);
      await worker.load(body.model_path);
      return reply({ success: true, message: 'ok' });
    }
    if (req.url === '/generate') {
      s.generates++;
      const sp = body.sampling_params;
      const [g] = await worker.generate([body.input_ids], {
        temperature: sp.temperature,
        topP: sp.top_p,
        topK: sp.top_k,
        maxNewTokens: sp.max_new_tokens,
        stopTokenIds: sp.stop_token_ids,
        stopStrings: sp.stop,
        ...(sp.sampling_seed === undefined ? {} : { seed: sp.sampling_seed }),
      });
      return reply({
        output_ids: g.outputIds,
        meta_info: {
          output_token_logprobs: g.outputIds.map((id, i) => [g.logprobs[i], id, null]),
          finish_reason: { type: g.finishReason },
        },
      });
    }
    res.writeHead(404).end();
  };
  const server = createServer((req, res) => {
    handle(req, res).catch((e) => res.writeHead(500).end(String(e)));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return Object.assign(s, {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    worker,
    close: async () => {
      server.close();
      await worker.close();
    },
  });
}

test('training on a remote SGLang engine syncs the weights before every rollout after an update', {
  timeout: 170_000,
}, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-remote-'));
  const syncDir = join(dir, 'engine-weights');
  const served = await sglangOverWorker();
  const policy = await EmbeddedPolicy.create(recipe, {
    engines: [new SGLangEngine(served.url)],
    syncDir,
    runner: new SpawnRunner(),
  });
  try {
    await new Trainer(recipe, dir, policy, { log: () => {}, progress: false }).run();
  } finally {
    await policy.close();
  }
  try {
    // syncs: before the eval that opens RL (after SFT), before RL step 2 and before the final eval (after
    // each update); RL step 1 follows the opening eval with no update between, so it needs none
    assert.deepEqual(
      served.updates.map((u) => u.weight_version),
      ['v1', 'v2', 'v3'],
    );
    assert.ok(served.updates.every((u) => u.model_path === syncDir));
    assert.ok(served.generates > 0);
    // every RL step records what its rollout cost on the engines
    const steps = readJsonl<Record<string, any>>(join(dir, 'metrics.jsonl')).filter((m) => m.roc);
    assert.ok(steps.length >= 2);
    for (const m of steps) {
      const r = m.rollout;
      assert.ok(r && r.makespan_s > 0 && r.tail_s >= 0 && r.tail_s <= r.makespan_s, JSON.stringify(r));
      assert.ok(r.idle_frac >= 0 && r.idle_frac <= 1);
      assert.ok(
        r.prompt_share === null || (r.prompt_share >= 0 && r.prompt_share <= 1),
        String(r.prompt_share),
      );
      for (const k of ['reprefilled_tokens', 'prefix_misses', 'retractions', 'moved'])
        assert.ok(Number.isInteger(r[k]), k);
    }
    const trajs = readJsonl<Record<string, any>>(join(dir, 'trajectories', 'rl-step-000002.jsonl'));
    assert.ok(
      trajs.every((t) => t.responseLogprobs.length === t.responseIds.length && t.responseIds.length > 0),
    );
    // the synced directory is a plain HF model (no optimizer state) and nothing is left half-written
    for (const f of ['config.json', 'model.safetensors', 'tokenizer.json'])
      assert.ok(existsSync(join(syncDir, f)), f);
    assert.ok(!existsSync(join(syncDir, 'optimizer.pt')));
    assert.deepEqual(
      readdirSync(dir).filter((f) => f.startsWith('engine-weights')),
      ['engine-weights'],
    );
    // the engine ends with exactly the weights the trainer checkpointed after its last update
    const seq = [[5, 9, 17, 33, 60, 61, 62, 3, 4]];
    const [onEngine] = await served.worker.logprobs(seq);
    await served.worker.load(join(dir, 'checkpoints', 'rl-step-000002'));
    const [trained] = await served.worker.logprobs(seq);
    assert.ok(maxAbsDiff(onEngine.logprobs, trained.logprobs) < 1e-6);
  } finally {
    await served.close();
  }
});

test('an engine without a weight-update endpoint is refused before anything starts', async () => {
  await assert.rejects(
    EmbeddedPolicy.create(recipe, {
      engines: [new LlamaCppEngine('http://127.0.0.1:9')],
      syncDir: tmpdir(),
    }),
    /cannot load new weights .* sglang or vllm/,
  );
  await assert.rejects(
    EmbeddedPolicy.create(recipe, { engines: [new SGLangEngine('http://127.0.0.1:9')] }),
    /needs a syncDir/,
  );
});
