import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { readJsonl } from '../../src/util/jsonl.js';

// `rstar2 train` launching the worker's ranks itself: 2 CPU ranks on one node, and the same 2 ranks as two
// "nodes" on localhost (node 1 only runs its rank, which takes its requests from rank 0).

const bin = join(import.meta.dirname, '../../bin/rstar2.js');
const env = { ...process.env, RSTAR2_NO_PROGRESS: '1', RSTAR2_WORKER_DEBUG: '1' };

function recipeFile(dir: string): string {
  const file = join(dir, 'r.json');
  writeFileSync(
    file,
    JSON.stringify({
      name: 'dist',
      model: { preset: 'tiny', threads: 1 },
      eval: { n: 1, maxResponseTokens: 16, maxTurns: 1 },
      stages: [{ type: 'sft', steps: 2, demos: 12, batchSize: 4 }],
    }),
  );
  return file;
}

function train(args: string[]): Promise<{ status: number | null; stderr: string }> {
  return new Promise((res) => {
    const c = spawn(process.execPath, [bin, 'train', '--insecure-no-sandbox', ...args], { env });
    let stderr = '';
    c.stderr.on('data', (d) => {
      stderr += d;
    });
    c.on('exit', (status) => res({ status, stderr }));
  });
}

const losses = (run: string) => readJsonl<{ loss: number }>(join(run, 'metrics.jsonl')).map((m) => m.loss);

async function freePort(): Promise<number> {
  return new Promise((res) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => res(port));
    });
  });
}

test('rstar2 train --nproc-per-node 2 trains on 2 ranks, and as 2 nodes of 1 rank, with the 1-rank losses', {
  timeout: 170_000,
}, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-launch-'));
  try {
    const file = recipeFile(dir);
    const one = await train(['--recipe', file, '--out', join(dir, 'one')]);
    assert.equal(one.status, 0, one.stderr);
    const two = await train(['--recipe', file, '--out', join(dir, 'two'), '--nproc-per-node', '2']);
    assert.equal(two.status, 0, two.stderr);
    assert.match(two.stderr, /rank 1\/2 \(local 1\) joined/);
    const port = await freePort();
    const master = `127.0.0.1:${port}`;
    const [node0, node1] = await Promise.all([
      train([
        '--recipe',
        file,
        '--out',
        join(dir, 'nodes'),
        '--nnodes',
        '2',
        '--node-rank',
        '0',
        '--master',
        master,
      ]),
      train(['--recipe', file, '--nnodes', '2', '--node-rank', '1', '--master', master]),
    ]);
    assert.equal(node0.status, 0, node0.stderr);
    assert.equal(node1.status, 0, node1.stderr);
    assert.match(node1.stderr, /rank 1\/2 \(local 0\) joined/);
    const [l1, l2, ln] = [losses(join(dir, 'one')), losses(join(dir, 'two')), losses(join(dir, 'nodes'))];
    assert.equal(l1.length, 2);
    for (let i = 0; i < 2; i++) assert.ok(Math.abs(l1[i] - l2[i]) < 1e-5, `${l1} vs ${l2}`);
    assert.deepEqual(ln, l2, 'the same global ranks compute the same sums');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('rstar2 train names a bad layout before starting anything', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-launch-bad-'));
  try {
    const file = recipeFile(dir);
    const run = (...args: string[]) =>
      spawnSync(process.execPath, [bin, 'train', '--recipe', file, '--out', join(dir, 'x'), ...args], {
        encoding: 'utf8',
        env,
      });
    assert.match(run('--nnodes', '2', '--master', 'nohost').stderr, /--master must be ADDR:PORT/);
    assert.match(
      run('--nnodes', '2', '--node-rank', '2', '--master', '10.0.0.1:29500').stderr,
      /node-rank 2 is out of range: nodes are numbered 0..1/,
    );
    assert.match(run('--nnodes', '2').stderr, /--nnodes 2 needs --master ADDR:PORT/);
    assert.match(
      run('--nproc-per-node', 'two').stderr,
      /option '--nproc-per-node <n>' argument 'two' is invalid. Expected a positive integer./,
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("every node starts its ranks with the recipe's model options (precision, sharding, backend, offload, compile)", async () => {
  const { parseRecipe } = await import('../../src/recipe/config.js');
  const { workerStartOptions } = await import('../../src/recipe/policy.js');
  const r = parseRecipe({
    name: 'opts',
    model: {
      preset: 'tiny',
      threads: 3,
      precision: 'bf16-mixed',
      backend: 'transformers',
      nprocPerNode: 2,
      sharding: 'fsdp',
      offloadOptimizer: true,
      compile: 'on',
    },
    stages: [{ type: 'sft', steps: 1, demos: 4, batchSize: 4 }],
  });
  assert.deepEqual(workerStartOptions(r.model), {
    threads: 3,
    precision: 'bf16-mixed',
    modelImpl: 'transformers',
    compile: 'on',
    ranks: 2,
    sharding: 'fsdp',
    offloadOptimizer: true,
  });
});
