// The sandbox service against web pages and hostile clients: cross-site requests, DNS rebinding,
// the token, per-client sessions, request bodies in flight and slow bodies.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { type IncomingMessage, request } from 'node:http';
import { after, test } from 'node:test';
import { SandboxClient } from '../../src/sandbox/client.js';
import { SandboxServer, type SandboxServerOptions } from '../../src/sandbox/server.js';
import type { RunResult } from '../../src/sandbox/types.js';
import { FakeRunner, okResult, SessionRunner } from './helpers.js';

const TOKEN = 'test-token-0123456789abcdef';
const servers: SandboxServer[] = [];
after(async () => {
  for (const s of servers) await s.close();
});

async function start(opts: Partial<SandboxServerOptions> = {}) {
  const runner = (opts.runner as FakeRunner | undefined) ?? new FakeRunner();
  const s = new SandboxServer({ port: 0, log: () => {}, ...opts, runner });
  servers.push(s);
  const { port, url } = await s.listen();
  return { s, port, url, runner };
}

interface Raw {
  method?: string;
  path: string;
  headers?: Record<string, string | number>;
  body?: string;
}

/** One request with exactly the headers given (fetch would not let a test set Host). */
function raw(port: number, o: Raw): Promise<{ status: number; body: any }> {
  return new Promise<{ status: number; body: any }>((resolve, reject) => {
    const req = request(
      { host: '127.0.0.1', port, method: o.method ?? 'POST', path: o.path, headers: o.headers, agent: false },
      (res) => resolve(readAnswer(res)),
    );
    req.on('error', reject);
    req.end(o.body);
  });
}

async function readAnswer(res: IncomingMessage): Promise<{ status: number; body: any }> {
  let text = '';
  for await (const c of res) text += c;
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {}
  return { status: res.statusCode ?? 0, body };
}

const runBody = JSON.stringify({ type: 'python', solution: 'print("pwned")' });

