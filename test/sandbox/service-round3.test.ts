// The sandbox service against the third round of attacks on its HTTP front (issue 42): batches whose answers
// would exhaust the heap (break 2), bodies that declare much and send nothing or stall, one connection taking
// the whole body budget, one client taking every session (break 6).
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { type IncomingMessage, request } from 'node:http';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { SandboxClient } from '../../src/sandbox/client.js';
import { SandboxServer, type SandboxServerOptions } from '../../src/sandbox/server.js';
import type { RunResult } from '../../src/sandbox/types.js';
import { FakeRunner, okResult, SessionRunner } from './helpers.js';

const servers: SandboxServer[] = [];
after(async () => {
  for (const s of servers) await s.close(100);
});

async function start(opts: Partial<SandboxServerOptions> = {}) {
  const runner = (opts.runner as FakeRunner | undefined) ?? new FakeRunner();
  const s = new SandboxServer({ port: 0, log: () => {}, ...opts, runner });
  servers.push(s);
  const { port, url } = await s.listen();
  return { s, port, url, runner };
}

async function readAnswer(res: IncomingMessage): Promise<{ status: number; body: any; text: string }> {
  let text = '';
  for await (const c of res) text += c;
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {}
  return { status: res.statusCode ?? 0, body, text };
}

const post = async (url: string, path: string, body: unknown, headers: Record<string, string> = {}) => {
  const r = await fetch(url + path, { method: 'POST', body: JSON.stringify(body), headers });
  const text = await r.text();
  return { status: r.status, text, body: JSON.parse(text) };
};

/** A distinct string of `n` bytes per call, as a snippet printing that much produces (no shared storage). */
const printed = (i: number, n: number) => Buffer.alloc(n, 97 + (i % 26)).toString('latin1');
const floodRunner = (n: number) => {
  let i = 0;
  return new FakeRunner((req) => ({ ...okResult(req), stdout: printed(i++, n) }));
};

test('a batch over maxBatchItems is refused whole with 413 before anything runs', async () => {
  const { url, runner } = await start();
  const subs = Array.from({ length: 4500 }, () => ({ type: 'python', solution: 'print("x" * 2**20)' }));
  const cj = await post(url, '/run/long-batch', { type: 'batch', submissions: subs });
  assert.equal(cj.status, 413);
  assert.match(
    cj.body.error,
    /request has (at least )?\d+ items, over the limit of 4096 per request.*--max-batch-items/,
  );
  const native = await post(url, '/v1/batch', { requests: subs.map((x) => ({ code: x.solution })) });
  assert.equal(native.status, 413);
  assert.equal(runner.seen.length, 0, 'nothing ran');
  // at the limit it runs
  const ok = await post(url, '/v1/batch', { requests: subs.slice(0, 4096).map(() => ({ code: 'x' })) });
  assert.equal(ok.status, 200);
  assert.equal(ok.body.results.length, 4096);
});

/** Sends `body` to `path` while /ping is asked every 10 ms; the answer and the slowest /ping's milliseconds. */
async function pingWhile(
  url: string,
  path: string,
  body: string,
): Promise<{ status: number; error: string; worstPingMs: number }> {
  let worst = 0;
  let sending = true;
  const pinger = (async () => {
    while (sending) {
      const t0 = performance.now();
      await (await fetch(`${url}/ping`)).text();
      worst = Math.max(worst, performance.now() - t0);
      await new Promise((r) => setTimeout(r, 10));
    }
  })();
  try {
    const r = await fetch(url + path, {
      method: 'POST',
      body,
      headers: { 'content-type': 'application/json' },
    });
    const answer = (await r.json()) as { error: string };
    return { status: r.status, error: answer.error, worstPingMs: worst };
  } finally {
    sending = false;
    await pinger;
  }
}

