import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';

const BIN = new URL('../../bin/rstar2.js', import.meta.url).pathname;

function run(args: string[]) {
  return spawnSync(process.execPath, [BIN, ...args], {
    encoding: 'utf8',
    env: { ...process.env, RSTAR2_NO_PROGRESS: '1' },
  });
}

test('rstar2 verify writes each line back with correct and reason', { timeout: 60_000 }, () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-verify-'));
  const file = join(dir, 'in.jsonl');
  writeFileSync(
    file,
    [
      { id: 'a', pred: 'so \\boxed{\\frac{1}{2}}', gold: '0.5' },
      { id: 'b', pred: 'Answer: 7', gold: '8' },
      { id: 'c', pred: '\\boxed{37.7}', gold: '12\\pi' },
    ]
      .map((x) => JSON.stringify(x))
      .join('\n'),
  );
  const strict = run(['verify', file]);
  assert.equal(strict.status, 0, strict.stderr);
  const rows = strict.stdout
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l));
  assert.deepEqual(
    rows.map((r) => [r.id, r.correct]),
    [
      ['a', true],
      ['b', false],
      ['c', false],
    ],
  );
  assert.equal(typeof rows[1].reason, 'string');
  assert.equal(rows[0].extracted, '\\frac{1}{2}');
  const lenient = run(['verify', file, '--verify-profile', 'lenient']);
  assert.equal(JSON.parse(lenient.stdout.trim().split('\n')[2]).correct, true);
  const ex = run(['verify', file, '--extract-only']);
  assert.deepEqual(
    ex.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l).extracted),
    ['\\frac{1}{2}', '7', '37.7'],
  );
});

test('rstar2 verify decides CAS-only answers in its worker threads', { timeout: 60_000 }, () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-verify-'));
  const file = join(dir, 'cas.jsonl');
  writeFileSync(
    file,
    [
      { pred: '\\sum_{k=1}^{10} k', gold: '55' },
      { pred: '\\lfloor 7/2 \\rfloor', gold: '3' },
      { pred: '\\sum_{k=1}^{10} k', gold: '56' },
    ]
      .map((x) => JSON.stringify(x))
      .join('\n'),
  );
  const r = run(['verify', file, '--no-extract', '--workers', '1']);
  assert.equal(r.status, 0, r.stderr);
  assert.doesNotMatch(r.stderr, /compute-engine/);
  const rows = r.stdout
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l));
  assert.deepEqual(
    rows.map((x) => [x.correct, x.reason]),
    [
      [true, 'equal by cas-numeric'],
      [true, 'equal by cas-numeric'],
      [false, 'not-equal (cas-numeric)'],
    ],
  );
});

test('rstar2 verify: bad input gets a clear error', { timeout: 60_000 }, () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-verify-'));
  const file = join(dir, 'bad.jsonl');
  writeFileSync(file, '{"pred": "1"}\n');
  const r = run(['verify', file]);
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /bad\.jsonl:1: missing "gold"/);
  const p = run(['verify', file, '--verify-profile', 'loose']);
  assert.match(
    p.stderr,
    /--verify-profile must be one of integer, strict, lenient, reference \(got "loose"\)/,
  );
  const m = run(['verify', join(dir, 'none.jsonl')]);
  assert.match(m.stderr, /file not found/);
});

test('rstar2 verify: errors name the file line past blank lines; an empty file writes nothing', {
  timeout: 60_000,
}, () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-verify-'));
  const file = join(dir, 'gaps.jsonl');
  writeFileSync(file, '\ufeff{"pred": "\\\\boxed{2}", "gold": "2"}\r\n\n\n{"pred": "\\\\boxed{2}"}\n');
  const r = run(['verify', file]);
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /gaps\.jsonl:4: missing "gold"/);
  const empty = join(dir, 'empty.jsonl');
  writeFileSync(empty, '');
  const e = run(['verify', empty]);
  assert.equal(e.status, 0, e.stderr);
  assert.equal(e.stdout, '');
  const d = run(['verify', dir]);
  assert.notEqual(d.status, 0);
  assert.match(d.stderr, /verify: .* is a directory, not a JSONL file/);
});
