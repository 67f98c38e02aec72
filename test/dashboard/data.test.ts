import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { request } from 'node:http';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { evalData, runStatus, scanDirs } from '../../src/dashboard/data.js';
import { startDashboard } from '../../src/dashboard/server.js';
import { viewTrajectory } from '../../src/dashboard/turns.js';
import { fakeTrajectory } from '../../src/eval/fake.js';
import { pidNamespace } from '../../src/util/lock.js';
import { makeEval, makeRun } from './fixture.js';

test('viewTrajectory splits turns into reasoning, tool call, tool result and answer', () => {
  const t = fakeTrajectory({ problemId: 'p', answer: '42', sample: 0, seed: 3 }, 1);
  const v = viewTrajectory({ ...t, correct: true, verify: { extracted: '42', matchedBy: 'integer' } });
  assert.equal(v.turns.length, 2);
  assert.equal(v.turns[0].reasoning, 'Let me check the arithmetic with the tool.');
  assert.equal(v.turns[0].toolCalls[0].code, t.numToolErrors ? 'print(x)' : 'print(6 * 7)');
  assert.equal(v.turns[0].toolResults[0].tokens, 30);
  assert.match(v.turns[1].reasoning, /^The tool/);
  assert.doesNotMatch(v.turns[1].reasoning, /boxed|<answer>/);
  assert.equal(v.answer, 'The answer is \\boxed{42}.');
  assert.equal(v.maskedTokens, 30);
  assert.equal(v.trainedTokens + v.maskedTokens, t.responseIds.length);
  assert.deepEqual(
    v.maskRuns.map((r) => r[0]),
    [1, 0, 1],
  );
  // text that does not contain the observation (another template): everything shown, nothing lost
  const odd = viewTrajectory({ ...t, text: 'plain text \\boxed{7}' });
  assert.equal(odd.turns[0].reasoning, 'plain text \\boxed{7}');
  assert.equal(odd.answer, 'plain text \\boxed{7}');
});

test('dashboard API finds runs and evals and refuses unknown names and filters', {
  timeout: 30_000,
}, async () => {
  const root = mkdtempSync(join(tmpdir(), 'rstar2-dash-api-'));
  makeRun(join(root, 'runs', 'r1'), 5);
  await makeEval(join(root, 'evals', 'e1'), 0.5, 'fake:0.5');
  assert.deepEqual(
    scanDirs(root)
      .map((e) => `${e.kind}:${e.name}`)
      .sort(),
    ['eval:evals/e1', 'run:runs/r1'],
  );
  assert.throws(() => scanDirs(join(root, 'missing')), /not a directory/);
  const d = await startDashboard({ root, port: 0 });
  try {
    const get = async (p: string) => {
      const r = await fetch(new URL(p, d.url));
      return { status: r.status, body: await r.text() };
    };
    const run = JSON.parse((await get('/api/run?name=runs/r1')).body);
    assert.equal(run.metrics.length, 5);
    assert.deepEqual(run.trajectoryFiles, [
      'trajectories/rl-step-000010.jsonl',
      'trajectories/rl-step-000020.jsonl',
    ]);
    const ev = JSON.parse((await get('/api/eval?name=evals/e1')).body);
    assert.equal(ev.report.samples, 20);
    const list = JSON.parse(
      (
        await get(
          '/api/trajectories?name=runs/r1&kind=run&file=trajectories/rl-step-000010.jsonl&filter=correct',
        )
      ).body,
    );
    assert.equal(list.total, list.counts.correct);
    assert.equal(list.counts.correct + list.counts.incorrect, list.counts.all);
    assert.ok(list.items.every((t: { correct: boolean }) => t.correct));
    assert.equal((await get('/api/run?name=../../etc')).status, 404);
    assert.equal((await get('/api/trajectories?name=runs/r1&kind=run&file=../config.json')).status, 404);
    assert.equal(
      (
        await get(
          '/api/trajectories?name=runs/r1&kind=run&file=trajectories/rl-step-000010.jsonl&filter=bogus',
        )
      ).status,
      400,
    );
    const html = await get('/');
    assert.match(html.body, /<script src="\/static\/app\.js">/);
    assert.equal((await get('/static/app.js')).status, 200);
  } finally {
    await d.close();
  }
});

test('an eval still running (no report.json yet) is scored from its trajectories', {
  timeout: 30_000,
}, async () => {
  const root = mkdtempSync(join(tmpdir(), 'rstar2-dash-live-'));
  const ev = join(root, 'e');
  await makeEval(ev, 1, 'fake:1');
  rmSync(join(ev, 'report.json'));
  const entry = scanDirs(root)[0];
  assert.equal(entry.kind, 'eval');
  const d = evalData(entry) as { report: { samples: number; avgAtK: number; complete: boolean } };
  assert.equal(d.report.samples, 20);
  assert.equal(d.report.avgAtK, 1);
});

