import assert from 'node:assert/strict';
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { type ModelConfig, PolicyWorker } from '../../src/worker/index.js';
import { maxAbsDiff } from './helpers.js';

interface TensorSpec {
  dtype: string;
  shape: number[];
  data_offsets: [number, number];
}

function readHeader(path: string): { header: Record<string, TensorSpec>; data: Buffer } {
  const buf = readFileSync(path);
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString('utf8'));
  delete header.__metadata__;
  return { header, data: buf.subarray(8 + n) };
}

// Re-encode an F32 safetensors file as BF16 (truncating the low 16 bits), as real Qwen checkpoints ship.
function toBf16(src: string, dst: string): void {
  const { header, data } = readHeader(src);
  const out: Record<string, TensorSpec> = {};
  const blobs: Buffer[] = [];
  let off = 0;
  for (const [name, spec] of Object.entries(header)) {
    const [b, e] = spec.data_offsets;
    const f32 = data.subarray(b, e);
    const bf = Buffer.alloc(f32.length / 2);
    for (let i = 0; i < f32.length / 4; i++) bf.writeUInt16LE(f32.readUInt32LE(i * 4) >>> 16, i * 2);
    out[name] = { dtype: 'BF16', shape: spec.shape, data_offsets: [off, off + bf.length] };
    blobs.push(bf);
    off += bf.length;
  }
  const head = Buffer.from(JSON.stringify(out), 'utf8');
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(head.length));
  writeFileSync(dst, Buffer.concat([len, head, ...blobs]));
}

const qwen3: ModelConfig = {
  model_type: 'qwen3',
  vocab_size: 50,
  hidden_size: 32,
  intermediate_size: 48,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 1,
  head_dim: 16, // ≠ hidden/heads, as in real Qwen3 configs
  tie_word_embeddings: true,
};

test('checkpoints use Hugging Face Qwen parameter names; Qwen3 qk-norm and BF16 weights load', {
  timeout: 120_000,
}, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-ckpt-'));
  const w = await PolicyWorker.start({ threads: 1 });
  try {
    await w.init(qwen3, 2);
    const probe = [[1, 2, 3, 4, 5, 6, 7, 8]];
    const ref = (await w.logprobs(probe))[0].logprobs;
    await w.save(join(dir, 'f32'));
    const { header } = readHeader(join(dir, 'f32', 'model.safetensors'));
    const names = Object.keys(header);
    for (const n of [
      'model.embed_tokens.weight',
      'model.norm.weight',
      'model.layers.1.self_attn.q_proj.weight',
      'model.layers.1.self_attn.q_norm.weight',
      'model.layers.1.self_attn.k_norm.weight',
      'model.layers.1.mlp.gate_proj.weight',
      'model.layers.1.input_layernorm.weight',
      'model.layers.1.post_attention_layernorm.weight',
    ]) {
      assert.ok(names.includes(n), `missing ${n}`);
    }
    assert.ok(!names.includes('lm_head.weight'), 'tied head is not stored (as in HF)');
    assert.ok(!names.some((n) => n.endsWith('q_proj.bias')), 'qwen3 has no attention bias');
    assert.deepEqual(header['model.layers.0.self_attn.q_proj.weight'].shape, [64, 32]);
    assert.deepEqual(header['model.layers.0.self_attn.k_proj.weight'].shape, [16, 32]);

    mkdirSync(join(dir, 'bf16'));
    copyFileSync(join(dir, 'f32', 'config.json'), join(dir, 'bf16', 'config.json'));
    toBf16(join(dir, 'f32', 'model.safetensors'), join(dir, 'bf16', 'model.safetensors'));
    await w.load(join(dir, 'bf16'));
    const d = maxAbsDiff((await w.logprobs(probe))[0].logprobs, ref);
    assert.ok(d > 0 && d < 0.05, `bf16 weights should be close but not identical (diff ${d})`);

    // Qwen2 keeps q/k/v biases
    await w.init({ ...qwen3, model_type: 'qwen2', head_dim: undefined, num_key_value_heads: 2 }, 2);
    await w.save(join(dir, 'q2'));
    const q2 = Object.keys(readHeader(join(dir, 'q2', 'model.safetensors')).header);
    assert.ok(q2.includes('model.layers.0.self_attn.q_proj.bias'));
    assert.ok(!q2.some((n) => n.includes('q_norm')));

    await assert.rejects(w.load(join(dir, 'nope')), /no such checkpoint directory/);
    writeFileSync(join(dir, 'q2', 'config.json'), JSON.stringify({ ...qwen3, model_type: 'llama' }));
    await assert.rejects(w.load(join(dir, 'q2')), /model_type 'llama' is not supported/);
  } finally {
    await w.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
