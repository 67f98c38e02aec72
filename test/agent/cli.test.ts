import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { loadProblems } from '../../src/agent/problems.js';
import type { Trajectory } from '../../src/rl/trajectory.js';
import { readJsonl } from '../../src/util/jsonl.js';

const dir = mkdtempSync(join(tmpdir(), 'rstar2-rollout-'));
const data = join(dir, 'probs.jsonl');
writeFileSync(
  data,
  `${[
    { id: 'a', problem: 'What is 1+1?', answer: '2' },
    { id: 'b', problem: 'What is 2+0?', answer: 2 },
  ]
    .map((x) => JSON.stringify(x))
    .join('\n')}\n`,
);

function cli(args: string[], timeout = 120_000) {
  return spawnSync(process.execPath, ['bin/rstar2.js', 'rollout', ...args], {
    encoding: 'utf8',
    env: { ...process.env, RSTAR2_NO_PROGRESS: '1' },
    timeout,
  });
}

test('rstar2 rollout --engines fake runs the loop with the embedded sandbox and writes JSONL', {
  timeout: 120_000,
}, () => {
  const out = join(dir, 'traj.jsonl');
  const r = cli(['--engines', 'fake', '--data', data, '-n', '3', '--out', out]);
  assert.equal(r.status, 0, r.stderr);
  const ts = readJsonl<Trajectory>(out);
  assert.equal(ts.length, 6);
  for (const t of ts) {
    assert.equal(t.finish, 'answered', t.error);
    assert.equal(t.numToolCalls, 1);
    assert.equal(t.gold, '2');
    assert.match(t.text, /<tool_response>\nTool call success\nstdout: 2\n/);
    assert.equal(t.responseIds.length, t.responseMask.length);
  }
  assert.match(r.stdout, /"trajectories":6/);
});

test('rstar2 rollout: an existing --out is refused unless --resume, which keeps what it holds and samples the rest', {
  timeout: 180_000,
}, () => {
  const out = join(dir, 'resume.jsonl');
  const args = ['--engines', 'fake', '--data', data, '-n', '3', '--out', out];
  assert.equal(cli(args).status, 0);
  const lines = readFileSync(out, 'utf8').trimEnd().split('\n');
  assert.equal(lines.length, 6);

  const refused = cli(args);
  assert.notEqual(refused.status, 0);
  assert.match(refused.stderr, /already holds trajectories: --resume continues that rollout/);
  assert.equal(readFileSync(out, 'utf8').trimEnd().split('\n').length, 6, 'left as it was');

  // a run killed after three trajectories, one of them an engine error, mid-way through writing a fourth
  const failed = { ...JSON.parse(lines[2]), finish: 'error', error: 'engine down' };
  const kept = [lines[0], lines[1]];
  writeFileSync(out, `${[...kept, JSON.stringify(failed)].join('\n')}\n${lines[3].slice(0, 40)}`);
  const r = cli([...args, '--resume']);
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /"trajectories":4,"resumed":2/);
  const after = readFileSync(out, 'utf8').trimEnd().split('\n');
  assert.deepEqual(after.slice(0, 2), kept, 'saved trajectories kept byte for byte');
  const ts = after.map((l) => JSON.parse(l) as Trajectory);
  assert.deepEqual(ts.map((t) => t.id).sort(), ['a#0', 'a#1', 'a#2', 'b#0', 'b#1', 'b#2']);
  assert.ok(ts.every((t) => t.finish === 'answered'));

  // another rollout's file (more samples per problem than this one) is refused, not rewritten
  const before = readFileSync(out, 'utf8');
  const other = cli(['--engines', 'fake', '--data', data, '-n', '2', '--out', out, '--resume']);
  assert.notEqual(other.status, 0);
  assert.match(
    other.stderr,
    /record \d \(trajectory '[ab]#2'\) is not one of this rollout's \(2 problems × 2 samples\)/,
  );
  assert.equal(readFileSync(out, 'utf8'), before);
  // so is one of other problems under the same ids (rows without ids are numbered by line)
  const data2 = join(dir, 'probs2.jsonl');
  writeFileSync(data2, readFileSync(data, 'utf8').replace('"answer":"2"', '"answer":"3"'));
  const moved = cli(['--engines', 'fake', '--data', data2, '-n', '3', '--out', out, '--resume']);
  assert.match(moved.stderr, /trajectory 'a#\d'\) is not one of this rollout's/);
  assert.equal(readFileSync(out, 'utf8'), before);

  // a finished file: nothing to sample, nothing started
  const whole = cli([...args, '--resume']);
  assert.equal(whole.status, 0, whole.stderr);
  assert.equal(whole.stdout.trim(), `{"trajectories":0,"resumed":6,"out":"${out}"}`, 'no engine was opened');
  assert.equal(readFileSync(out, 'utf8'), before);

  const folder = cli(['--engines', 'fake', '--data', data, '--out', dir]);
  assert.match(folder.stderr, /--out .* is not a file/);
});

