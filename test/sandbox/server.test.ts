import assert from 'node:assert/strict';
import { createServer } from 'node:net';
import { after, test } from 'node:test';
import { SandboxClient } from '../../src/sandbox/client.js';
import { failedResult } from '../../src/sandbox/codejudge.js';
import { FairQueue, SandboxServer, type SandboxServerOptions } from '../../src/sandbox/server.js';
import type { RunRequest, RunResult } from '../../src/sandbox/types.js';
import { FakeRunner, okResult, SpawnRunner } from './helpers.js';

const servers: SandboxServer[] = [];
after(async () => {
  for (const s of servers) await s.close();
});

async function start(opts: Partial<SandboxServerOptions> = {}) {
  const s = new SandboxServer({ runner: new SpawnRunner(), port: 0, log: () => {}, ...opts });
  servers.push(s);
  const { url } = await s.listen();
  const post = async (path: string, body: unknown, raw = false) => {
    const res = await fetch(url + path, {
      method: 'POST',
      body: raw ? (body as string) : JSON.stringify(body),
    });
    return { status: res.status, body: (await res.json()) as any };
  };
  return { s, url, post };
}

function deferredRunner() {
  const waiting: Array<() => void> = [];
  const runner = new FakeRunner(
    (req: RunRequest) => new Promise<RunResult>((resolve) => waiting.push(() => resolve(okResult(req)))),
  );
  return { runner, waiting };
}

test('code-judge /run: shape, reason, stdout', async () => {
  const { post } = await start();
  const r = await post('/run', { type: 'python', solution: 'print(1+1)' });
  assert.equal(r.status, 200);
  assert.deepEqual(Object.keys(r.body), [
    'sub_id',
    'success',
    'run_success',
    'cost',
    'stdout',
    'stderr',
    'reason',
  ]);
  assert.equal(r.body.success, true);
  assert.equal(r.body.run_success, true);
  assert.equal(r.body.stdout, '2\n');
  assert.equal(r.body.stderr, '');
  assert.equal(r.body.reason, '');
  assert.equal(typeof r.body.sub_id, 'string');
  assert.equal(typeof r.body.cost, 'number');
});

test('code-judge semantics: stdin, expected_output, cut, failure, timeout, judge shape', async () => {
  const { post } = await start({ timeoutMs: 2000 }); // generous: the machine is shared
  const r = await post('/run/long-batch', {
    type: 'batch',
    submissions: [
      { sub_id: 'a', type: 'python', solution: 'print(sum(map(int, input().split())))', input: '3 4' },
      { type: 'python', solution: 'print(7)', expected_output: '7\n ' },
      { type: 'python', solution: 'print(7)', expected_output: '8' },
      { type: 'python', solution: "print('x' * 5000)" },
      { type: 'python', solution: 'import sys\nprint("before")\nsys.exit(3)' },
      { type: 'python', solution: 'while True: pass' },
      { type: 'cpp', solution: 'int main(){}' },
    ],
  });
  assert.equal(r.status, 200);
  const [a, b, c, d, e, f, g] = r.body.results;
  assert.equal(a.sub_id, 'a');
  assert.equal(a.stdout, '7\n');
  assert.equal(b.success, true);
  assert.equal(c.success, false);
  assert.equal(c.run_success, true);
  assert.equal(d.stdout.length, 1000);
  assert.deepEqual([e.run_success, e.reason, e.stdout], [false, '', 'before\n']);
  assert.deepEqual([f.reason, f.stdout], ['worker_timeout', 'Suicide from timeout.\n']);
  assert.equal(g.reason, 'invalid_input');
  assert.match(g.stderr, /type 'cpp' is not supported/);
  const j = await post('/judge', { type: 'python', solution: 'print(1)' });
  assert.deepEqual(Object.keys(j.body), ['sub_id', 'success', 'run_success', 'cost', 'reason']);
});

test('batch results come back in request order', async () => {
  const runner = new FakeRunner(async (req) => {
    await new Promise((r) => setTimeout(r, Number(req.code) % 7));
    return okResult(req);
  });
  const { post } = await start({ runner, concurrency: 8 });
  const submissions = Array.from({ length: 50 }, (_, i) => ({ type: 'python', solution: String(50 - i) }));
  const r = await post('/run/batch', { sub_id: 'B', submissions });
  assert.equal(r.body.sub_id, 'B');
  assert.deepEqual(
    r.body.results.map((x: any) => x.stdout),
    submissions.map((s) => `ran:${s.solution}\n`),
  );
});

