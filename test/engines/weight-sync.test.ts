import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { LlamaCppEngine } from '../../src/engines/llamacpp.js';
import { SGLangEngine } from '../../src/engines/sglang.js';
import { VllmEngine } from '../../src/engines/vllm.js';
import { EmbeddedBackend } from '../../src/recipe/backend.js';
import { parseRecipe } from '../../src/recipe/config.js';
import {
  BroadcastSync,
  broadcastPlan,
  isPrivateAddress,
  unreachableReason,
} from '../../src/recipe/weight-sync.js';
import { PolicyWorker } from '../../src/worker/index.js';
import { SpawnRunner } from '../sandbox/helpers.js';
import { safetensorsHeader, TEST_CONFIG } from '../worker/helpers.js';
import { fakeServer } from './fake-servers.js';

// Broadcast weight sync on the CPU: gloo stands in for NCCL, and each fake engine has a real python rank that
// joins the group the way SGLang's engines do and writes what it received to a file.

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
  const backend = await EmbeddedBackend.create(recipe, {
    engines: [new SGLangEngine(sg.url)],
    syncDir,
    runner: new SpawnRunner(),
    log: (l) => lines.push(l),
    weightSync: { mode: 'nccl', backend: 'gloo', timeoutS: 2 },
  });
  try {
    const req = { problems: [], n: 1, maxResponseTokens: 16, maxTurns: 1, temperature: 1, seed: 1 };
    await backend.rollout(req);
    assert.ok(
      lines.some((l) => /^warning: weight sync: .*init failed \(test\).*through disk/.test(l)),
      lines.join('\n'),
    );
    const disk = sg.requests.filter((q) => q.path === '/update_weights_from_disk');
    assert.deepEqual(disk[0]?.body, { model_path: syncDir, weight_version: 'v1' });
    // the worker is fine afterwards, and later syncs go straight to disk without trying the group again
    await backend.sftStep(
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
    await backend.rollout(req);
    assert.equal(sg.requests.filter((q) => q.path === '/update_weights_from_disk').length, 2);
    assert.equal(sg.requests.filter((q) => q.path === '/init_weights_update_group').length, 1);
  } finally {
    await backend.close();
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
