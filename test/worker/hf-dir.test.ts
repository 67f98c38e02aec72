import assert from 'node:assert/strict';
import {
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  truncateSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { Tokenizer } from '../../src/tokenizer/index.js';
import { initModelDir, type ModelConfig, PolicyWorker } from '../../src/worker/index.js';
import { assertHfShards, safetensorsHeader, TEST_CONFIG } from './helpers.js';

const root = mkdtempSync(join(tmpdir(), 'rstar2-hfdir-'));
let w: PolicyWorker;
const probe = [[1, 2, 3, 4, 5, 6]];

before(async () => {
  w = await PolicyWorker.start({ threads: 1 });
});
after(async () => {
  await w?.close();
  rmSync(root, { recursive: true, force: true });
});

const weightFiles = (dir: string) =>
  readdirSync(dir)
    .filter((f) => f.startsWith('model'))
    .sort();

test('sharded saves: an exact shard count, HF max_shard_size packing, and a switch of layout leaves no stale weights', {
  timeout: 60_000,
}, async () => {
  await w.init(TEST_CONFIG, 4);
  const ref = (await w.logprobs(probe))[0].logprobs;
  const dir = join(root, 'layouts');
  assert.deepEqual(await w.save(dir), ['model.safetensors']);

  // 27 tensors cut into 5 files of about equal bytes; the stale model.safetensors goes (it would be read first)
  await w.save(dir, { shards: 5 });
  const five = assertHfShards(dir, 5);
  assert.equal(five.flat().length, 27);
  await w.load(dir);
  assert.deepEqual((await w.logprobs(probe))[0].logprobs, ref);

  // HF's rule: a new file when the next tensor would pass the limit; the 8 KB embedding and head get files of their own
  await w.save(dir, { maxShardBytes: 6000 });
  const files = weightFiles(dir).filter((f) => f.endsWith('.safetensors'));
  assert.ok(
    files.length > 2 &&
      files.every((f) => f.endsWith(`-of-${String(files.length).padStart(5, '0')}.safetensors`)),
  );
  const groups = assertHfShards(dir, files.length);
  for (const [i, f] of files.entries()) {
    const header = safetensorsHeader(join(dir, f));
    const bytes = Object.values(header).reduce((n, s) => n + s.data_offsets[1] - s.data_offsets[0], 0);
    assert.ok(bytes <= 6000 || groups[i].length === 1, `${f}: ${bytes} bytes in ${groups[i].length} tensors`);
  }
  await w.load(dir);
  assert.deepEqual((await w.logprobs(probe))[0].logprobs, ref);

  // a limit no tensor set reaches, and shards: 1, both give the single-file layout and drop the index
  await w.save(dir, { maxShardBytes: 1e9 });
  assert.deepEqual(weightFiles(dir), ['model.safetensors']);
  await w.save(dir, { shards: 3 });
  await w.save(dir, { shards: 1 });
  assert.deepEqual(weightFiles(dir), ['model.safetensors']);

  await assert.rejects(w.save(dir, { shards: 0 }), /shards must be a positive integer/);
  await assert.rejects(w.save(dir, { maxShardBytes: 1.5 }), /maxShardBytes must be a positive integer/);
});

test('broken model directories are reported with the file and the problem', { timeout: 60_000 }, async () => {
  const qwen3: ModelConfig = { ...TEST_CONFIG, model_type: 'qwen3', head_dim: 8, tie_word_embeddings: true };
  await w.init(qwen3, 1);
  const good = join(root, 'good');
  await w.save(good, { shards: 2 });
  const variant = (name: string) => {
    const d = join(root, name);
    mkdirSync(d);
    for (const f of readdirSync(good)) copyFileSync(join(good, f), join(d, f));
    return d;
  };

  const noConfig = variant('no-config');
  rmSync(join(noConfig, 'config.json'));
  await w.load(good); // a failed load must leave the loaded model in place
  await assert.rejects(w.load(noConfig), new RegExp(`${noConfig}: no config.json`));
  assert.equal((await w.logprobs(probe))[0].logprobs.length, 6);

  const noWeights = variant('no-weights');
  for (const f of readdirSync(noWeights)) if (f.startsWith('model')) rmSync(join(noWeights, f));
  await assert.rejects(
    w.load(noWeights),
    /no-weights: no weights: neither model.safetensors nor model.safetensors.index.json/,
  );
  writeFileSync(join(noWeights, 'pytorch_model.bin'), '');
  await assert.rejects(w.load(noWeights), /it has pytorch_model.bin weights; only safetensors are read/);

  const lostShard = variant('lost-shard');
  rmSync(join(lostShard, 'model-00002-of-00002.safetensors'));
  await assert.rejects(
    w.load(lostShard),
    /lost-shard\/model.safetensors.index.json: weight_map names shard model-00002-of-00002.safetensors, which is missing/,
  );

  const wrongMap = variant('wrong-map');
  const indexPath = join(wrongMap, 'model.safetensors.index.json');
  const index = JSON.parse(readFileSync(indexPath, 'utf8'));
  index.weight_map['model.norm.weight'] = 'model-00001-of-00002.safetensors'; // it is in the second
  writeFileSync(indexPath, JSON.stringify(index));
  await assert.rejects(
    w.load(wrongMap),
    /weight_map puts tensor model.norm.weight in model-00001-of-00002.safetensors, which does not hold it/,
  );

  const truncated = variant('truncated');
  const first = join(truncated, 'model-00001-of-00002.safetensors');
  truncateSync(first, 8 + Number(readFileSync(first).readBigUInt64LE(0)) + 100); // header intact, data cut short
  await assert.rejects(
    w.load(truncated),
    /model-00001-of-00002.safetensors: tensor \S+ ends at byte \d+ .*truncated file/,
  );

  // issue 56 item 6: a directory that is not there, a header that lies about a tensor, a config that is no JSON
  const gone = join(root, 'never-saved');
  await assert.rejects(w.load(gone), new RegExp(`${gone}: no such checkpoint directory`));
  const damaged = variant('damaged');
  const second = join(damaged, 'model-00002-of-00002.safetensors');
  const bytes = readFileSync(second);
  const n = Number(bytes.readBigUInt64LE(0));
  const header = JSON.parse(bytes.subarray(8, 8 + n).toString('utf8'));
  const name = Object.keys(header).find((k) => k !== '__metadata__') as string;
  assert.equal(header[name].dtype, 'F32');
  header[name].dtype = 'F16'; // its offsets hold twice the bytes that makes
  const text = Buffer.from(JSON.stringify(header).padEnd(n, ' '));
  assert.equal(text.length, n, 'the damaged header fits where the old one was');
  writeFileSync(second, Buffer.concat([bytes.subarray(0, 8), text, bytes.subarray(8 + n)]));
  await assert.rejects(
    w.load(damaged),
    new RegExp(
      `${second}: tensor ${name} holds \\d+ bytes, but its shape \\[.*\\] of \\w+ needs \\d+ \\(damaged header\\)`,
    ),
  );
  const badJson = variant('bad-json');
  writeFileSync(join(badJson, 'config.json'), '{"model_type": "qwen3",');
  await assert.rejects(w.load(badJson), new RegExp(`${badJson}/config.json: not valid JSON`));
  writeFileSync(join(badJson, 'config.json'), '[1, 2]');
  await assert.rejects(
    w.load(badJson),
    /config.json: not a model config \(a JSON object expected, got list\)/,
  );
  const cutOptimizer = join(root, 'cut-optimizer');
  await w.save(cutOptimizer, { optimizer: true });
  const opt = join(cutOptimizer, 'optimizer.pt');
  truncateSync(opt, Math.floor(statSync(opt).size / 2));
  await w.load(good);
  await assert.rejects(w.load(cutOptimizer), new RegExp(`${opt}: damaged optimizer state, cannot be read`));
  assert.equal((await w.logprobs(probe))[0].logprobs.length, 6, 'the model loaded before is still there');

  const llama = variant('llama');
  writeFileSync(join(llama, 'config.json'), JSON.stringify({ ...qwen3, model_type: 'llama' }));
  await assert.rejects(w.load(llama), /llama\/config.json: model_type 'llama' is not supported/);

  // the tokenizer side: Tokenizer.load and model init name the missing tokenizer.json
  assert.throws(() => Tokenizer.load(good), new RegExp(`tokenizer.json not found: ${good}/tokenizer.json`));
  await assert.rejects(
    initModelDir({ preset: 'tiny-qwen3', tokenizer: good, out: join(root, 'x') }),
    /tokenizer.json not found/,
  );
  await assert.rejects(
    initModelDir({ preset: 'tiny-qwen3', tokenizer: join(good, 'config.json'), out: join(root, 'x') }),
    /config.json: not a directory/,
  );
  assert.ok(!existsSync(join(root, 'x')), 'nothing is created when the tokenizer is unusable');
});