// Every sample runs a sandbox call: a host where a process is dear (a PVM guest, ~90 calls/s) resumes ~25 a second
// under the suite's load, so the sample count and the time limits leave room for it.
test('rstar2 rollout: a running rollout holds its --out; after a kill -9 it resumes', {
  timeout: 360_000,
}, async () => {
  const out = join(dir, 'held.jsonl');
  const args = ['--engines', 'fake', '--data', data, '-n', '600', '--out', out];
  const first = spawn(process.execPath, ['bin/rstar2.js', 'rollout', ...args], {
    env: { ...process.env, RSTAR2_NO_PROGRESS: '1' },
    stdio: 'ignore',
  });
  const exited = new Promise((r) => first.on('exit', r));
  while (!existsSync(out) || readFileSync(out, 'utf8').split('\n').length < 20) await sleep(50);
  const second = cli([...args, '--resume']);
  assert.notEqual(second.status, 0);
  assert.match(second.stderr, new RegExp(`rollout --out ${out} is in use by process ${first.pid}`));
  first.kill('SIGKILL');
  await exited;
  const saved = readFileSync(out, 'utf8').split('\n').length - 1;
  const r = cli([...args, '--resume'], 300_000);
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, new RegExp(`"trajectories":${1200 - saved},"resumed":${saved}`));
  const ids = readFileSync(out, 'utf8')
    .trimEnd()
    .split('\n')
    .map((l) => (JSON.parse(l) as Trajectory).id);
  assert.equal(new Set(ids).size, 1200);
});

test('rstar2 rollout: --print-config and clear errors for bad input', () => {
  const pc = cli(['--engines', 'fake', '--data', data, '--out', 'x', '--print-config', '--samples', '4']);
  assert.equal(pc.status, 0, pc.stderr);
  const cfg = JSON.parse(pc.stdout);
  assert.equal(cfg.n, 4);
  assert.equal(cfg.policy, 'auto');
  assert.equal(cfg.maxTurns, 5);
  const bad = cli(['--engines', 'fake', '--data', data, '--out', 'x', '--policy', 'fastest']);
  assert.notEqual(bad.status, 0);
  assert.match(
    bad.stderr,
    /--policy must be one of auto, round-robin, least-requests, kv-budget, kv-predict/,
  );
  const n = cli(['--engines', 'fake', '--data', data, '--out', 'x', '--samples', 'lots']);
  assert.notEqual(n.status, 0);
  assert.match(
    n.stderr,
    /option '-n, --samples <n>' argument 'lots' is invalid\. Expected a positive integer\./,
  );
  const k0 = cli(['--engines', 'fake', '--data', data, '--out', 'x', '--top-k', '0']);
  assert.notEqual(k0.status, 0);
  assert.match(
    k0.stderr,
    /'--top-k <k>' argument '0' is invalid\. Expected -1 \(off\) or a positive integer\./,
  );
  const nomodel = cli(['--engines', 'http://127.0.0.1:1', '--data', data, '--out', 'x']);
  assert.match(nomodel.stderr, /prompts need a tokenizer: give --tokenizer PATH .* or --model DIR/);
});

test('loadProblems accepts the data/ format and names bad rows', () => {
  const ps = loadProblems(data);
  assert.deepEqual(ps[1], { id: 'b', question: 'What is 2+0?', gold: '2' });
  const bad = join(dir, 'bad.jsonl');
  writeFileSync(bad, '{"id": "x", "answer": "1"}\n');
  assert.throws(() => loadProblems(bad), /bad.jsonl:1: needs a non-empty string field 'problem'/);
  writeFileSync(bad, '{"id": "x", "problem": "p"}\n{"id": "x", "problem": "p"}\n');
  assert.equal(loadProblems(bad).length, 1, 'a repeated row is sampled once');
  writeFileSync(bad, '{"id": "x", "problem": "p"}\n{"id": "x", "problem": "q"}\n');
  assert.throws(() => loadProblems(bad), /duplicate problem id 'x'/);
  assert.throws(() => loadProblems(join(dir, 'missing.jsonl')), /no problems/);
});

test('rstar2 rollout: a --sandbox that is neither embedded nor a URL is refused before any sample', () => {
  const out = join(dir, 'nosandbox.jsonl');
  const r = cli(['--engines', 'fake', '--data', data, '-n', '1', '--out', out, '--sandbox', 'embeded']);
  assert.notEqual(r.status, 0);
  assert.match(
    r.stderr,
    /--sandbox must be 'embedded' or a sandbox service URL such as http:\/\/127\.0\.0\.1:8088, got 'embeded'/,
  );
  assert.equal(existsSync(out), false);
});
