import assert from 'node:assert/strict';
import { test } from 'node:test';
import { SGLangEngine } from '../../src/engines/sglang.js';
import { VllmEngine } from '../../src/engines/vllm.js';
import { parseRecipe } from '../../src/recipe/config.js';
import { dryRun } from '../../src/recipe/dry-run.js';
import { checkEngines, logprobsMismatch } from '../../src/recipe/engine-check.js';
import { EmbeddedPolicy } from '../../src/recipe/policy.js';
import { fakeServer } from '../engines/fake-servers.js';
import { SGLANG_05, SGLANG_OLD } from '../engines/server-specs.js';

// A run on served engines is held to what they say about themselves before it starts (issue 40): their version,
// the temperatures they take, whether their logprobs can be the PPO ratio's denominator, whether seeds hold.

const rl = (over: Record<string, unknown> = {}) =>
  parseRecipe({ model: { threads: 1 }, stages: [{ type: 'rl', name: 'rl', steps: 1, ...over }] });
const quiet = { log: () => {} };

test('vLLM with raw logprobs: refused for a stage that samples at another temperature and uses them', async () => {
  const vl = await fakeServer('vllm');
  try {
    const engine = () => new VllmEngine(vl.url, quiet);
    const lines: string[] = [];
    const log = (l: string) => lines.push(l);
    await assert.rejects(
      checkEngines([engine()], rl({ temperature: 0.8 }), log),
      /stage rl: oldLogprobs 'engine' takes the PPO ratio's denominator from vllm:.*, but its logprobs are taken before temperature and top-p \(--logprobs-mode raw_logprobs\), and this stage samples at temperature 0\.8; restart it with --logprobs-mode processed_logprobs, or set stages\.rl\.oldLogprobs=recompute/,
    );
    // the same stage at temperature 1, or recomputing its old logprobs, or a server in processed mode: fine
    await checkEngines([engine()], rl({ temperature: 1 }), log);
    await checkEngines([engine()], rl({ temperature: 0.8, oldLogprobs: 'recompute' }), log);
    vl.logprobsMode = 'processed_logprobs';
    await checkEngines([engine()], rl({ temperature: 0.8 }), log);
    assert.deepEqual(lines, []);
    // without dev mode the mode cannot be read: vLLM's default, raw, is assumed, and refused the same way unless
    // the stage samples at temperature 1 or recomputes its old logprobs
    vl.devMode = false;
    await assert.rejects(
      checkEngines([engine()], rl({ temperature: 0.8 }), log),
      /stage rl: .*cannot report its --logprobs-mode .*this stage samples at temperature 0\.8; .*or set stages\.rl\.oldLogprobs=recompute/,
    );
    await assert.rejects(checkEngines([engine()], rl({ temperature: 1, topP: 0.9 }), log), /top-p 0\.9/);
    await checkEngines([engine()], rl({ temperature: 1 }), log);
    await checkEngines([engine()], rl({ temperature: 0.8, oldLogprobs: 'recompute' }), log);
    assert.deepEqual(lines, []);
    // a run refuses to start: nothing is spawned before the check
    vl.devMode = true;
    vl.logprobsMode = 'raw_logprobs';
    await assert.rejects(
      EmbeddedPolicy.create(rl({ temperature: 0.8 }), {
        engines: [engine()],
        syncDir: '/nonexistent',
        ...quiet,
      }),
      /--logprobs-mode processed_logprobs/,
    );
  } finally {
    await vl.close();
  }
  assert.equal(
    logprobsMismatch('raw_logits', 1, 1),
    'it returns logits (--logprobs-mode raw_logits), not logprobs',
  );
  assert.equal(logprobsMismatch('after temperature', 0.6, 0.9), null);
});

test('a temperature an engine refuses stops the run before it starts; SGLang takes it', async () => {
  const vl = await fakeServer('vllm');
  const sg = await fakeServer('sglang');
  try {
    await assert.rejects(
      checkEngines([new VllmEngine(vl.url, quiet)], rl({ temperature: 2.5 }), () => {}),
      /stage rl: temperature 2\.5 is above 2, which vllm:.* refuses/,
    );
    const recipe = parseRecipe({ stages: [{ type: 'sft', steps: 1 }], eval: { temperature: 3, samples: 2 } });
    await assert.rejects(
      checkEngines([new VllmEngine(vl.url, quiet)], recipe, () => {}),
      /eval: temperature 3/,
    );
    await checkEngines([new SGLangEngine(sg.url, quiet)], rl({ temperature: 2.5 }), () => {});
  } finally {
    await Promise.all([vl.close(), sg.close()]);
  }
});

test('SGLang: seeds it cannot honour are a warning; a build older than supported is an error naming it', async () => {
  const sg = await fakeServer('sglang', SGLANG_05);
  const old = await fakeServer('sglang', SGLANG_OLD);
  try {
    const lines: string[] = [];
    await checkEngines([new SGLangEngine(sg.url, quiet)], rl(), (l) => lines.push(l));
    assert.deepEqual(lines, [
      `warning: sglang:${sg.url} cannot honour seeds: rollouts and evals on it are not reproducible from the seed`,
    ]);
    await assert.rejects(
      checkEngines([new SGLangEngine(old.url, quiet)], rl(), () => {}),
      new RegExp(`engine sglang:${old.url}: sglang:${old.url}: sglang 0\\.4\\.8 is older than 0\\.5\\.3`),
    );
  } finally {
    await Promise.all([sg.close(), old.close()]);
  }
});

test('--dry-run --engines: version, dtype, logprobs mode, seeds, KV pool and the weight-sync plan', {
  timeout: 60_000,
}, async () => {
  const sg = await fakeServer('sglang');
  const vl = await fakeServer('vllm');
  vl.logprobsMode = 'processed_logprobs';
  sg.deterministic = true;
  try {
    const out: string[] = [];
    const recipe = parseRecipe({
      model: { threads: 1 },
      weightSync: { bucketMiB: 1 },
      stages: [{ type: 'rl', steps: 1 }],
      eval: { n: 2 },
    });
    await dryRun(recipe, {
      engines: [new SGLangEngine(sg.url, quiet), new VllmEngine(vl.url, quiet)],
      log: (l) => out.push(l),
    });
    const text = out.join('\n');
    assert.match(
      text,
      /engine sglang:\S+: version 0\.5\.12\.dev20260509\+g096ad02b0, dtype not reported, logprobs after temperature, seeds honoured, KV pool 123456 tokens \(blocks of 16\)/,
    );
    assert.match(
      text,
      /engine vllm:\S+: version 0\.25\.1\.dev169\+g2bd895762, dtype bfloat16, logprobs processed_logprobs, seeds honoured, temperature ≤ 2, KV pool 16000 tokens \(blocks of 16\)/,
    );
    // the tiny preset, cast to bfloat16, in calls of at most 1 MiB
    const m =
      /weight sync: nccl broadcast to 2 engine rank\(s\), disk if it fails: (\d+) tensors, ([\d.]+) MiB as bfloat16, in (\d+) update call\(s\) of at most 1 MiB \(largest ([\d.]+) MiB/.exec(
        text,
      );
    assert.ok(m, text);
    assert.ok(Number(m[3]) >= Math.ceil(Number(m[2])), `${m[3]} calls for ${m[2]} MiB`);
    assert.ok(Number(m[4]) <= 1);
    assert.equal(out.at(-1), 'dry run ok: nothing was trained');
  } finally {
    await Promise.all([sg.close(), vl.close()]);
  }
});
