import assert from 'node:assert/strict';
import { test } from 'node:test';
import { majorityVote, normaliseAnswer, passAtK, renderMarkdown, scoreEval } from '../../src/eval/score.js';
import { traj } from './fixtures.js';

const close = (a: number, b: number) => assert.ok(Math.abs(a - b) < 1e-12, `${a} != ${b}`);

test('passAtK matches hand-computed binomial ratios', () => {
  close(passAtK(4, 1, 2), 1 - 3 / 6); // 1 - C(3,2)/C(4,2)
  close(passAtK(5, 2, 2), 1 - 3 / 10); // 1 - C(3,2)/C(5,2)
  close(passAtK(16, 4, 1), 4 / 16);
  close(passAtK(16, 0, 8), 0);
  close(passAtK(16, 9, 8), 1); // fewer than 8 wrong samples: every 8-subset holds a correct one
  close(passAtK(10, 3, 5), 1 - 21 / 252); // C(7,5)=21, C(10,5)=252
  assert.throws(() => passAtK(4, 5, 1), /exceeds/);
  assert.throws(() => passAtK(4, 1, 5), /k=5 exceeds/);
});

test('normaliseAnswer merges trivially different spellings', () => {
  assert.equal(normaliseAnswer(' 012 '), '12');
  assert.equal(normaliseAnswer('12.0'), '12');
  assert.equal(normaliseAnswer('1,000'), '1000');
  assert.equal(normaliseAnswer('\\boxed{\\dfrac{1}{2}}'), '\\frac{1}{2}');
  assert.equal(normaliseAnswer('\\left( 1, 2 \\right)'), '(1,2)');
  assert.equal(normaliseAnswer('30^\\circ'), '30');
  assert.notEqual(normaliseAnswer('12'), normaliseAnswer('13'));
});

test('majorityVote ignores missing answers, breaks ties by first sample', () => {
  const v = majorityVote([
    traj('p', 0, { extracted: '5' }),
    traj('p', 1, { extracted: null }),
    traj('p', 2, { extracted: '7', correct: true }),
    traj('p', 3, { extracted: '5.0' }),
    traj('p', 4, { extracted: '7', correct: true }),
  ]);
  assert.equal(v.answer, '5'); // 2 votes each; '5' appeared first
  assert.equal(v.votes, 2);
  assert.equal(v.correct, false);
  assert.deepEqual(majorityVote([traj('p', 0, {})]), { answer: null, votes: 0, correct: false });
});

test('scoreEval computes avg@k, pass@k, maj@k and usage stats by hand', () => {
  const problems = [
    { id: 'a', problem: 'A?', answer: '1' },
    { id: 'b', problem: 'B?', answer: '2' },
  ];
  const trajectories = [
    // a: 1 of 4 correct; majority '9' (wrong)
    traj('a', 0, { extracted: '1', correct: true, gen: 10, obs: 6, calls: 2, errors: 1 }),
    traj('a', 1, { extracted: '9', gen: 20 }),
    traj('a', 2, { extracted: '9', gen: 30, calls: 1 }),
    traj('a', 3, { extracted: null, gen: 40, finish: 'length' }),
    // b: 3 of 4 correct; majority '2' (right)
    traj('b', 0, { extracted: '2', correct: true, gen: 10, calls: 1 }),
    traj('b', 1, { extracted: '2', correct: true, gen: 10 }),
    traj('b', 2, { extracted: '3', gen: 10 }),
    traj('b', 3, { extracted: '2', correct: true, gen: 10 }),
    traj('b', 4, { extracted: '3', gen: 10 }), // beyond k: ignored
    traj('b', 1, { extracted: '3', gen: 10 }), // duplicate sample index: first wins
    traj('zzz', 0, { extracted: '3' }), // not in the problem set: ignored
  ];
  const r = scoreEval({ bench: 't', k: 4, problems, trajectories, wallTimeS: 12 });
  assert.equal(r.samples, 8);
  assert.equal(r.complete, true);
  close(r.avgAtK, (0.25 + 0.75) / 2);
  close(r.passAtK['1'], 0.5);
  close(r.passAtK['2'], (1 - 3 / 6 + 1) / 2); // a: 1 - C(3,2)/C(4,2); b: 1 wrong < 2 -> 1
  close(r.passAtK['4'], 1);
  close(r.majAtK, 0.5);
  close(r.meanResponseTokens, (16 + 20 + 30 + 40 + 40) / 8);
  close(r.meanGeneratedTokens, (10 + 20 + 30 + 40 + 40) / 8);
  close(r.toolCallsPerAnswer, 4 / 8);
  close(r.toolErrorRate, 1 / 4);
  assert.deepEqual(r.finishes, { answered: 7, length: 1 });
  assert.equal(r.perProblem[0].majority, '9');
  assert.equal(r.perProblem[1].majorityCorrect, true);
  const md = renderMarkdown(r);
  assert.match(md, /\| avg@4 \(mean pass@1\) \| 50\.0% \|/);
  assert.match(md, /\| a \| 1 \| 1\/4 \| 25\.0% \| 9 \(2\) \| no \|/);
});

