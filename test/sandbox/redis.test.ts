import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { REDIS_PASSWORD_ENV, RedisRunner, RedisWorker } from '../../src/sandbox/redis.js';
import { SandboxServer } from '../../src/sandbox/server.js';
import type { RunRequest, RunResult } from '../../src/sandbox/types.js';
import { FakeRunner, okResult, startRedis } from './helpers.js';

const redis = await startRedis();
const skip = redis
  ? false
  : 'redis-server binary not found at /usr/bin/redis-server (apt-get install redis-server)';
const fast = { heartbeatTtlMs: 400, reapEveryMs: 100, log: () => {} };
let n = 0;
const prefix = () => `t${n++}`;

const cleanup: Array<() => Promise<void> | void> = [];
before(() => {});
after(async () => {
  for (const f of cleanup.reverse()) await f();
  await redis?.stop();
});

function hanging() {
  return new FakeRunner(() => new Promise<RunResult>(() => {}));
}

async function until(cond: () => boolean, ms = 10_000): Promise<void> {
  const t0 = Date.now();
  while (!cond()) {
    if (Date.now() - t0 > ms) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 20));
  }
}

test('front door + two workers: ordered results, work shared', { skip, timeout: 30_000 }, async () => {
  const url = redis!.url;
  const p = prefix();
  const slow = (req: RunRequest) => new Promise<RunResult>((r) => setTimeout(() => r(okResult(req)), 10));
  const r1 = new FakeRunner(slow);
  const r2 = new FakeRunner(slow);
  const w1 = await RedisWorker.start(url, r1, { ...fast, prefix: p, concurrency: 2 });
  const w2 = await RedisWorker.start(url, r2, { ...fast, prefix: p, concurrency: 2 });
  const front = await RedisRunner.connect(url, { ...fast, prefix: p });
  cleanup.push(
    () => front.close(),
    () => w1.stop(),
    () => w2.stop(),
  );
  const reqs = Array.from({ length: 40 }, (_, i) => ({ code: `c${i}` }));
  const rs = await front.runBatch(reqs);
  assert.deepEqual(
    rs.map((r) => r.stdout),
    reqs.map((r) => `ran:${r.code}\n`),
  );
  assert.ok(r1.seen.length > 0 && r2.seen.length > 0, `${r1.seen.length}/${r2.seen.length}`);
  assert.equal(r1.seen.length + r2.seen.length, 40);
  assert.equal(await front.numWorkers(), 2);
  assert.equal((await front.run({ code: 'one' })).stdout, 'ran:one\n');
});

test('a worker that dies mid-item: the item is requeued once and finishes elsewhere', {
  skip,
  timeout: 30_000,
}, async () => {
  const url = redis!.url;
  const p = prefix();
  const front = await RedisRunner.connect(url, { ...fast, prefix: p });
  cleanup.push(() => front.close());
  const dying = hanging();
  const a = await RedisWorker.start(url, dying, { ...fast, prefix: p, concurrency: 1 });
  const pending = front.run({ code: 'survivor' });
  await until(() => dying.seen.length === 1);
  a.crash();
  const healthy = new FakeRunner();
  const b = await RedisWorker.start(url, healthy, { ...fast, prefix: p, concurrency: 1 });
  cleanup.push(() => b.stop());
  const r = await pending;
  assert.equal(r.status, 'ok');
  assert.equal(r.stdout, 'ran:survivor\n');
  assert.equal(healthy.seen.length, 1);
});

test('an item whose worker dies twice is reported, not lost', { skip, timeout: 30_000 }, async () => {
  const url = redis!.url;
  const p = prefix();
  const front = await RedisRunner.connect(url, { ...fast, prefix: p });
  cleanup.push(() => front.close());
  const pending = front.run({ code: 'cursed' });
  for (let i = 0; i < 2; i++) {
    const dying = hanging();
    const w = await RedisWorker.start(url, dying, { ...fast, prefix: p, concurrency: 1 });
    await until(() => dying.seen.length === 1);
    w.crash();
  }
  const r = await pending;
  assert.equal(r.status, 'internal_error');
  assert.match(r.error ?? '', /worker died while running this item 2 times/);
});

