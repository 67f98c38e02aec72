import assert from 'node:assert/strict';
import { test } from 'node:test';
import { failedResult, toSubmissionResult } from '../../src/sandbox/codejudge.js';
import {
  executePythonTool,
  executePythonToolBatch,
  PYTHON_TOOL_SCHEMA,
  toolResultFromRun,
  truncateToolText,
} from '../../src/sandbox/tool.js';
import { FakeRunner, SpawnRunner } from './helpers.js';

const runner = new SpawnRunner();

test('schema matches the reference tool', () => {
  assert.equal(PYTHON_TOOL_SCHEMA.function.name, 'python_code_with_standard_io');
  assert.deepEqual(PYTHON_TOOL_SCHEMA.function.parameters.required, ['code', 'input']);
  assert.match(PYTHON_TOOL_SCHEMA.function.description, /^Execute Python code with standard input/);
});

test('success text with last-expression echo', async () => {
  const r = await executePythonTool({ code: 'x = 3\nx * 2', input: '' }, runner);
  assert.equal(r.error, false);
  assert.match(r.text, /^Tool call success\nstdout: 6\n\nexecution time: \d+\.\d\ds$/);
});

test('print is not echoed twice; None is not echoed', async () => {
  const r = await executePythonTool({ code: 'print(1+1)', input: '' }, runner);
  assert.match(r.text, /^Tool call success\nstdout: 2\n\nexecution time/);
});

test('stdin reaches input()', async () => {
  const r = await executePythonTool(
    { code: 'a, b = map(int, input().split())\nprint(a + b)', input: '3 4' },
    runner,
  );
  assert.match(r.text, /stdout: 7\n/);
});

test('empty input means no stdin (EOFError at the right line)', async () => {
  const r = await executePythonTool({ code: 'y = 1\ninput()', input: '' }, runner);
  assert.equal(r.error, true);
  assert.match(r.fullText, /^Tool call failure\nreason: \nstderr: EOFError at line 2: /);
});

test('exception text: Err at line N with source line, stdout kept', async () => {
  const r = await executePythonTool({ code: 'print("before")\n\nprint(x)', input: '' }, runner);
  assert.equal(r.error, true);
  assert.equal(r.result.exitCode, 1);
  assert.match(
    r.fullText,
    /^Tool call failure\nreason: \nstdout: before\n\nstderr: NameError at line 3: name 'x' is not defined\n {2}print\(x\)\n\nexecution time/,
  );
});

test('error inside the echoed last expression and inside a function', async () => {
  const r1 = await executePythonTool({ code: 'a = 1\n1/0', input: '' }, runner);
  assert.match(r1.fullText, /ZeroDivisionError at line 2: division by zero\n {2}1\/0/);
  const r2 = await executePythonTool({ code: 'def f():\n    return {}["k"]\nf()', input: '' }, runner);
  assert.match(r2.fullText, /KeyError at line 2: 'k'\n {2}return \{\}\["k"\]/);
});

test('syntax error is reported the same way', async () => {
  const r = await executePythonTool({ code: 'x = 1\nif x\n  pass', input: '' }, runner);
  assert.match(r.fullText, /stderr: SyntaxError at line 2: /);
});

test('timeout text matches code-judge', async () => {
  const r = await executePythonTool({ code: 'while True: pass', input: '' }, runner, { timeoutMs: 300 });
  assert.equal(r.error, true);
  assert.match(
    r.fullText,
    /^Tool call failure\nreason: worker_timeout\nstdout: Suicide from timeout.\n\nexecution time/,
  );
});

test('bad arguments give a failure text and never reach the runner', async () => {
  const fake = new FakeRunner();
  const r = await executePythonTool({ input: '' }, fake);
  assert.equal(r.error, true);
  assert.match(r.text, /reason: invalid_input\nstderr: argument 'code' must be a string/);
  const rs = await executePythonToolBatch([{ code: 'a' }, 'nope', { code: 'b', input: '' }], fake);
  assert.equal(fake.seen.length, 1 + 0 + 1);
  assert.equal(rs[1].error, true);
  assert.equal(rs[0].error, false);
  assert.match(rs[2].text, /ran:/);
});

test('a throwing runner becomes an internal_error result', async () => {
  const r = await executePythonTool({ code: '1' }, new FakeRunner(() => Promise.reject(new Error('boom'))));
  assert.match(r.text, /reason: internal_error\nstderr: sandbox failed: boom/);
});

test('truncation sides and budget', () => {
  const t = 'a'.repeat(100) + 'b'.repeat(100) + 'c'.repeat(100);
  assert.equal(truncateToolText('short', 256), 'short');
  const m = truncateToolText(t, 256, 'middle');
  assert.equal(m, `${t.slice(0, 128)}...(truncated)...${t.slice(-128)}`);
  assert.equal(truncateToolText(t, 10, 'left'), 'aaaaaaaaaa...(truncated)');
  assert.equal(truncateToolText(t, 10, 'right'), '(truncated)...cccccccccc');
});

test('characters are counted as Python counts them: a pair of surrogates is one, never split', () => {
  const x = '\u{1d465}'; // 𝑥, two UTF-16 units
  const t = 'a' + x.repeat(299);
  // verl's len() is 300 here: a 248-character text is left whole, a longer one cut at whole characters
  assert.equal(truncateToolText('a' + x.repeat(247), 248), 'a' + x.repeat(247));
  assert.equal(truncateToolText(t, 10, 'left'), `a${x.repeat(9)}...(truncated)`);
  assert.equal(truncateToolText(t, 10, 'middle'), `a${x.repeat(4)}...(truncated)...${x.repeat(5)}`);
  // code-judge's str[:1000] on each stream: 1000 characters, well-formed UTF-16
  const res = { ...failedResult('ok', ''), error: undefined, stdout: t.repeat(4), wallMs: 10 };
  const out = toSubmissionResult({ type: 'python', solution: '' }, res).stdout as string;
  assert.equal(Array.from(out).length, 1000);
  assert.doesNotThrow(() => encodeURIComponent(out), 'no lone surrogate');
});

test('a call the pool killed says why in stderr (code-judge would show the MemoryError traceback)', () => {
  const res = {
    ...failedResult('oom', "memory limit: the call's processes held 1191 MB together"),
    wallMs: 10,
  };
  const r = toSubmissionResult({ type: 'python', solution: '' }, { ...res, stdout: 'start\n', stderr: '' });
  assert.equal(r.stderr, "memory limit: the call's processes held 1191 MB together");
  assert.equal(r.stdout, 'start\n');
});

test('per-stream 1000-char cut before the 256 budget', () => {
  const res = { ...failedResult('ok', ''), error: undefined, stdout: 'x'.repeat(5000), wallMs: 10 };
  const r = toolResultFromRun(res, { budget: 100000 });
  assert.equal(r.fullText, `Tool call success\nstdout: ${'x'.repeat(1000)}\nexecution time: 0.01s`);
  assert.equal(toolResultFromRun(res).text.length, 256 + '...(truncated)...'.length);
});

test('exit() works even when the interpreter starts without site', async () => {
  const r = await executePythonTool({ code: 'print(1)\nexit(0)\nprint(2)', input: '' }, runner);
  assert.match(r.text, /^Tool call success\nstdout: 1\n\nexecution time/);
  const r2 = await executePythonTool({ code: 'print(1)\nquit(3)', input: '' }, runner);
  assert.equal(r2.error, true);
  assert.equal(r2.result.exitCode, 3);
});