test('bad input: malformed JSON, missing fields, empty batch, oversized body, oversized code', async () => {
  const { post, url } = await start({ runner: new FakeRunner(), maxBodyBytes: 10_000, maxCodeBytes: 100 });
  const m = await post('/run', '{"type": "python",', true);
  assert.equal(m.status, 400);
  assert.match(m.body.error, /malformed JSON/);
  const miss = await post('/run', { type: 'python' });
  assert.equal(miss.status, 400);
  assert.match(miss.body.error, /solution/);
  const empty = await post('/run/long-batch', { submissions: [] });
  assert.equal(empty.status, 400);
  assert.match(empty.body.error, /submissions/);
  const big = await post('/v1/run', { code: 'x'.repeat(20_000) });
  assert.equal(big.status, 413);
  assert.match(big.body.error, /over the 10000-byte limit per request/);
  const code = await post('/v1/batch', { requests: [{ code: 'x'.repeat(200) }, { code: '1' }] });
  assert.equal(code.status, 200);
  assert.equal(code.body.results[0].status, 'invalid_input');
  assert.match(code.body.results[0].error, /over the 100-byte limit/);
  assert.equal(code.body.results[1].status, 'ok');
  const nf = await fetch(`${url}/nope`);
  assert.equal(nf.status, 404);
});

test('busy: a request that does not fit is refused whole with 503 + JSON', { timeout: 20_000 }, async () => {
  const { runner, waiting } = deferredRunner();
  const { post } = await start({ runner, concurrency: 1, maxQueue: 2 });
  const first = post('/v1/batch', { requests: [{ code: 'a' }, { code: 'b' }, { code: 'c' }] }); // 1 runs, 2 wait
  await new Promise((r) => setTimeout(r, 50));
  const refused = await post('/v1/run', { code: 'd' });
  assert.equal(refused.status, 503);
  assert.equal(refused.body.error, 'busy');
  assert.match(refused.body.message, /queue full/);
  while (
    (await Promise.race([first.then(() => 'done'), new Promise((r) => setTimeout(() => r('wait'), 20))])) !==
    'done'
  )
    for (const f of waiting.splice(0)) f();
  assert.deepEqual(
    (await first).body.results.map((r: RunResult) => r.status),
    ['ok', 'ok', 'ok'],
  );
});

test('queue_timeout is answered at the deadline, not after a hidden wait', { timeout: 20_000 }, async () => {
  const { runner, waiting } = deferredRunner();
  const { post } = await start({ runner, concurrency: 1, shortQueueWaitMs: 150 });
  const blocker = post('/v1/run', { code: 'block' });
  await new Promise((r) => setTimeout(r, 30));
  const t0 = Date.now();
  const r = await post('/run', { type: 'python', solution: 'print(1)' });
  const waited = Date.now() - t0;
  assert.equal(r.body.reason, 'queue_timeout');
  assert.ok(waited < 2000, `answered after ${waited} ms`);
  assert.equal(runner.seen.length, 1); // never ran
  for (const f of waiting.splice(0)) f();
  assert.equal((await blocker).body.status, 'ok');
});

test('fair queue serves clients round-robin', async () => {
  const order: string[] = [];
  const runner = new FakeRunner(async (req) => {
    order.push(req.code);
    await new Promise((r) => setTimeout(r, 1));
    return okResult(req);
  });
  const queue = new FairQueue(runner, 1, 1000);
  const all: Promise<RunResult>[] = [];
  for (let i = 0; i < 10; i++) all.push(queue.submit('A', { code: `A${i}` }, Infinity));
  for (let i = 0; i < 3; i++) all.push(queue.submit('B', { code: `B${i}` }, Infinity));
  await Promise.all(all);
  assert.equal(order.length, 13);
  // B's three items run within the first seven slots instead of after all of A's.
  assert.ok(order.indexOf('B2') <= 6, order.join(','));
  assert.deepEqual(
    order.filter((x) => x.startsWith('A')),
    Array.from({ length: 10 }, (_, i) => `A${i}`),
  );
});

