import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { LlamaCppEngine } from '../../src/engines/llamacpp.js';
import { SGLangEngine } from '../../src/engines/sglang.js';
import { VllmEngine } from '../../src/engines/vllm.js';
import { parseRecipe } from '../../src/recipe/config.js';
import { EmbeddedPolicy } from '../../src/recipe/policy.js';
import {
  BroadcastSync,
  broadcastPlan,
  isPrivateAddress,
  modelWeights,
  resolveSyncDtype,
  syncPlan,
  unreachableReason,
} from '../../src/recipe/weight-sync.js';
import { PolicyWorker } from '../../src/worker/index.js';
import { SpawnRunner } from '../sandbox/helpers.js';
import { safetensorsHeader, TEST_CONFIG } from '../worker/helpers.js';
import { fakeServer } from './fake-servers.js';

// Broadcast weight sync on the CPU: gloo stands in for NCCL, and each fake engine has a real python rank that
// joins the group the way SGLang's engines do and writes what it received to a file. The cast is checked in
// float16: this host's torch (1.13) has no bfloat16 in gloo; NCCL carries both.

/** Every tensor of a safetensors file as its raw bytes. */
function tensors(path: string): Map<string, Buffer> {
  const buf = readFileSync(path);
  const start = 8 + Number(buf.readBigUInt64LE(0));
  const out = new Map<string, Buffer>();
  for (const [name, h] of Object.entries(safetensorsHeader(path)))
    out.set(name, buf.subarray(start + h.data_offsets[0], start + h.data_offsets[1]));
  return out;
}

function assertSameBytes(got: Map<string, Buffer>, want: Map<string, Buffer>): void {
  assert.deepEqual([...got.keys()].sort(), [...want.keys()].sort());
  for (const [name, b] of want) assert.ok(b.equals(got.get(name) as Buffer), `${name} differs`);
}

const batch = {
  loss: 'sft' as const,
  sequences: [{ ids: [1, 2, 3, 4, 5, 6], mask: [0, 1, 1, 1, 1, 1] }],
};

test('broadcast sync: SGLang and vLLM engines receive bit-identical weights after an update', {
  timeout: 120_000,
}, async () => {
  const worker = await PolicyWorker.start({ threads: 1 });
  const sg = await fakeServer('sglang');
  const vl = await fakeServer('vllm');
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-wsync-'));
  const lines: string[] = [];
  try {
    await worker.init(TEST_CONFIG, 3);
    const sync = new BroadcastSync(worker, [new SGLangEngine(sg.url), new VllmEngine(vl.url)], {
      backend: 'gloo',
      timeoutS: 60,
      log: (l) => lines.push(l),
    });
    assert.equal(await sync.push('v1'), true, lines.join('\n'));
    await worker.trainStep(batch, { lr: 1e-2 });
    assert.equal(await sync.push('v2'), true, lines.join('\n'));
    await worker.save(dir);

    // SGLang's published request fields (InitWeightsUpdateGroupReqInput, UpdateWeightsFromDistributedReqInput)
    const init = sg.requests.find((q) => q.path === '/init_weights_update_group')?.body ?? {};
    assert.deepEqual(Object.keys(init).sort(), [
      'backend',
      'group_name',
      'master_address',
      'master_port',
      'rank_offset',
      'world_size',
    ]);
    assert.equal(init.master_address, '127.0.0.1');
    assert.equal(init.rank_offset, 1);
    assert.equal(init.world_size, 3); // the trainer and one rank per engine
    assert.equal(init.backend, 'gloo');
    const updates = sg.requests.filter((q) => q.path === '/update_weights_from_distributed');
    assert.equal(updates.length, 2);
    assert.deepEqual(Object.keys(updates[1].body).sort(), [
      'dtypes',
      'flush_cache',
      'group_name',
      'names',
      'shapes',
      'weight_version',
    ]);
    assert.equal(updates[1].body.weight_version, 'v2');
    assert.equal(updates[1].body.group_name, init.group_name);
    const saved = tensors(join(dir, 'model.safetensors'));
    const names = updates[1].body.names as string[];
    assert.deepEqual([...names].sort(), [...saved.keys()].sort()); // HF names, the checkpoint's
    assert.ok((updates[1].body.dtypes as string[]).every((d) => d === 'float32'));

    // vLLM: the same group, next rank, through the worker extension
    const rpcs = vl.requests.filter((q) => q.path === '/collective_rpc').map((q) => q.body);
    const vInit = JSON.parse(
      (rpcs.find((b) => b.method === 'init_weight_update_group')?.args as string[] | undefined)?.[0] ?? '{}',
    );
    assert.equal(vInit.rank_offset, 2);
    assert.equal(vInit.group_name, init.group_name);
    assert.equal(vl.requests.filter((q) => q.path === '/reset_prefix_cache').length, 2);

    // what each engine got after the update is exactly the trainer's weights, and not the first push's
    assert.equal(sg.received.length, 2);
    assertSameBytes(tensors(sg.received[1]), saved);
    assertSameBytes(tensors(vl.received[1]), saved);
    const first = tensors(sg.received[0]);
    assert.ok(
      !(first.get('model.embed_tokens.weight') as Buffer).equals(saved.get('model.embed_tokens.weight')!),
    );
    assert.equal(lines.filter((l) => l.startsWith('weight sync: joined')).length, 1); // joined once
  } finally {
    await Promise.all([worker.close(), sg.close(), vl.close()]);
  }
});