test('a million invalid items are refused as they arrive, and /ping is answered meanwhile', {
  timeout: 60_000,
}, async () => {
  const { url, runner } = await start();
  const items = `[${Array(1_000_000).fill('{}').join(',')}]`;
  for (const [path, body] of [
    ['/v1/batch', `{"requests":${items}}`],
    ['/run/long-batch', `{"type":"batch","submissions":${items}}`],
  ]) {
    const r = await pingWhile(url, path, body);
    assert.equal(r.status, 413, `${path}: ${r.error}`);
    assert.match(r.error, /request has at least \d+ items, over the limit of 4096 per request/);
    // the old code parsed and validated all of them: ~8 s with /ping waiting
    assert.ok(r.worstPingMs < 1000, `${path}: /ping waited ${r.worstPingMs.toFixed(0)} ms`);
  }
  // a body whose structure is huge inside few items (a million keys in one item's files) is refused by its count
  const keys = Array.from({ length: 1_000_000 }, (_, i) => `"f${i}":1`).join(',');
  const r = await pingWhile(url, '/v1/run', `{"code":"x","files":{${keys}}}`);
  assert.equal(r.status, 413, r.error);
  assert.match(r.error, /over 262144 JSON brackets, commas and colons \(maxBodyTokens\)/);
  assert.ok(r.worstPingMs < 1000, `/ping waited ${r.worstPingMs.toFixed(0)} ms`);
  assert.equal(runner.seen.length, 0, 'nothing ran');
});