test('a cross-site POST (foreign Origin, text/plain) is refused with 403 and its code never runs', async () => {
  const { port, runner } = await start();
  const r = await raw(port, {
    path: '/run',
    headers: { 'content-type': 'text/plain', origin: 'http://evil.example' },
    body: runBody,
  });
  assert.equal(r.status, 403);
  assert.equal(r.body.error, 'bad_origin');
  assert.match(r.body.message, /Origin 'http:\/\/evil\.example' is not this server's/);
  const nullOrigin = await raw(port, { path: '/run', headers: { origin: 'null' }, body: runBody });
  assert.equal(nullOrigin.status, 403);
  assert.equal(runner.seen.length, 0, 'the code must not have run');
  // the server's own origin (a page it served, or a same-origin tool) is not refused
  const same = await raw(port, {
    path: '/run',
    headers: { origin: `http://127.0.0.1:${port}` },
    body: runBody,
  });
  assert.equal(same.status, 200);
  assert.equal(runner.seen.length, 1);
});

test('a foreign Host (DNS rebinding) is refused with 421 on every route; loopback names pass', async () => {
  const { port, runner } = await start();
  for (const path of ['/run', '/status', '/ping']) {
    const r = await raw(port, {
      method: path === '/run' ? 'POST' : 'GET',
      path,
      headers: { host: `evil.example:${port}` },
      ...(path === '/run' ? { body: runBody } : {}),
    });
    assert.equal(r.status, 421, path);
    assert.equal(r.body.error, 'bad_host');
    assert.match(r.body.message, /Host 'evil\.example:\d+' is not this server.*DNS rebinding/);
  }
  assert.equal(runner.seen.length, 0);
  for (const host of [`localhost:${port}`, `127.0.0.1:${port}`, `[::1]:${port}`]) {
    const ok = await raw(port, { method: 'GET', path: '/status', headers: { host } });
    assert.equal(ok.status, 200, host);
  }
});

test('token: required on every route but /ping, accepted from the option and RSTAR2_TOKEN, wrong refused', async () => {
  const { port, url, runner } = await start({ token: TOKEN });
  const none = await raw(port, { path: '/v1/run', body: JSON.stringify({ code: 'x' }) });
  assert.equal(none.status, 401);
  assert.match(none.body.message, /needs its token: send 'Authorization: Bearer <token>'/);
  const wrong = await raw(port, {
    path: '/v1/run',
    headers: { authorization: 'Bearer not-the-token-at-all' },
    body: JSON.stringify({ code: 'x' }),
  });
  assert.equal(wrong.status, 401);
  assert.equal(wrong.body.message, 'wrong token');
  assert.equal((await raw(port, { method: 'GET', path: '/status' })).status, 401);
  assert.equal((await raw(port, { method: 'GET', path: '/metrics' })).status, 401);
  assert.equal(runner.seen.length, 0);
  const ping = await raw(port, { method: 'GET', path: '/ping' });
  assert.deepEqual([ping.status, ping.body], [200, 'pong']);
  const right = await raw(port, {
    path: '/v1/run',
    headers: { authorization: `Bearer ${TOKEN}` },
    body: JSON.stringify({ code: 'x' }),
  });
  assert.equal(right.status, 200);
  assert.equal(right.body.stdout, 'ran:x\n');
  // Basic credentials carry the token as the password: what requests/aiohttp send for http://:TOKEN@host
  const basic = (pair: string) => ({ authorization: `Basic ${Buffer.from(pair).toString('base64')}` });
  const viaUrl = await raw(port, {
    path: '/v1/run',
    headers: basic(`:${TOKEN}`),
    body: JSON.stringify({ code: 'b' }),
  });
  assert.equal(viaUrl.status, 200);
  assert.equal(viaUrl.body.stdout, 'ran:b\n');
  for (const bad of [':not-the-token-at-all', TOKEN, `${TOKEN}:`]) {
    const r = await raw(port, { path: '/v1/run', headers: basic(bad), body: JSON.stringify({ code: 'x' }) });
    assert.equal(r.status, 401, bad);
  }
  // a foreign Host is still refused on a loopback bind, token or not
  const rebound = await raw(port, {
    method: 'GET',
    path: '/status',
    headers: { host: 'evil.example', authorization: `Bearer ${TOKEN}` },
  });
  assert.equal(rebound.status, 421);

  assert.equal((await new SandboxClient({ url, token: TOKEN }).run({ code: 'y' })).stdout, 'ran:y\n');
  const refused = await new SandboxClient({ url, token: 'wrong-token-wrong-token' }).run({ code: 'z' });
  assert.equal(refused.status, 'invalid_input');
  assert.match(refused.error ?? '', /\(401\).*wrong token/);
  const saved = process.env.RSTAR2_TOKEN;
  process.env.RSTAR2_TOKEN = TOKEN;
  try {
    assert.equal((await new SandboxClient({ url }).run({ code: 'w' })).stdout, 'ran:w\n');
  } finally {
    if (saved === undefined) delete process.env.RSTAR2_TOKEN;
    else process.env.RSTAR2_TOKEN = saved;
  }
  assert.deepEqual(
    runner.seen.map((r) => r.code),
    ['x', 'b', 'y', 'w'],
  );
});

test('a non-loopback --host is refused at startup without a token (library and CLI)', () => {
  const runner = new FakeRunner();
  assert.throws(
    () => new SandboxServer({ runner, host: '0.0.0.0' }),
    /refusing to serve the sandbox service on --host 0\.0\.0\.0: it is not a loopback address.*Set a token/,
  );
  assert.throws(() => new SandboxServer({ runner, host: '0.0.0.0', token: 'short' }), /at least 16/);
  assert.doesNotThrow(() => new SandboxServer({ runner, host: '0.0.0.0', token: TOKEN }));
  assert.doesNotThrow(() => new SandboxServer({ runner, host: '::1' }));
  const env = { ...process.env };
  delete env.RSTAR2_TOKEN;
  const cli = spawnSync(
    process.execPath,
    ['bin/rstar2.js', 'sandbox', 'serve', '--host', '0.0.0.0', '--port', '0', '--workers', '1'],
    { encoding: 'utf8', env, timeout: 60_000 },
  );
  assert.equal(cli.status, 1, cli.stderr);
  assert.match(cli.stderr, /refusing to serve the sandbox service on --host 0\.0\.0\.0/);
});

/** Sessions as a dict per session name: enough to see whose state a call reaches. */

test('sessions are private to each client: the same id from another client is another session', async () => {
  const runner = new SessionRunner();
  const { url, port } = await start({ runner: runner as unknown as FakeRunner });
  const a = new SandboxClient({ url });
  const b = new SandboxClient({ url });
  assert.equal((await a.run({ code: 'set secret-of-a', session: 'shared' })).stdout, 'secret-of-a\n');
  assert.equal((await b.run({ code: 'get', session: 'shared' })).stdout, '(none)\n');
  assert.equal((await a.run({ code: 'get', session: 'shared' })).stdout, 'secret-of-a\n');
  // B cannot close A's session either
  assert.equal(await b.closeSession('shared'), false);
  assert.equal((await a.run({ code: 'get', session: 'shared' })).stdout, 'secret-of-a\n');
  // errors name the client's own id, not the runner's name for it
  const lost = await a.run({ code: 'lose', session: 'shared' });
  assert.equal(lost.error, 'session shared lost: test');
  assert.equal(await a.closeSession('shared'), true);
  // clients that share a session key share sessions, on purpose
  const key = 'team-key-0123456789';
  await new SandboxClient({ url, sessionKey: key }).run({ code: 'set team', session: 's' });
  assert.equal(
    (await new SandboxClient({ url, sessionKey: key }).run({ code: 'get', session: 's' })).stdout,
    'team\n',
  );
  // a raw request without a session key is refused, not put in a shared namespace
  const nokey = await raw(port, {
    path: '/v1/run',
    body: JSON.stringify({ code: 'get', session: 'shared' }),
  });
  assert.equal(nokey.status, 400);
  assert.match(nokey.body.error, /stateful sessions need an x-rstar2-session-key header/);
  assert.ok(![...runner.state.keys()].includes('shared'), 'the runner never sees a bare client id');
});

/** Starts a POST whose body is only partly sent; resolves `answered` if the server answers early. */
function partialPost(port: number, path: string, total: number, first: number, chunked = false) {
  const req = request({
    host: '127.0.0.1',
    port,
    method: 'POST',
    path,
    agent: false,
    headers: chunked ? { 'transfer-encoding': 'chunked' } : { 'content-length': total },
  });
  const answered = new Promise<{ status: number; body: any }>((resolve, reject) => {
    req.on('response', (res) => resolve(readAnswer(res)));
    req.on('error', reject);
  });
  answered.catch(() => {});
  const body = Buffer.from(JSON.stringify({ code: 'x'.repeat(total - 11) }));
  assert.equal(body.length, total);
  req.write(body.subarray(0, first));
  return {
    answered,
    finish: () => req.end(body.subarray(first)),
    abort: () => req.destroy(),
  };
}

test('request bodies in flight are capped by the bytes received: the body holding the most gets 503, /ping still answers', {
  timeout: 30_000,
}, async () => {
  const { port, url, runner } = await start({ maxBodyBytes: 1_000_000, maxBodyBytesInFlight: 2_000_000 });
  // four bodies send 600 KB of 900 KB each: 2.4 MB would be held, so one of the first three (which hold the
  // most when the fourth's bytes stop fitting) is refused, and the fourth goes on (issue 42: not the newcomer)
  const posts = [];
  for (let i = 0; i < 4; i++) {
    posts.push(partialPost(port, '/v1/run', 900_000, 600_000));
    await new Promise((r) => setTimeout(r, 150));
  }
  const early: ({ status: number; body: any } | null)[] = posts.map(() => null);
  posts.forEach((p, i) => {
    p.answered.then(
      (r) => {
        early[i] = r;
      },
      () => {}, // aborted below
    );
  });
  const t1 = Date.now();
  while (early.filter(Boolean).length < 1 && Date.now() - t1 < 10_000)
    await new Promise((r) => setTimeout(r, 20));
  await new Promise((r) => setTimeout(r, 300)); // time for a wrong second refusal to show
  const refused = early.filter((r) => r !== null);
  assert.equal(refused.length, 1, JSON.stringify(early));
  assert.equal(early[3], null, 'the newest body, holding the least, is not the one refused');
  assert.equal(refused[0]?.status, 503);
  assert.match(refused[0]?.body.error, /busy: \d+ bytes of request bodies are being received, limit 2000000/);
  // the service stays responsive while three bodies are held open
  const t0 = Date.now();
  const ping = await fetch(`${url}/ping`);
  assert.equal(ping.status, 200);
  assert.ok(Date.now() - t0 < 3000, `ping took ${Date.now() - t0} ms`);
  assert.equal((await fetch(`${url}/status`)).status, 200);
  // a body over the per-request limit is refused from its content-length, before it is read
  const big = partialPost(port, '/v1/run', 1_200_000, 10);
  assert.equal((await big.answered).status, 413);
  // two of the three left complete (900 KB each fits beside the other) and give their bytes back
  const admitted = posts.filter((_, i) => early[i] === null).slice(1);
  for (const p of posts) if (!admitted.includes(p)) p.abort();
  await new Promise((r) => setTimeout(r, 200));
  for (const p of admitted) p.finish();
  for (const p of admitted) assert.equal((await p.answered).status, 200);
  assert.equal(runner.seen.length, 2);
  // a chunked body past the per-request limit
  const chunked = partialPost(port, '/v1/run', 1_200_000, 1_100_000, true);
  const c = await chunked.answered;
  assert.equal(c.status, 413);
  assert.match(c.body.error, /over the 1000000-byte limit per request/);
  chunked.abort();
  big.abort();
});

test('a body that stalls is cut at requestTimeoutMs; a slow answer to a complete request is not', {
  timeout: 30_000,
}, async () => {
  const runner = new FakeRunner(async (req) => {
    await new Promise((r) => setTimeout(r, 1500));
    return okResult(req);
  });
  const { port, url } = await start({ runner, requestTimeoutMs: 400 });
  const t0 = Date.now();
  const stalled = partialPost(port, '/v1/run', 1000, 100);
  const r = await Promise.race([
    stalled.answered.catch((e: Error) => ({ status: -1, body: e.message })),
    new Promise<null>((res) => setTimeout(() => res(null), 10_000)),
  ]);
  assert.ok(r !== null, 'the stalled request was never cut');
  assert.equal(r.status, 408);
  assert.ok(Date.now() - t0 < 5000, `cut after ${Date.now() - t0} ms`);
  stalled.abort();
  const slow = await fetch(`${url}/v1/run`, { method: 'POST', body: JSON.stringify({ code: 'slow' }) });
  assert.equal(slow.status, 200);
  assert.equal(((await slow.json()) as RunResult).stdout, 'ran:slow\n');
});