test('no worker at all: queue_timeout after maxWaitMs, never a hang', { skip, timeout: 30_000 }, async () => {
  const front = await RedisRunner.connect(redis!.url, { ...fast, prefix: prefix(), maxWaitMs: 300 });
  cleanup.push(() => front.close());
  const r = await front.runBatch([{ code: 'x' }, { code: 'y' }]);
  assert.deepEqual(
    r.map((x) => x.status),
    ['queue_timeout', 'queue_timeout'],
  );
});

test('queue deadline: no worker takes it in time → queue_timeout, and a later worker never runs it', {
  skip,
  timeout: 10_000,
}, async () => {
  const url = redis!.url;
  const p = prefix();
  const front = await RedisRunner.connect(url, { ...fast, prefix: p });
  cleanup.push(() => front.close());
  const t0 = Date.now();
  const expired = front.run({ code: 'late', queueTimeoutMs: 300 });
  const patient = front.run({ code: 'patient' }); // no deadline: waits for a worker
  const r = await expired;
  const ms = Date.now() - t0;
  assert.equal(r.status, 'queue_timeout');
  assert.ok(ms >= 290 && ms < 2000, `answered after ${ms} ms`);
  assert.equal(await front.queueDepth(), 1, 'only the patient item is left on the queue');
  const late = new FakeRunner();
  const w = await RedisWorker.start(url, late, { ...fast, prefix: p, concurrency: 1 });
  cleanup.push(() => w.stop());
  assert.equal((await patient).status, 'ok');
  assert.deepEqual(
    late.seen.map((x) => x.code),
    ['patient'],
  );
});

test('HTTP service on Redis: /run answers queue_timeout at its deadline, /run/long-batch waits', {
  skip,
  timeout: 30_000,
}, async () => {
  const url = redis!.url;
  const p = prefix();
  const front = await RedisRunner.connect(url, { ...fast, prefix: p });
  const server = new SandboxServer({ runner: front, port: 0, log: () => {}, shortQueueWaitMs: 500 });
  const { url: base } = await server.listen();
  cleanup.push(
    () => front.close(),
    () => server.close(),
  );
  const post = async (path: string, body: unknown) =>
    (await fetch(base + path, { method: 'POST', body: JSON.stringify(body) })).json() as Promise<any>;
  const long = post('/run/long-batch', { submissions: [{ type: 'python', solution: 'long' }] });
  const t0 = Date.now();
  const short = await post('/run', { type: 'python', solution: 'short' });
  const ms = Date.now() - t0;
  assert.equal(short.reason, 'queue_timeout');
  assert.ok(ms >= 490 && ms < 3000, `answered after ${ms} ms`);
  const late = new FakeRunner();
  const w = await RedisWorker.start(url, late, { ...fast, prefix: p, concurrency: 1 });
  cleanup.push(() => w.stop());
  assert.equal((await long).results[0].stdout, 'ran:long\n');
  assert.deepEqual(
    late.seen.map((x) => x.code),
    ['long'],
  );
});

test('queue deadline: an item a worker took in time runs to the end', { skip, timeout: 30_000 }, async () => {
  const url = redis!.url;
  const p = prefix();
  const slow = new FakeRunner(
    (req) => new Promise<RunResult>((r) => setTimeout(() => r(okResult(req)), 600)),
  );
  const w = await RedisWorker.start(url, slow, { ...fast, prefix: p, concurrency: 1 });
  const front = await RedisRunner.connect(url, { ...fast, prefix: p });
  cleanup.push(
    () => front.close(),
    () => w.stop(),
  );
  const r = await front.run({ code: 'started', queueTimeoutMs: 200 });
  assert.equal(r.status, 'ok');
  assert.equal(r.stdout, 'ran:started\n');
});

