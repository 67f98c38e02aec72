import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { parquetWriteFile } from 'hyparquet-writer';
import {
  DAPO_PREFIX,
  DAPO_SUFFIX,
  detectLayout,
  inspectProblems,
  loadProblems,
  loadProblemsSync,
  parseFieldMap,
} from '../../src/data/index.js';

const FIX = 'data/samples';
const tmp = () => mkdtempSync(join(tmpdir(), 'rstar2-data-'));
const jsonl = (rows: unknown[]) => rows.map((r) => JSON.stringify(r)).join('\n') + '\n';

function file(name: string, text: string): string {
  const f = join(tmp(), name);
  writeFileSync(f, text);
  return f;
}

const verlRow = (q: string, a: string | number, extra: Record<string, unknown> = {}) => ({
  data_source: 'openai/gsm8k',
  prompt: [{ role: 'user', content: q }],
  ability: 'math',
  reward_model: { style: 'rule', ground_truth: a },
  ...extra,
});

test('verl Parquet fixture: nested prompt list and structs, last user message, INT64 index as id', async () => {
  const ps = await loadProblems(`${FIX}/verl-arith.parquet`);
  assert.equal(ps.length, 30);
  // row 0 opens with a system message; the question is the user message after it
  assert.equal(
    ps[0].question,
    'Sam has 75 stickers, Lee has 38 and Mia has 17. How many stickers do they have together?',
  );
  assert.equal(ps[0].answer, '130');
  assert.equal(ps[0].id, '0');
  assert.equal(ps[0].source, 'rstar2/arith');
  assert.deepEqual(ps[0].meta, {
    ability: 'math',
    extra_info: { answer: '75+38+17 = 130\n#### 130', index: 0, question: ps[0].question, split: 'train' },
  });
  assert.deepEqual(
    ps.map((p) => p.id),
    ps.map((_, i) => String(i)),
  );
  // each gold answer is the arithmetic the row's own worked solution states
  const calc = (expr: string): number => {
    const [a, op, ...rest] = expr.split(/([+*-])/);
    if (op === undefined) return Number(a);
    const b = calc(rest.join(''));
    return op === '+' ? Number(a) + b : op === '-' ? Number(a) - b : Number(a) * b;
  };
  for (const p of ps) {
    const info = p.meta?.extra_info as { answer: string };
    const [expr, value] = info.answer.split('\n')[0].split(' = ');
    assert.equal(String(calc(expr)), value);
    assert.equal(value, p.answer);
  }
});

test('DAPO fixture: the instruction wrapper is stripped, uuid index is the id', async () => {
  const ps = await loadProblems(`${FIX}/dapo-arith.jsonl`);
  assert.equal(ps.length, 30);
  for (const p of ps) {
    assert.doesNotMatch(p.question, /Solve the following|Remember to put/);
    assert.match(p.question, /^[A-Z].*\?$/);
    assert.match(p.answer ?? '', /^\d+$/);
    assert.match(p.id, /^[0-9a-f]{8}-[0-9a-f]{4}-4/);
    assert.equal(p.source, 'math_dapo');
  }
  const r = await inspectProblems(`${FIX}/dapo-arith.jsonl`);
  assert.deepEqual(r.layouts, { dapo: 30 });
});

test('layouts are detected per row, so a file mixing verl and DAPO rows reads both', async () => {
  const f = file(
    'mixed.jsonl',
    jsonl([
      verlRow('What is 2+3?', '5'),
      verlRow(`${DAPO_PREFIX}What is 4+4?${DAPO_SUFFIX}`, '8', { data_source: 'math_dapo' }),
      { id: 7, problem: 'What is 1+1?', answer: 2, level: 1 },
    ]),
  );
  const r = await inspectProblems(f);
  assert.deepEqual(r.layouts, { verl: 1, dapo: 1, plain: 1 });
  const ps = await loadProblems(f);
  assert.deepEqual(
    ps.map((p) => [p.id, p.question, p.answer]),
    [
      ['p0', 'What is 2+3?', '5'],
      ['p1', 'What is 4+4?', '8'],
      ['7', 'What is 1+1?', '2'],
    ],
  );
  assert.deepEqual(ps[2].meta, { level: 1 });
  // a chosen layout is strict: DAPO refuses an unwrapped prompt, verl keeps the wrapper
  await assert.rejects(
    loadProblems(f, { layout: 'dapo' }),
    /mixed\.jsonl:1: field 'prompt'.*not wrapped in the DAPO-Math/,
  );
  const whole = await loadProblems(f, { layout: 'verl', limit: 2 });
  assert.equal(whole[1].question, `${DAPO_PREFIX}What is 4+4?${DAPO_SUFFIX}`);
});