test('with 2 DDP ranks, rank 0 joins the weight-update group beside its own group', {
  timeout: 120_000,
}, async () => {
  const worker = await PolicyWorker.start({ threads: 1, ranks: 2 });
  const sg = await fakeServer('sglang');
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-wsync-'));
  try {
    await worker.init(TEST_CONFIG, 5);
    await worker.trainStep(batch, { lr: 1e-2 }); // the ranks' own group is in use first
    const sync = new BroadcastSync(worker, [new SGLangEngine(sg.url)], { backend: 'gloo', log: () => {} });
    assert.equal(await sync.push('v1'), true);
    await worker.save(dir);
    assertSameBytes(tensors(sg.received[0]), tensors(join(dir, 'model.safetensors')));
    await worker.trainStep(batch, { lr: 1e-2 }); // and still works after
  } finally {
    await Promise.all([worker.close(), sg.close()]);
  }
});

test('a failed group init falls back to disk sync with a warning, and the engines load the weights from disk', {
  timeout: 120_000,
}, async () => {
  const sg = await fakeServer('sglang');
  sg.failInit = true;
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-wsync-'));
  const syncDir = join(dir, 'engine-weights');
  const lines: string[] = [];
  const recipe = parseRecipe({ model: { threads: 1 }, stages: [{ type: 'sft', steps: 1 }] });
  const policy = await EmbeddedPolicy.create(recipe, {
    engines: [new SGLangEngine(sg.url)],
    syncDir,
    runner: new SpawnRunner(),
    log: (l) => lines.push(l),
    weightSync: { mode: 'nccl', backend: 'gloo', timeoutS: 2 },
  });
  try {
    const req = { problems: [], n: 1, maxResponseTokens: 16, maxTurns: 1, temperature: 1, seed: 1 };
    await policy.rollout(req);
    assert.ok(
      lines.some((l) => /^warning: weight sync: .*init failed \(test\).*through disk/.test(l)),
      lines.join('\n'),
    );
    const disk = sg.requests.filter((q) => q.path === '/update_weights_from_disk');
    assert.deepEqual(disk[0]?.body, { model_path: syncDir, weight_version: 'v1' });
    // the worker is fine afterwards, and later syncs go straight to disk without trying the group again
    await policy.sftStep(
      [
        {
          messages: [
            { role: 'user', content: '1+1' },
            { role: 'assistant', content: '2' },
          ],
        },
      ],
      {
        lr: 1e-3,
      },
    );
    await policy.rollout(req);
    assert.equal(sg.requests.filter((q) => q.path === '/update_weights_from_disk').length, 2);
    assert.equal(sg.requests.filter((q) => q.path === '/init_weights_update_group').length, 1);
  } finally {
    await policy.close();
    await sg.close();
  }
});

test('auto uses broadcast only for engines on private addresses', async () => {
  for (const a of ['127.0.0.1', '10.1.2.3', '172.20.0.5', '192.168.1.9', '100.64.0.1', '::1', 'fd00::1'])
    assert.ok(isPrivateAddress(a), a);
  for (const a of ['8.8.8.8', '172.32.0.1', '2001:db8::1', 'not-an-ip']) assert.ok(!isPrivateAddress(a), a);
  assert.equal(await unreachableReason(['http://127.0.0.1:30000', 'http://[::1]:8000']), null);
  assert.match((await unreachableReason(['http://8.8.8.8:30000'])) ?? '', /not a private address/);
  assert.match((await unreachableReason(['https://10.0.0.1:30000'])) ?? '', /not plain http/);
  // refused quietly (no warning) when auto's rule fails; disk mode never asks the engines
  const lines: string[] = [];
  const worker = { restarts: 0 } as unknown as PolicyWorker;
  const far = new BroadcastSync(worker, [new SGLangEngine('http://8.8.8.8:1')], {
    log: (l) => lines.push(l),
  });
  assert.equal(await far.push(), false);
  assert.match(lines[0], /^weight sync: .*not a private address; syncing through disk/);
  assert.equal(
    await new BroadcastSync(worker, [new SGLangEngine('http://127.0.0.1:9')], { mode: 'disk' }).push(),
    false,
  );
  // what --dry-run reports: each engine's ranks, or why not
  const sg = await fakeServer('sglang');
  try {
    assert.deepEqual(await broadcastPlan([new SGLangEngine(sg.url)], 'auto'), { ranks: [1] });
    assert.deepEqual(await broadcastPlan([new LlamaCppEngine(sg.url)], 'nccl'), {
      why: `llamacpp:${sg.url} cannot join a weight-update group`,
    });
    assert.deepEqual(await broadcastPlan([new SGLangEngine(sg.url)], 'disk'), { why: '--weight-sync disk' });
  } finally {
    await sg.close();
  }
});