test('password URLs reach Redis unchanged; a wrong or missing password fails clearly', {
  skip,
  timeout: 30_000,
}, async () => {
  const own = await startRedis(undefined, ['--requirepass', 'pa55:w/rd']);
  assert.ok(own);
  cleanup.push(() => own.stop());
  const good = own.url.replace('redis://', `redis://:${encodeURIComponent('pa55:w/rd')}@`);
  const p = prefix();
  const front = await RedisRunner.connect(good, { ...fast, prefix: p });
  const w = await RedisWorker.start(good, new FakeRunner(), { ...fast, prefix: p, concurrency: 1 });
  cleanup.push(
    () => front.close(),
    () => w.stop(),
  );
  assert.equal((await front.run({ code: 'authed' })).stdout, 'ran:authed\n');
  const wrong = own.url.replace('redis://', 'redis://:not-the-password@');
  await assert.rejects(RedisRunner.connect(wrong, fast), (e: Error) => {
    assert.match(e.message, /front door: cannot use redis at redis:\/\/:\*\*\*@127\.0\.0\.1:\d+: WRONGPASS/);
    assert.doesNotMatch(e.message, /not-the-password/);
    return true;
  });
  await assert.rejects(RedisWorker.start(own.url, new FakeRunner(), fast), /worker: .*NOAUTH/);
  // the environment's password, for URLs without one: it stays out of `ps`; a URL's own password wins
  process.env[REDIS_PASSWORD_ENV] = 'pa55:w/rd';
  try {
    const viaEnv = await RedisRunner.connect(own.url, { ...fast, prefix: p });
    cleanup.push(() => viaEnv.close());
    assert.equal((await viaEnv.run({ code: 'env' })).stdout, 'ran:env\n');
    await assert.rejects(RedisRunner.connect(wrong, fast), /WRONGPASS/);
    process.env[REDIS_PASSWORD_ENV] = 'not-it-either';
    await assert.rejects(RedisRunner.connect(own.url, fast), (e: Error) => {
      assert.match(e.message, /WRONGPASS/);
      assert.doesNotMatch(e.message, /not-it-either/);
      return true;
    });
  } finally {
    delete process.env[REDIS_PASSWORD_ENV];
  }
});

test('closing the front door answers pending items', { skip, timeout: 30_000 }, async () => {
  const front = await RedisRunner.connect(redis!.url, { ...fast, prefix: prefix() });
  const pending = front.run({ code: 'x' });
  await front.close();
  const r = await pending;
  assert.equal(r.status, 'internal_error');
  assert.match(r.error ?? '', /closed/);
});

test('redis restarts mid-item: waiting items are resubmitted and finish', {
  skip,
  timeout: 60_000,
}, async () => {
  const own = await startRedis();
  assert.ok(own);
  const p = prefix();
  const front = await RedisRunner.connect(own.url, { ...fast, prefix: p });
  const pending = front.run({ code: 'after-restart' });
  await new Promise((r) => setTimeout(r, 100)); // enqueued, no worker yet
  await own.stop();
  const again = await startRedis(own.port);
  assert.ok(again);
  const w = await RedisWorker.start(again.url, new FakeRunner(), { ...fast, prefix: p, concurrency: 1 });
  const r = await pending;
  assert.equal(r.status, 'ok');
  assert.equal(r.stdout, 'ran:after-restart\n');
  await w.stop();
  await front.close();
  await again.stop();
});

test('redis gone for good: waiting items are answered, not left hanging', {
  skip,
  timeout: 60_000,
}, async () => {
  const own = await startRedis();
  assert.ok(own);
  const front = await RedisRunner.connect(own.url, { ...fast, prefix: prefix(), redisDownFailMs: 500 });
  const pending = front.run({ code: 'x' });
  await new Promise((r) => setTimeout(r, 100));
  await own.stop();
  const r = await pending;
  assert.equal(r.status, 'internal_error');
  assert.match(r.error ?? '', /redis unreachable/);
  await front.close();
});