test('shutdown answers queued items instead of dropping them', async () => {
  const { runner, waiting } = deferredRunner();
  const queue = new FairQueue(runner, 1, 1000);
  const a = queue.submit('c', { code: 'a' }, Infinity);
  const b = queue.submit('c', { code: 'b' }, Infinity);
  queue.close();
  assert.equal((await b).status, 'internal_error');
  for (const f of waiting.splice(0)) f();
  assert.equal((await a).status, 'ok');
});

test('ping, status, metrics', async () => {
  const { url, post } = await start({ runner: new FakeRunner(), concurrency: 3 });
  assert.equal(await (await fetch(`${url}/ping`)).json(), 'pong');
  await post('/v1/run', { code: 'x' });
  await post('/v1/run', { code: 'x' });
  const st = (await (await fetch(`${url}/status`)).json()) as any;
  assert.deepEqual([st.queue, st.num_workers], [0, 3]);
  const m = await (await fetch(`${url}/metrics`)).text();
  assert.match(m, /rstar2_sandbox_items_total\{status="ok"\} 2/);
  assert.match(m, /rstar2_sandbox_queue_depth 0/);
  assert.match(m, /rstar2_sandbox_item_latency_seconds_count 2/);
  assert.match(m, /rstar2_sandbox_requests_total\{route="\/v1\/run"\} 2/);
});

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const srv = createServer().listen(0, '127.0.0.1', () => {
      const p = (srv.address() as { port: number }).port;
      srv.close(() => resolve(p));
    });
  });
}

test('client: native batch with full RunResults', async () => {
  const { url } = await start();
  const client = new SandboxClient({ url });
  const rs = await client.runBatch([
    { code: 'print(1)' },
    { code: '1/0' },
    { code: 'print(input())', stdin: 'hi' },
  ]);
  assert.deepEqual(
    rs.map((r) => [r.status, r.exitCode]),
    [
      ['ok', 0],
      ['error', 1],
      ['ok', 0],
    ],
  );
  assert.match(rs[1].stderr, /ZeroDivisionError/);
  assert.equal(rs[2].stdout, 'hi\n');
});

test('client: retries until the service comes up; reports per item when it never does', async () => {
  const port = await freePort();
  const client = new SandboxClient({ url: `http://127.0.0.1:${port}`, retries: 6, backoffMs: 50 });
  const pending = client.runBatch([{ code: 'a' }, { code: 'b' }]);
  await new Promise((r) => setTimeout(r, 120));
  await start({ runner: new FakeRunner(), port });
  assert.deepEqual(
    (await pending).map((r) => r.stdout),
    ['ran:a\n', 'ran:b\n'],
  );
  const dead = new SandboxClient({ url: `http://127.0.0.1:${await freePort()}`, retries: 1, backoffMs: 10 });
  const rs = await dead.runBatch([{ code: 'a' }, { code: 'b' }]);
  assert.equal(rs.length, 2);
  for (const r of rs) {
    assert.equal(r.status, 'internal_error');
    assert.match(r.error ?? '', /cannot reach sandbox service.*after 2 attempts/);
  }
});

test('runner exceptions become per-item internal_error', async () => {
  const runner = new FakeRunner((req) =>
    req.code === 'boom' ? Promise.reject(new Error('pool died')) : okResult(req),
  );
  const { post } = await start({ runner });
  const r = await post('/v1/batch', { requests: [{ code: 'boom' }, { code: 'fine' }] });
  assert.equal(r.body.results[0].status, 'internal_error');
  assert.match(r.body.results[0].error, /pool died/);
  assert.equal(r.body.results[1].status, 'ok');
  void failedResult;
});

test('close lets running items finish and answers them', { timeout: 20_000 }, async () => {
  const runner = new FakeRunner(async (req) => {
    await new Promise((r) => setTimeout(r, 300));
    return okResult(req);
  });
  const s = new SandboxServer({ runner, port: 0, log: () => {}, concurrency: 1 });
  const { url } = await s.listen();
  const post = (code: string) =>
    fetch(`${url}/v1/run`, { method: 'POST', body: JSON.stringify({ code }) }).then(
      (r) => r.json() as Promise<RunResult>,
    );
  const running = post('slow');
  const queued = post('queued');
  await new Promise((r) => setTimeout(r, 100));
  await s.close();
  assert.equal((await running).status, 'ok');
  assert.equal((await queued).status, 'internal_error');
});