test('scoreEval marks a partial eval incomplete and scores what it has', () => {
  const problems = [
    { id: 'a', problem: 'A?', answer: '1' },
    { id: 'b', problem: 'B?', answer: '2' },
  ];
  const r = scoreEval({
    bench: 't',
    k: 4,
    problems,
    trajectories: [traj('a', 0, { correct: true, extracted: '1' })],
  });
  assert.equal(r.complete, false);
  assert.equal(r.problems, 1);
  close(r.avgAtK, 1);
  close(r.passAtK['4'], 1);
  assert.throws(() => scoreEval({ bench: 't', k: 0, problems, trajectories: [] }), /k must be/);
});

test('scoreEval leaves out samples with no model answer (engine, abort, sandbox fault), not the model’s own tool errors', () => {
  const problems = [
    { id: 'a', problem: 'A?', answer: '1' },
    { id: 'b', problem: 'B?', answer: '2' },
  ];
  const sandbox = (status: string, text: string) => ({
    ...traj('b', 0, { extracted: '7', calls: 1, errors: 1 }),
    events: [{ kind: 'tool_result' as const, turn: 1, text, error: true, ms: 1, status, start: 0, end: 0 }],
  });
  const unreachable = sandbox(
    'internal_error',
    'Tool call failure\nreason: internal_error\nstderr: cannot reach sandbox service at http://127.0.0.1:1: ECONNREFUSED (after 6 attempts)\nexecution time: 0.00s',
  );
  const trajectories = [
    traj('a', 0, { extracted: '1', correct: true }),
    { ...traj('a', 1), finish: 'error' as const, error: 'rollout aborted by caller' },
    { ...traj('a', 1), finish: 'error' as const, error: 'engine down' }, // still no answer: one left out
    traj('a', 2, { extracted: '3' }),
    { ...traj('a', 3), finish: 'error' as const, error: 'engine down' },
    traj('a', 3, { extracted: '1', correct: true }), // regenerated later in the file: it counts
    unreachable,
    {
      ...sandbox('error', "Tool call failure\nreason: \nstderr: NameError: name 'x' is not defined"),
      sample: 1,
    },
    { ...sandbox('timeout', 'Tool call failure\nreason: worker_timeout'), sample: 2 },
    traj('b', 3, { extracted: '2', correct: true }),
  ];
  const r = scoreEval({ bench: 't', k: 4, problems, trajectories });
  assert.equal(r.samples, 6); // a: 0, 2, 3; b: 1, 2, 3
  assert.equal(r.failed, 2);
  assert.equal(r.failure, 'rollout aborted by caller');
  assert.equal(r.complete, false);
  close(r.avgAtK, (2 / 3 + 1 / 3) / 2);
  assert.deepEqual(
    r.perProblem.map((p) => [p.n, p.errors]),
    [
      [3, 1],
      [3, 1],
    ],
  );
  assert.deepEqual(r.finishes, { answered: 6 });
  close(r.toolErrorRate, 1); // the snippet's own errors stay; the unreachable sandbox's call is not counted
  const only = scoreEval({ bench: 't', k: 4, problems: problems.slice(1), trajectories: [unreachable] });
  assert.equal(only.samples, 0);
  assert.equal(
    only.failure,
    'sandbox internal_error: cannot reach sandbox service at http://127.0.0.1:1: ECONNREFUSED (after 6 attempts)',
  );
  const md = renderMarkdown(r);
  assert.match(md, /\(6 samples, 2 failed and left out, INCOMPLETE\)/);
  assert.match(md, /First failure .*: rollout aborted by caller/);
});
