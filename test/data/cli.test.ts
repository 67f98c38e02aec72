import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import type { Trajectory } from '../../src/rl/trajectory.js';
import { readJsonl } from '../../src/util/jsonl.js';

const FIX = 'data/samples';
const cli = (...args: string[]) =>
  spawnSync(process.execPath, ['bin/rstar2.js', ...args], {
    encoding: 'utf8',
    env: { ...process.env, RSTAR2_NO_PROGRESS: '1' },
    timeout: 120_000,
  });

test('rstar2 data inspect: layout, counts and mapped rows of a Parquet file and a glob', () => {
  const r = cli('data', 'inspect', `${FIX}/verl-arith.parquet`, '--json', '--show', '2');
  assert.equal(r.status, 0, r.stderr);
  const rep = JSON.parse(r.stdout);
  assert.deepEqual(rep.layouts, { verl: 30 });
  assert.equal(rep.rows, 30);
  assert.equal(rep.withAnswer, 30);
  assert.equal(rep.integerAnswers, 30);
  assert.equal(rep.duplicateQuestions, 0);
  assert.equal(rep.first.length, 2);
  assert.equal(rep.first[0].answer, '130');

  const g = cli('data', 'inspect', `${FIX}/{verl,dapo}-arith.*`, '--limit', '40');
  assert.equal(g.status, 0, g.stderr);
  // files in sorted order: the 30 DAPO rows, then 10 of the verl file
  assert.match(g.stdout, /layout: dapo \(30 rows\), verl \(10 rows\)/);
  assert.match(g.stdout, /rows: 40 {2}with answer: 40 {2}integer answers: 40 {2}duplicate questions: 0/);
  assert.match(g.stdout, /question: A school has 916 students and 640 of them go on a trip\./);

  const sft = cli('data', 'inspect', `${FIX}/sft-arith-tools.jsonl`, '--sft', '--json', '--show', '1');
  assert.equal(sft.status, 0, sft.stderr);
  const s = JSON.parse(sft.stdout);
  assert.equal(s.examples, 30);
  assert.equal(s.toolTurns, 33);
  assert.equal(s.withToolCalls, 27);
});

test('rstar2 data inspect: --map, --layout and clear failures', () => {
  const d = mkdtempSync(join(tmpdir(), 'rstar2-data-cli-'));
  const f = join(d, 'odd.jsonl');
  writeFileSync(f, `${JSON.stringify({ q: 'What is 3*3?', extra: { gt: 9 } })}\n`);
  const bad = cli('data', 'inspect', f);
  assert.equal(bad.status, 1);
  assert.match(bad.stderr, /odd\.jsonl:1: unknown layout; fields seen: q, extra; tried verl/);
  const ok = cli('data', 'inspect', f, '--map', 'question=q,answer=extra.gt', '--json');
  assert.equal(ok.status, 0, ok.stderr);
  assert.equal(JSON.parse(ok.stdout).first[0].answer, '9');
  const layout = cli('data', 'inspect', f, '--layout', 'sharegpt');
  assert.match(layout.stderr, /--layout must be auto or one of verl, dapo, plain/);
  const help = cli('data', 'inspect', '--help');
  assert.match(help.stdout, /verl: prompt chat list \+\s+reward_model\.ground_truth/);
  assert.match(help.stdout, /--map <fields>/);
});

test('rstar2 rollout reads a verl Parquet file', { timeout: 120_000 }, () => {
  const out = join(mkdtempSync(join(tmpdir(), 'rstar2-data-roll-')), 't.jsonl');
  const r = cli(
    'rollout',
    '--engines',
    'fake',
    '--data',
    `${FIX}/verl-arith.parquet`,
    '--limit',
    '2',
    '--samples',
    '1',
    '--out',
    out,
  );
  assert.equal(r.status, 0, r.stderr);
  const ts = readJsonl<Trajectory>(out);
  assert.deepEqual(ts.map((t) => [t.promptId, t.gold]).sort(), [
    ['0', '130'],
    ['1', '198'],
  ]);
});
