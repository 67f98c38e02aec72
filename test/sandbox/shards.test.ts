// One sandbox over several broker+zygote pairs (issue 42): calls to the least loaded shard, sessions pinned to the
// shard that opened them, one /metrics over all, a shard's restart confined to its own sessions.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { after, test } from 'node:test';
import { SandboxServer } from '../../src/sandbox/server.js';
import { defaultShards, resolveShards, SHARDS_ENV, ShardedPool } from '../../src/sandbox/shards.js';

test('the shard count: one per 4 cores (at least 1), or the option, or $RSTAR2_SANDBOX_SHARDS', () => {
  assert.deepEqual(
    [1, 2, 4, 5, 6, 8, 16, 64].map((c) => defaultShards(c)),
    [1, 1, 1, 1, 2, 2, 4, 16],
  );
  const saved = process.env[SHARDS_ENV];
  try {
    process.env[SHARDS_ENV] = '3';
    assert.equal(resolveShards(), 3);
    assert.equal(resolveShards(2), 2, 'the option wins');
    process.env[SHARDS_ENV] = 'many';
    assert.throws(
      () => resolveShards(),
      /sandbox shards must be an integer in \[1, 64\], got "many" \(from \$RSTAR2_SANDBOX_SHARDS\)/,
    );
    delete process.env[SHARDS_ENV];
    assert.equal(resolveShards(), defaultShards());
    assert.throws(() => resolveShards(0), /got 0/);
  } finally {
    if (saved === undefined) delete process.env[SHARDS_ENV];
    else process.env[SHARDS_ENV] = saved;
  }
});

const bwrap = existsSync('/usr/bin/bwrap');
const pools: ShardedPool[] = [];
after(async () => {
  for (const p of pools) await p.close();
});

async function sharded(n: number, slots: number) {
  const pool = await ShardedPool.start({ shards: n, slots, maxSessions: 4, log: () => {} });
  pools.push(pool);
  return pool;
}

test('calls go to the shard with the fewest outstanding; each shard is a sandbox of its own', {
  skip: bwrap ? false : 'bubblewrap not installed',
  timeout: 120_000,
}, async () => {
  const pool = await sharded(2, 4);
  assert.equal(pool.shards.length, 2);
  assert.equal(pool.slots, 4);
  assert.deepEqual(
    pool.shards.map((p) => p.options.slots),
    [2, 2],
  );
  const pids = pool.sandboxPids;
  assert.equal(new Set(pids).size, 2, 'two sandbox processes');
  assert.notEqual(pool.shards[0].info.uidBase, pool.shards[1].info.uidBase, 'slot uids of their own');
  // three long calls: shards 0, 1, 0 (ties go round), so shard 0 has two outstanding and shard 1 one
  const long = [0, 1, 2].map(() => pool.run({ code: 'import time; time.sleep(1.5)', timeoutMs: 10_000 }));
  await new Promise((r) => setTimeout(r, 200));
  const before = pool.shardStats().map((s) => s.completed);
  for (let i = 0; i < 5; i++) assert.equal((await pool.run({ code: 'print(6*7)' })).stdout, '42\n');
  const after = pool.shardStats().map((s) => s.completed);
  assert.deepEqual(
    [after[0] - before[0], after[1] - before[1]],
    [0, 5],
    'every short call went to the less loaded shard',
  );
  for (const r of await Promise.all(long)) assert.equal(r.status, 'ok');
  // a batch is spread over both
  const batch = await pool.runBatch(Array.from({ length: 40 }, (_, i) => ({ code: `print(${i})` })));
  assert.deepEqual(
    batch.map((r) => r.stdout),
    Array.from({ length: 40 }, (_, i) => `${i}\n`),
  );
  const done = pool.shardStats().map((s, i) => s.completed - after[i]);
  assert.ok(done[0] >= 10 && done[1] >= 10, `batch split ${done}`);
  assert.equal(pool.stats().completed, pool.shardStats()[0].completed + pool.shardStats()[1].completed);
});

test('sessions stay on their shard; one shard restarting loses only its own sessions', {
  skip: bwrap ? false : 'bubblewrap not installed',
  timeout: 120_000,
}, async () => {
  const pool = await sharded(2, 2);
  for (let i = 0; i < 4; i++) {
    const r = await pool.run({ code: `x = ${i}`, session: `s${i}` });
    assert.equal(r.status, 'ok', r.error);
  }
  assert.deepEqual(
    pool.shardStats().map((s) => s.sessions),
    [2, 2],
    'new sessions go to the shard with the fewest',
  );
  for (let i = 0; i < 4; i++)
    assert.equal((await pool.run({ code: 'print(x)', session: `s${i}` })).stdout, `${i}\n`);
  // closing goes to the session's own shard
  assert.equal(pool.closeSession('s0'), true);
  assert.equal(pool.closeSession('s0'), false);
  assert.equal(pool.stats().sessions, 3);
  // kill one shard's sandbox: its sessions are lost, the other shard's keep their state
  const victim = pool.shards.findIndex((p) => p.stats().sessions === 2);
  process.kill(pool.shards[victim].sandboxPid as number, 'SIGKILL');
  await new Promise((r) => setTimeout(r, 500));
  const answers = await Promise.all([1, 2, 3].map((i) => pool.run({ code: 'print(x)', session: `s${i}` })));
  const kept = answers.filter((r) => r.status === 'ok');
  const lost = answers.filter((r) => /lost: the sandbox restarted/.test(r.error ?? ''));
  assert.equal(kept.length, 1, JSON.stringify(answers.map((r) => r.error)));
  assert.equal(lost.length, 2);
  assert.equal(pool.shardStats()[victim].restarts, 1);
  assert.equal(pool.shardStats()[1 - victim].restarts, 0);
  assert.equal((await pool.run({ code: 'print(1)' })).status, 'ok');
});

test('/metrics labels each shard: calls, in flight, sessions, restarts', {
  skip: bwrap ? false : 'bubblewrap not installed',
  timeout: 120_000,
}, async () => {
  const pool = await sharded(2, 4);
  const server = new SandboxServer({
    runner: pool,
    port: 0,
    concurrency: pool.slots,
    shardStats: () => pool.shardStats(),
    log: () => {},
  });
  const { url } = await server.listen();
  try {
    const res = await fetch(`${url}/v1/batch`, {
      method: 'POST',
      body: JSON.stringify({ requests: Array.from({ length: 20 }, () => ({ code: 'print(1)' })) }),
    });
    assert.equal(res.status, 200);
    const text = await (await fetch(`${url}/metrics`)).text();
    const calls = [0, 1].map((i) =>
      Number(new RegExp(`^rstar2_sandbox_shard_calls_total\\{shard="${i}"\\} (\\d+)$`, 'm').exec(text)?.[1]),
    );
    assert.ok(
      calls.every((n) => n > 0),
      text,
    );
    assert.equal(calls[0] + calls[1], pool.stats().completed);
    assert.match(text, /^rstar2_sandbox_shard_restarts_total\{shard="1"\} 0$/m);
    assert.match(text, /^rstar2_sandbox_shard_in_flight\{shard="0"\} 0$/m);
    assert.match(text, /^rstar2_sandbox_shard_sessions\{shard="1"\} 0$/m);
    // the service's own counters are over all shards
    assert.match(text, /^rstar2_sandbox_items_total\{status="ok"\} 20$/m);
  } finally {
    await server.close();
  }
});