test('the run list marks a run stalled or stopped from its heartbeat.json', { timeout: 30_000 }, async () => {
  const root = mkdtempSync(join(tmpdir(), 'rstar2-dash-beat-'));
  const now = Date.now();
  const ago = (min: number) => new Date(now - min * 60_000).toISOString();
  const gone = spawnSync('true').pid as number; // exited: its pid names no process
  const beat = (o: Record<string, unknown>) => ({
    pid: process.pid,
    host: hostname(),
    ns: pidNamespace(),
    stage: 'rl',
    step: 3,
    phase: 'rollout',
    time: ago(0.5),
    progress: ago(2),
    stallMinutes: 30,
    ...o,
  });
  const runs: Record<string, Record<string, unknown> | null> = {
    live: beat({}),
    quiet: beat({ time: ago(31) }), // the process hangs (or is on another machine and gone)
    stuck: beat({ progress: ago(45), phase: 'reward' }), // heartbeats, but no step finishes
    killed: beat({ pid: gone }), // kill -9: a live phase and no process
    elsewhere: beat({ pid: gone, host: 'another-host' }), // its pid cannot be checked from here
    finished: beat({ phase: 'done', pid: gone }),
    old: null, // made before heartbeat.json
  };
  for (const [name, hb] of Object.entries(runs)) {
    makeRun(join(root, name), 2);
    if (hb) writeFileSync(join(root, name, 'heartbeat.json'), JSON.stringify(hb));
  }
  const got = Object.fromEntries(Object.keys(runs).map((n) => [n, runStatus(join(root, n), now)]));
  assert.deepEqual(got, {
    live: { status: 'running', note: 'running: rollout' },
    quiet: { status: 'stalled', note: 'stalled: no heartbeat for 31 min' },
    stuck: { status: 'stalled', note: 'stalled: no step for 45 min (reward)' },
    killed: { status: 'stopped', note: `stopped: process ${gone} is gone` },
    elsewhere: { status: 'running', note: 'running: rollout' },
    finished: { status: 'done', note: 'done' },
    old: null,
  });
  const d = await startDashboard({ root, port: 0 });
  try {
    const list = (await (await fetch(new URL('/api/list', d.url))).json()) as {
      entries: { name: string; sub: string; status?: string }[];
    };
    const by = Object.fromEntries(list.entries.map((e) => [e.name, e]));
    assert.deepEqual(by.stuck, {
      kind: 'run',
      name: 'stuck',
      sub: '2 steps · stalled: no step for 45 min (reward)',
      status: 'stalled',
    });
    assert.equal(by.killed.status, 'stopped');
    assert.equal(by.finished.sub, '2 steps');
    assert.equal(by.old.status, undefined);
  } finally {
    await d.close();
  }
});

test('dashboard guard: foreign Origin 403, foreign Host 421, token required (header or ?token=) but for static files', {
  timeout: 30_000,
}, async () => {
  const root = mkdtempSync(join(tmpdir(), 'rstar2-dash-guard-'));
  makeRun(join(root, 'runs', 'r1'), 2);
  await assert.rejects(
    startDashboard({ root, port: 0, host: '0.0.0.0' }),
    /refusing to serve the dashboard on --host 0\.0\.0\.0: it is not a loopback address/,
  );
  const token = 'dash-token-0123456789';
  const d = await startDashboard({ root, port: 0, token });
  try {
    const u = new URL(d.url);
    assert.equal(u.searchParams.get('token'), token, 'the printed URL carries the token');
    const get = (path: string, headers: Record<string, string> = {}) =>
      new Promise<{ status: number; body: string }>((resolve, reject) => {
        const req = request({ host: '127.0.0.1', port: u.port, path, headers, agent: false }, async (res) => {
          let body = '';
          for await (const c of res) body += c;
          resolve({ status: res.statusCode ?? 0, body });
        });
        req.on('error', reject);
        req.end();
      });
    const q = `token=${token}`;
    const none = await get('/api/list');
    assert.equal(none.status, 401);
    assert.match(JSON.parse(none.body).message, /needs its token/);
    assert.equal((await get('/')).status, 401);
    assert.equal((await get('/api/list?token=wrong-token-wrong')).status, 401);
    assert.equal((await get(`/api/list?${q}`)).status, 200);
    // request targets Node's URL parser reads as an authority: answered, never a crash
    assert.equal((await get(`/\\?${q}`)).status, 404);
    assert.equal((await get(`//evil.example/api/list?${q}`)).status, 404);
    assert.equal((await get('/api/list', { authorization: `Bearer ${token}` })).status, 200);
    const page = await get(`/?${q}`);
    assert.equal(page.status, 200);
    assert.match(page.body, /<script src="\/static\/app\.js">/);
    assert.equal((await get('/static/app.js')).status, 200);
    assert.equal((await get('/static/uPlot.iife.min.js')).status, 200);
    assert.equal((await get('/static/uPlot.min.css', { origin: 'http://evil.example' })).status, 403);
    const origin = await get(`/api/run?name=runs/r1&${q}`, { origin: 'http://evil.example' });
    assert.equal(origin.status, 403);
    assert.equal(JSON.parse(origin.body).error, 'bad_origin');
    const host = await get(`/api/run?name=runs/r1&${q}`, { host: 'evil.example' });
    assert.equal(host.status, 421);
    assert.match(JSON.parse(host.body).message, /DNS rebinding/);
    assert.equal((await get(`/api/list?${q}`, { host: `localhost:${u.port}` })).status, 200);
  } finally {
    await d.close();
  }
  // without a token, Host and Origin are still checked
  const open = await startDashboard({ root, port: 0 });
  try {
    const r = await fetch(new URL('/api/list', open.url), { headers: { origin: 'http://evil.example' } });
    assert.equal(r.status, 403);
    assert.equal((await fetch(new URL('/api/list', open.url))).status, 200);
  } finally {
    await open.close();
  }
});
