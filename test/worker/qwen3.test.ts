import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { promptIds, Tokenizer } from '../../src/tokenizer/index.js';
import { PolicyWorker } from '../../src/worker/index.js';
import { assertHfShards, maxAbsDiff, QWEN3_TOKENIZER_DIR, sampling } from './helpers.js';

const root = mkdtempSync(join(tmpdir(), 'rstar2-qwen3-'));
after(() => rmSync(root, { recursive: true, force: true }));

// The stand-in for a real Hugging Face checkpoint: Qwen3's own tokenizer files around a random tiny Qwen3.
// With the 151,669-id vocabulary the embedding is 97 % of the parameters and every logits row is 600 KB:
// this test takes ~15 s alone on the 2-core machine (CLI init ~5 s, two tokenizer loads ~1 s each, the
// train step ~2 s), 35-40 s beside the other worker tests.
test('tiny Qwen3 with the real Qwen3 tokenizer goes through init (2 shards), load, generate, logprobs, a GRPO step and a sharded save', {
  timeout: 180_000,
}, async () => {
  const init = join(root, 'init');
  const cli = spawnSync(
    process.execPath,
    [
      'bin/rstar2.js',
      'model',
      'init',
      '--config',
      'tiny-qwen3',
      '--tokenizer',
      QWEN3_TOKENIZER_DIR,
      '--shards',
      '2',
      '--seed',
      '3',
      '--out',
      init,
    ],
    { encoding: 'utf8' },
  );
  assert.equal(cli.status, 0, cli.stderr);
  assert.match(cli.stdout, /tiny-qwen3 model, 9\.81M parameters, vocab 151669, 2 shards/);

  const config = JSON.parse(readFileSync(join(init, 'config.json'), 'utf8'));
  assert.equal(config.model_type, 'qwen3');
  assert.deepEqual(config.architectures, ['Qwen3ForCausalLM']);
  assert.equal(config.vocab_size, 151669); // 151,643 BPE entries + 26 added tokens
  assert.equal(config.head_dim, 16);
  assert.equal(config.tie_word_embeddings, true);
  // as Qwen3-0.6B's config.json: bos <|endoftext|> (tokenizer_config has none), eos <|im_end|>
  assert.deepEqual([config.bos_token_id, config.eos_token_id, config.pad_token_id], [151643, 151645, 151643]);
  const gen = JSON.parse(readFileSync(join(init, 'generation_config.json'), 'utf8'));
  assert.deepEqual(gen.eos_token_id, [151645, 151643]);
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) {
    assert.ok(readFileSync(join(init, f)).equals(readFileSync(join(QWEN3_TOKENIZER_DIR, f))), `${f} copied`);
  }
  const initShards = assertHfShards(init, 2);
  // tied head: no lm_head tensor; the embedding alone outweighs the rest, so it fills the first shard
  assert.deepEqual(initShards[0], ['model.embed_tokens.weight']);
  assert.ok(!initShards[1].includes('lm_head.weight'));
  assert.ok(initShards[1].includes('model.layers.1.self_attn.k_norm.weight'));

  const tok = Tokenizer.load(init);
  const prompt = promptIds(tok, [{ role: 'user', content: 'What is 2+3?' }]);
  const w = await PolicyWorker.start({ threads: 2 });
  try {
    const info = await w.load(init);
    assert.equal(info.params, 9_805_504);
    const [g] = await w.generate([prompt], sampling({ maxNewTokens: 6, seed: 1, stopTokenIds: tok.stopIds }));
    assert.ok(g.outputIds.length >= 1 && g.outputIds.length <= 6);
    assert.ok(g.outputIds.every((id) => id >= 0 && id < 151669));
    const seq = [...prompt, ...g.outputIds];
    const [lp] = await w.logprobs([seq]);
    assert.ok(maxAbsDiff(lp.logprobs.slice(prompt.length), g.logprobs) <= 1e-4);

    const mask = seq.map((_, i) => (i >= prompt.length ? 1 : 0));
    const stats = await w.trainStep(
      { loss: 'grpo', sequences: [{ ids: seq, mask, advantage: 1, oldLogprobs: lp.logprobs }] },
      { lr: 1e-2 },
    );
    assert.equal(stats.trainedTokens, g.outputIds.length);
    assert.ok(Number.isFinite(stats.loss) && stats.gradNorm > 0);
    const trained = (await w.logprobs([seq]))[0].logprobs;
    const sum = (xs: number[]) => xs.slice(prompt.length).reduce((a, b) => a + b, 0);
    assert.ok(sum(trained) > sum(lp.logprobs), 'a positive advantage raises the sampled tokens');

    const saved = join(root, 'saved');
    assert.deepEqual(await w.save(saved, { shards: 2 }), [
      'model-00001-of-00002.safetensors',
      'model-00002-of-00002.safetensors',
      'model.safetensors.index.json',
    ]);
    assert.deepEqual(assertHfShards(saved, 2), initShards);
    assert.ok(readFileSync(join(saved, 'tokenizer.json')).equals(readFileSync(join(init, 'tokenizer.json'))));

    await w.load(saved);
    assert.deepEqual((await w.logprobs([seq]))[0].logprobs, trained);
    const again = join(root, 'again');
    await w.save(again, { shards: 2 });
    for (const f of ['model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors']) {
      assert.ok(
        readFileSync(join(again, f)).equals(readFileSync(join(saved, f))),
        `${f} round-trips bit for bit`,
      );
      assert.ok(!readFileSync(join(saved, f)).equals(readFileSync(join(init, f))), `${f} was trained`);
    }
  } finally {
    await w.close();
  }
});