test('plain rows: problem | question | prompt, answer | gold | solution, numbers become strings', () => {
  const f = file(
    'plain.jsonl',
    jsonl([
      { problem: 'a?', answer: 3 },
      { question: 'b?', gold: ' 4 ' },
      { prompt: 'c?', solution: '5' },
      { problem: 'd?' },
    ]),
  );
  assert.deepEqual(loadProblemsSync(f), [
    { id: 'p0', question: 'a?', answer: '3' },
    { id: 'p1', question: 'b?', answer: '4' },
    { id: 'p2', question: 'c?', answer: '5' },
    { id: 'p3', question: 'd?', answer: null },
  ]);
  assert.equal(detectLayout({ foo: 1 }), null);
});

test('key mapping reads dotted paths and overrides the layout, and rows left over go to meta', async () => {
  const f = file(
    'mapped.jsonl',
    jsonl([{ uid: 'u1', q: { text: 'What is 6*7?' }, extra: { gt: 42, note: 'x' }, origin: 'mine' }]),
  );
  const map = parseFieldMap('question=q.text, answer=extra.gt, id=uid, source=origin');
  assert.deepEqual(map, { question: 'q.text', answer: 'extra.gt', id: 'uid', source: 'origin' });
  const [p] = await loadProblems(f, { map, requireAnswer: true });
  assert.deepEqual(p, {
    id: 'u1',
    question: 'What is 6*7?',
    answer: '42',
    source: 'mine',
    meta: { q: { text: 'What is 6*7?' }, extra: { gt: 42, note: 'x' } },
  });
  // a mapped answer path on a verl row
  const v = file('v.jsonl', jsonl([verlRow('What is 9-4?', 'five', { extra_info: { num: 5 } })]));
  const [q] = await loadProblems(v, { map: parseFieldMap('answer=extra_info.num') });
  assert.equal(q.answer, '5');
  assert.throws(() => parseFieldMap('question'), /bad field map 'question': expected KEY=PATH/);
  assert.throws(() => parseFieldMap('gold=x'), /KEY one of id, question, answer, source/);
});

test('globs and directories read every matching file in sorted order; limit caps the rows', async () => {
  const d = tmp();
  mkdirSync(join(d, 'sub'));
  writeFileSync(join(d, 'b.jsonl'), jsonl([{ id: 'b1', problem: 'q b1', answer: '1' }]));
  writeFileSync(join(d, 'a.jsonl'), jsonl([{ id: 'a1', problem: 'q a1', answer: '1' }]));
  writeFileSync(join(d, 'sub', 'c.jsonl'), jsonl([{ id: 'c1', problem: 'q c1', answer: '1' }]));
  writeFileSync(join(d, 'dataset_info.json'), '{"not": "rows"}');
  const ids = async (spec: string) => (await loadProblems(spec)).map((p) => p.id);
  assert.deepEqual(await ids(join(d, '*.jsonl')), ['a1', 'b1']);
  assert.deepEqual(await ids(join(d, '**/*.jsonl')), ['a1', 'b1', 'c1']);
  assert.deepEqual(await ids(d), ['a1', 'b1', 'c1']);
  assert.deepEqual((await loadProblems(d, { limit: 2 })).length, 2);
  const both = await loadProblems(`${FIX}/{verl,dapo}-arith.*`);
  assert.equal(both.length, 60);
});

test('Parquet rows are located by 0-based row in errors', async () => {
  const f = join(tmp(), 'flat.parquet');
  parquetWriteFile({
    filename: f,
    columnData: [
      { name: 'problem', data: ['What is 1+1?', 'What is 2+2?', 'What is 3+3?'], type: 'STRING' },
      { name: 'answer', data: ['2', '4', null], type: 'STRING' },
    ],
  });
  assert.equal((await loadProblems(f)).length, 3);
  await assert.rejects(
    loadProblems(f, { requireAnswer: true }),
    /flat\.parquet row 2: missing string field 'answer' \(or 'gold' \/ 'solution'\): RL and eval data need a gold answer/,
  );
  assert.throws(() => loadProblemsSync(f), /Parquet is read asynchronously/);
  const junk = file('junk.parquet', 'not parquet at all');
  await assert.rejects(loadProblems(junk), /junk\.parquet: not a readable Parquet file/);
});