test('a batch answer carries at most maxBatchOutputBytes of output; later items say why theirs is missing', async () => {
  const limit = 4 << 20;
  const { url } = await start({ runner: floodRunner(256 << 10), maxBatchOutputBytes: limit });
  const r = await post(url, '/v1/batch', { requests: Array.from({ length: 100 }, () => ({ code: 'x' })) });
  assert.equal(r.status, 200);
  const results = r.body.results as RunResult[];
  assert.equal(results.length, 100);
  assert.ok(
    results.every((x) => x.status === 'ok'),
    'every item keeps its status',
  );
  const full = results.filter((x) => x.stdout.length === 256 << 10);
  const dropped = results.filter((x) => x.stdout === '');
  assert.equal(full.length + dropped.length, 100);
  assert.ok(full.length >= 10 && full.length <= 16, `${full.length} items kept their output`);
  assert.ok(r.text.length <= limit + 100 * 400, `answer is ${r.text.length} bytes`);
  for (const x of dropped) {
    assert.equal(x.truncated, true);
    assert.match(x.error ?? '', /output dropped: this request's answer already holds \d+ bytes of output/);
  }
});

test('answers being assembled hold at most maxOutputBytesHeld together; the largest gives its output up first', {
  timeout: 30_000,
}, async () => {
  let release!: () => void;
  const gate = new Promise<void>((r) => {
    release = r;
  });
  let i = 0;
  const runner = new FakeRunner(async (req) => {
    if (req.code === 'wait') await gate;
    return { ...okResult(req), stdout: printed(i++, 256 << 10) };
  });
  const { url } = await start({ runner, maxBatchOutputBytes: 6 << 20, maxOutputBytesHeld: 6 << 20 });
  // 40 items of 256 KiB, the last one held back: the answer fills the service's 6 MiB while it waits
  const big = post(url, '/v1/batch', {
    requests: [...Array.from({ length: 39 }, () => ({ code: 'x' })), { code: 'wait' }],
  });
  await new Promise((r) => setTimeout(r, 300));
  const small = await post(url, '/v1/batch', { requests: Array.from({ length: 4 }, () => ({ code: 'y' })) });
  assert.equal(small.status, 200);
  for (const x of small.body.results as RunResult[]) assert.equal(x.stdout.length, 256 << 10);
  release();
  const b = await big;
  assert.equal(b.status, 200);
  const results = b.body.results as RunResult[];
  assert.ok(results.every((x) => x.status === 'ok'));
  const kept = results.filter((x) => x.stdout !== '').length;
  assert.ok(kept < 24, `the waiting answer kept ${kept} outputs of 256 KiB under a 6 MiB budget`);
  assert.ok(
    results.some((x) => /output dropped: the service needed room for other answers/.test(x.error ?? '')),
  );
});

test('a batch of 1,000 items printing 1 MiB each cannot exhaust the service heap (384 MB)', {
  timeout: 120_000,
}, async () => {
  // the server in a process of its own, with a heap smaller than the outputs together
  const script = `
import { SandboxServer } from ${JSON.stringify(join(import.meta.dirname, '../../src/sandbox/server.ts'))};
let i = 0;
const runner = {
  async run(req) {
    const stdout = Buffer.alloc(1 << 20, 97 + (i++ % 26)).toString('latin1');
    return { status: 'ok', exitCode: 0, signal: null, stdout, stderr: '', truncated: false, timedOut: false,
      oom: false, wallMs: 1, cpuMs: 1, peakMemoryKb: 0 };
  },
  runBatch(reqs) { return Promise.all(reqs.map((r) => this.run(r))); },
  async close() {},
};
const s = new SandboxServer({ runner, port: 0, log: () => {} });
const { url } = await s.listen();
console.log(url);
`;
  const child = spawn(
    process.execPath,
    ['--max-old-space-size=384', '--import', 'tsx', '--input-type=module', '-e', script],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let stderr = '';
  child.stderr.on('data', (d) => (stderr += d));
  try {
    const [line] = (await once(child.stdout, 'data')) as [Buffer];
    const url = line.toString().trim();
    const subs = Array.from({ length: 1000 }, () => ({ type: 'python', solution: 'print("x" * 2**20)' }));
    const cj = await post(url, '/run/long-batch', { type: 'batch', submissions: subs });
    assert.equal(cj.status, 200);
    assert.equal(cj.body.results.length, 1000);
    assert.equal(cj.body.results[999].stdout.length, 1000, "cut to code-judge's 1000 characters");
    const native = await post(url, '/v1/batch', { requests: subs.map(() => ({ code: 'x' })) });
    assert.equal(native.status, 200);
    const results = native.body.results as RunResult[];
    assert.equal(results.length, 1000);
    assert.ok(results.filter((x) => x.stdout !== '').length <= 64, 'at most 64 MiB of output in one answer');
    assert.equal(child.exitCode, null, stderr);
  } finally {
    child.kill('SIGKILL');
  }
});

/** Starts a POST whose body is only partly sent. */
function partialPost(port: number, total: number, first: number, chunked = false) {
  const req = request({
    host: '127.0.0.1',
    port,
    method: 'POST',
    path: '/v1/run',
    agent: false,
    headers: chunked ? { 'transfer-encoding': 'chunked' } : { 'content-length': total },
  });
  const answered = new Promise<{ status: number; body: any }>((resolve, reject) => {
    req.on('response', (res) => resolve(readAnswer(res)));
    req.on('error', reject);
  });
  answered.catch(() => {});
  let closed = false;
  req.on('close', () => {
    closed = true;
  });
  const body = Buffer.from(JSON.stringify({ code: 'x'.repeat(total - 11) }));
  req.write(body.subarray(0, first));
  return {
    answered,
    more: (n: number) => req.write(body.subarray(first, (first += n))),
    finish: () => req.end(body.subarray(first)),
    abort: () => req.destroy(),
    closed: () => closed,
  };
}

test('bodies that declare much and send nothing hold none of the in-flight budget', {
  timeout: 30_000,
}, async () => {
  const { port, url } = await start({ maxBodyBytes: 1_000_000, maxBodyBytesInFlight: 1_000_000 });
  const idle = [partialPost(port, 1_000_000, 10), partialPost(port, 1_000_000, 10)];
  await new Promise((r) => setTimeout(r, 300));
  const r = await post(url, '/v1/run', { code: 'innocent' });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.body.stdout, 'ran:innocent\n');
  for (const p of idle) p.abort();
});

test('when bodies fill the budget, the one holding the most is refused, not the newcomer', {
  timeout: 30_000,
}, async () => {
  const { port, runner } = await start({ maxBodyBytes: 1_000_000, maxBodyBytesInFlight: 1_000_000 });
  const hog = partialPost(port, 1_000_000, 900_000);
  await new Promise((r) => setTimeout(r, 300));
  const innocent = partialPost(port, 200_000, 200_000);
  innocent.finish();
  const i = await innocent.answered;
  assert.equal(i.status, 200, JSON.stringify(i.body));
  const h = await hog.answered;
  assert.equal(h.status, 503);
  assert.match(
    h.body.error,
    /busy: \d+ bytes of request bodies are being received, limit 1000000, and this one holds the most/,
  );
  hog.abort();
  // a chunked body (no content-length) is counted as it arrives, the same way
  const chunkedHog = partialPost(port, 1_000_000, 900_000, true);
  await new Promise((r) => setTimeout(r, 300));
  const second = partialPost(port, 200_000, 200_000);
  second.finish();
  assert.equal((await second.answered).status, 200);
  assert.equal((await chunkedHog.answered).status, 503);
  chunkedHog.abort();
  assert.equal(runner.seen.length, 2);
});

test('a body that stops sending is cut after bodyIdleTimeoutMs, long before requestTimeoutMs', {
  timeout: 30_000,
}, async () => {
  const { port, url } = await start({ requestTimeoutMs: 20_000, bodyIdleTimeoutMs: 500 });
  const t0 = Date.now();
  const stalled = partialPost(port, 10_000, 100);
  const r = await stalled.answered;
  assert.equal(r.status, 408);
  assert.match(r.body.error, /request body stalled: nothing received for 500 ms/);
  assert.ok(Date.now() - t0 < 5000, `cut after ${Date.now() - t0} ms`);
  const t1 = Date.now();
  while (!stalled.closed() && Date.now() - t1 < 5000) await new Promise((res) => setTimeout(res, 20));
  assert.ok(stalled.closed(), 'the connection is closed after the answer');
  // a body that keeps sending, slowly, is not cut
  const slow = partialPost(port, 10_000, 100);
  for (let k = 0; k < 6; k++) {
    await new Promise((res) => setTimeout(res, 200));
    slow.more(100);
  }
  slow.finish();
  assert.equal((await slow.answered).status, 200);
  assert.equal((await fetch(`${url}/ping`)).status, 200);
});

/** A native /v1/run call from a connection bound to `from` (a loopback address of its own: another client). */
async function runFrom(
  url: string,
  from: string,
  key: string,
  body: Record<string, unknown>,
): Promise<RunResult> {
  const u = new URL(`${url}/v1/run`);
  const req = request({
    host: u.hostname,
    port: u.port,
    path: u.pathname,
    method: 'POST',
    localAddress: from,
    headers: { 'content-type': 'application/json', 'x-rstar2-session-key': key },
  });
  req.end(JSON.stringify(body));
  const [res] = (await once(req, 'response')) as [IncomingMessage];
  return (await readAnswer(res)).body as RunResult;
}

test('one client (peer address) holds at most maxSessionsPerClient live sessions, whatever keys it sends; another keeps its own', async () => {
  const runner = new SessionRunner();
  const { url } = await start({ runner: runner as unknown as FakeRunner, maxSessionsPerClient: 2 });
  const keys = ['a'.repeat(16), 'b'.repeat(16), 'c'.repeat(16), 'd'.repeat(16)];
  // client A (127.0.0.2) sends a fresh session key with each session: its keys do not make it more clients
  const a = (k: number, code: string, session: string) =>
    runFrom(url, '127.0.0.2', keys[k], { code, session });
  const b = (code: string, session: string) => runFrom(url, '127.0.0.3', 'e'.repeat(16), { code, session });
  assert.equal((await a(0, 'set 1', 's1')).status, 'ok');
  assert.equal((await a(1, 'set 2', 's2')).status, 'ok');
  for (const k of [2, 3]) {
    const more = await a(k, 'set 3', 's3');
    assert.equal(more.status, 'busy');
    assert.match(
      more.error ?? '',
      /session limit per client reached: this client \(127\.0\.0\.2\) holds 2 live sessions, whatever its session keys \(limit 2/,
    );
  }
  assert.equal(runner.state.size, 2, 'the third never reached the runner');
  // a call in a session the client already holds still runs
  assert.equal((await a(0, 'again', 's1')).status, 'ok');
  // another client is not refused for the first one's sessions
  assert.equal((await b('b', 's1')).status, 'ok');
  assert.equal((await b('b', 's2')).status, 'ok');
  // closing one frees its place
  const u = new URL(`${url}/v1/session/close`);
  const close = request({
    host: u.hostname,
    port: u.port,
    path: u.pathname,
    method: 'POST',
    localAddress: '127.0.0.2',
    headers: { 'content-type': 'application/json', 'x-rstar2-session-key': keys[0] },
  });
  close.end(JSON.stringify({ session: 's1' }));
  const [closed] = (await once(close, 'response')) as [IncomingMessage];
  assert.equal((await readAnswer(closed)).body.closed, true);
  assert.equal((await a(2, '3', 's3')).status, 'ok');
  // stateless calls are never counted
  assert.equal((await runFrom(url, '127.0.0.2', keys[3], { code: 'plain' })).status, 'ok');
});

test('sessions expire from their client after sessionTtlMs idle, as the runner expires them', async () => {
  const runner = new SessionRunner();
  const { url } = await start({
    runner: runner as unknown as FakeRunner,
    maxSessionsPerClient: 1,
    sessionTtlMs: 200,
  });
  const a = new SandboxClient({ url });
  assert.equal((await a.run({ code: '1', session: 'old' })).status, 'ok');
  assert.equal((await a.run({ code: '2', session: 'new' })).status, 'busy');
  await new Promise((r) => setTimeout(r, 300));
  assert.equal((await a.run({ code: '2', session: 'new' })).status, 'ok');
});