/** Asserts `f16` holds each float of `f32` cast to float16: within half a float16 step of it. */
function assertHalfOf(f16: Buffer, f32: Buffer, name: string): void {
  assert.equal(f16.length, f32.length / 2, name);
  for (let i = 0; i < f16.length / 2; i++) {
    const h = f16.readUInt16LE(2 * i);
    const exp = (h >> 10) & 0x1f;
    const frac = h & 0x3ff;
    const mag = exp === 0 ? frac * 2 ** -24 : (1 + frac / 1024) * 2 ** (exp - 15);
    const got = h & 0x8000 ? -mag : mag;
    const want = f32.readFloatLE(4 * i);
    const step = Math.max(2 ** -24, 2 ** (Math.floor(Math.log2(Math.abs(want) || 2 ** -24)) - 10));
    assert.ok(Math.abs(got - want) <= step / 2, `${name}[${i}]: ${got} for ${want}`);
  }
}

test('an update larger than SGLang can hold beside its KV pool arrives in buckets, cast to the engine dtype', {
  timeout: 180_000,
}, async () => {
  const worker = await PolicyWorker.start({ threads: 1, env: { RSTAR2_WEIGHT_SYNC_DTYPE: 'float16' } });
  const sg = await fakeServer('sglang');
  const vl = await fakeServer('vllm');
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-wsync-'));
  const lines: string[] = [];
  try {
    await worker.init(TEST_CONFIG, 3);
    const whole = syncPlan(modelWeights(TEST_CONFIG, 'float16'), 2 ** 30);
    // SGLang holds every tensor of a call before loading any: the whole model does not fit, a third of it does
    sg.freeBytes = Math.ceil(whole.bytes / 3);
    vl.dtype = 'float16'; // SGLang's --dtype auto is not reported: only vLLM's is checked
    const sync = new BroadcastSync(worker, [new SGLangEngine(sg.url), new VllmEngine(vl.url)], {
      backend: 'gloo',
      timeoutS: 30,
      dtype: 'float16',
      bucketBytes: sg.freeBytes,
      log: (l) => lines.push(l),
    });
    assert.equal(await sync.push('v1'), true, lines.join('\n'));
    await worker.save(dir);
    const updates = sg.requests
      .filter((q) => q.path === '/update_weights_from_distributed')
      .map((q) => q.body);
    assert.ok(updates.length >= 3, `${updates.length} calls`);
    assert.equal(updates.length, sg.received.length); // every call was held and loaded
    for (const u of updates) {
      const bytes = (u.shapes as number[][]).reduce((a, s) => a + s.reduce((x, y) => x * y, 2), 0);
      assert.ok(bytes <= sg.freeBytes || (u.names as string[]).length === 1, `${bytes} bytes in one call`);
      assert.ok((u.dtypes as string[]).every((d) => d === 'float16'));
    }
    // the version and the cache flush go with the last bucket only
    assert.deepEqual(
      updates.map((u) => [u.flush_cache, u.weight_version]),
      updates.map((_, i) => (i === updates.length - 1 ? [true, 'v1'] : [false, undefined])),
    );
    const saved = tensors(join(dir, 'model.safetensors'));
    for (const files of [sg.received, vl.received]) {
      const got = new Map(files.flatMap((f) => [...tensors(f)]));
      assert.deepEqual([...got.keys()].sort(), [...saved.keys()].sort());
      for (const [n, b] of saved) assertHalfOf(got.get(n) as Buffer, b, n);
      assert.ok(files.every((f) => Object.values(safetensorsHeader(f)).every((h) => h.dtype === 'F16')));
    }
    // vLLM: one call per bucket too, its prefix cache reset once, after the last
    assert.equal(vl.received.length, updates.length);
    assert.equal(vl.requests.filter((q) => q.path === '/reset_prefix_cache').length, 1);
    // what the plan said is what was sent
    assert.match(lines.at(-1) ?? '', new RegExp(`\\(float16\\), .* in ${updates.length} buckets`));
    const vInit = vl.requests
      .filter((q) => q.path === '/collective_rpc' && q.body.method === 'init_weight_update_group')
      .map((q) => JSON.parse((q.body.args as string[])[0]))[0];
    assert.equal(vInit.timeout_s, 30); // the extension's group waits as long as the trainer's
  } finally {
    await Promise.all([worker.close(), sg.close(), vl.close()]);
  }
});