test('bad input: each error names the file, the line and the field', async () => {
  const d = tmp();
  await assert.rejects(
    loadProblems(join(d, 'missing.jsonl')),
    /no problems: file not found: .*missing\.jsonl/,
  );
  await assert.rejects(
    loadProblems(join(d, '*.parquet')),
    /no problems: no \.jsonl or \.parquet file matches/,
  );
  const empty = file('empty.jsonl', '\n\n');
  await assert.rejects(loadProblems(empty), /no problems: .*empty\.jsonl has no rows/);

  const unknown = file('unknown.jsonl', jsonl([{ foo: 1, bar: 'x' }]));
  await assert.rejects(
    loadProblems(unknown),
    (e: Error) =>
      /unknown\.jsonl:1: unknown layout; fields seen: foo, bar; tried verl \(.*\), dapo \(.*\), plain \(.*\)/.test(
        e.message,
      ) && /--layout NAME, --map question=FIELD/.test(e.message),
  );
  const sft = file('sft.jsonl', jsonl([{ messages: [] }]));
  await assert.rejects(loadProblems(sft), /looks like SFT chat data/);

  const noAnswer = file(
    'na.jsonl',
    `${JSON.stringify(verlRow('What is 1+2?', 3))}\n\n${JSON.stringify({
      prompt: [{ role: 'user', content: 'What is 2+2?' }],
    })}\n`,
  );
  await assert.rejects(
    loadProblems(noAnswer, { requireAnswer: true }),
    /na\.jsonl:3: missing string field 'reward_model\.ground_truth'/,
  );
  assert.equal((await loadProblems(noAnswer))[1].answer, null);

  const emptyQ = file(
    'eq.jsonl',
    jsonl([
      { problem: 'ok?', answer: 1 },
      { problem: '  ', answer: 1 },
    ]),
  );
  await assert.rejects(loadProblems(emptyQ), /eq\.jsonl:2: empty question \(field 'problem'\)/);
  const emptyUser = file('eu.jsonl', jsonl([verlRow('', 1)]));
  await assert.rejects(loadProblems(emptyUser), /eu\.jsonl:1: empty question \(field 'prompt'\)/);
  const noUser = file('nu.jsonl', jsonl([{ prompt: [{ role: 'system', content: 'hi' }] }]));
  await assert.rejects(loadProblems(noUser), /nu\.jsonl:1: field 'prompt' has no user message/);

  const malformed = file('bad.jsonl', '{"problem": "a?", "answer": 1}\n{"problem": "b?", \n');
  await assert.rejects(loadProblems(malformed), /bad\.jsonl:2: malformed JSON line/);
  const notObject = file('arr.jsonl', '[1, 2]\n');
  await assert.rejects(loadProblems(notObject), /arr\.jsonl:1: expected a JSON object, got an array/);

  const listAnswer = file('la.jsonl', jsonl([verlRow('q?', ['1', '2'] as unknown as string)]));
  await assert.rejects(
    loadProblems(listAnswer),
    /la\.jsonl:1: answer field 'reward_model\.ground_truth' must be a string or a number, got an array/,
  );
  const mappedMissing = file('mm.jsonl', jsonl([{ x: 1 }]));
  await assert.rejects(
    loadProblems(mappedMissing, { map: { question: 'deep.q' } }),
    /mm\.jsonl:1: no field 'deep\.q' \(mapped to question\)/,
  );
});

test('files saved on Windows (a byte-order mark, CRLF) read like any other; a .json document is named as such', async () => {
  const bom = file(
    'bom.jsonl',
    '\ufeff{"problem": "1+1?", "answer": "2"}\r\n{"problem": "2+2?", "answer": 4}\r\n',
  );
  assert.deepEqual(
    (await loadProblems(bom)).map((p) => [p.question, p.answer]),
    [
      ['1+1?', '2'],
      ['2+2?', '4'],
    ],
  );
  const array = file('rows.json', JSON.stringify([{ problem: '1+1?', answer: '2' }], null, 2));
  await assert.rejects(
    loadProblems(array),
    /rows\.json:1: .*one JSON document, not JSONL \(one object per line\): convert it with jq -c '\.\[\]'/,
  );
});

test('ids: a repeated row is kept for dedupe to drop; the same id on another question is an error', async () => {
  const rep = file(
    'rep.jsonl',
    jsonl([
      { id: 'a', problem: 'x?' },
      { id: 'a', problem: 'x?' },
    ]),
  );
  assert.equal((await loadProblems(rep)).length, 2);
  const clash = file(
    'clash.jsonl',
    jsonl([
      { id: 'a', problem: 'x?' },
      { id: 'a', problem: 'y?' },
    ]),
  );
  await assert.rejects(
    loadProblems(clash),
    /clash\.jsonl:2: duplicate id 'a' for a different question \(first at .*clash\.jsonl:1\)/,
  );
});

test('inspect counts rows, answers, integer answers and duplicate questions', async () => {
  const f = file(
    'counts.jsonl',
    jsonl([
      { problem: 'What is 1+1?', answer: '2' },
      { problem: 'what is  1+1?', answer: '2' },
      { problem: 'Simplify x/2.', answer: '\\frac{x}{2}' },
      { problem: 'Name a prime.' },
    ]),
  );
  const r = await inspectProblems(f, { show: 1 });
  assert.equal(r.rows, 4);
  assert.equal(r.withAnswer, 3);
  assert.equal(r.integerAnswers, 2);
  assert.equal(r.duplicateQuestions, 1);
  assert.equal(r.first.length, 1);
  assert.equal(r.files.length, 1);
});