test('a preset model’s weights, as the plan counts them, are the ones the worker saves', async () => {
  const worker = await PolicyWorker.start({ threads: 1 });
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-wsync-'));
  try {
    await worker.init(TEST_CONFIG, 1);
    await worker.save(dir);
    const header = safetensorsHeader(join(dir, 'model.safetensors'));
    const preset = modelWeights(TEST_CONFIG, 'float32');
    assert.deepEqual([...preset.names].sort(), Object.keys(header).sort());
    for (const [i, n] of preset.names.entries()) assert.deepEqual(preset.shapes[i], header[n].shape, n);
    assert.deepEqual(modelWeights(TEST_CONFIG, 'float32', dir), {
      ...preset,
      names: Object.keys(header),
      shapes: Object.values(header).map((h) => h.shape),
      dtypes: preset.dtypes,
    });
    // SGLang and vLLM serve a float32 checkpoint under --dtype auto in float16, not bfloat16
    assert.equal(resolveSyncDtype('auto', { torch_dtype: 'float32' }), 'float16');
    assert.equal(resolveSyncDtype('auto', { torch_dtype: 'bfloat16' }), 'bfloat16');
    // what the engines that say report serving wins; engines that disagree leave the rule above
    assert.equal(resolveSyncDtype('auto', { torch_dtype: 'float32' }, ['bfloat16', undefined]), 'bfloat16');
    assert.equal(resolveSyncDtype('auto', { torch_dtype: 'float32' }, ['bfloat16', 'float16']), 'float16');
    assert.equal(resolveSyncDtype('auto', { torch_dtype: 'float32' }, ['auto']), 'float16');
    assert.equal(resolveSyncDtype('auto', { torch_dtype: 'float16' }), 'float16');
    assert.equal(resolveSyncDtype('float32', { torch_dtype: 'bfloat16' }), 'float32');
  } finally {
    await worker.close();
  }
});

test('an engine that serves another dtype than the trainer would send is synced through disk', async () => {
  const vl = await fakeServer('vllm');
  try {
    vl.dtype = 'float16';
    const plan = await broadcastPlan([new VllmEngine(vl.url, { log: () => {} })], 'nccl', 'bfloat16');
    assert.deepEqual(plan, {
      why: `vllm:${vl.url} serves float16 and the trainer would send bfloat16 (weightSync.dtype)`,
    });
    vl.dtype = 'bfloat16';
    assert.deepEqual(await broadcastPlan([new VllmEngine(vl.url, { log: () => {} })], 'nccl', 'bfloat16'), {
      ranks: [1],
    });
  } finally {
    await vl.close();
  }
});

test('an update SGLang cannot hold fails as on the server: out of memory, then disk', {
  timeout: 120_000,
}, async () => {
  const worker = await PolicyWorker.start({ threads: 1 });
  const sg = await fakeServer('sglang');
  const lines: string[] = [];
  try {
    await worker.init(TEST_CONFIG, 3);
    const whole = syncPlan(modelWeights(TEST_CONFIG, 'float32'), 2 ** 30);
    sg.freeBytes = Math.ceil(whole.bytes / 3);
    const sync = new BroadcastSync(worker, [new SGLangEngine(sg.url)], {
      backend: 'gloo',
      timeoutS: 30,
      bucketTimeoutS: 5, // rank 0 is left sending the tensor the engine never received until this runs out
      bucketBytes: whole.bytes, // one call with everything, as before buckets
      log: (l) => lines.push(l),
    });
    assert.equal(await sync.push('v1'), false);
    assert.match(
      lines.join('\n'),
      /warning: weight sync: broadcast failed: .*CUDA out of memory.*through disk/,
    );
    assert.equal(sg.received.length, 0);
    // the worker's send times out and it serves again
    await worker.trainStep(batch, { lr: 1e-2 });
  } finally {
    await Promise.all([worker.close(), sg.close()]);
  }
});
