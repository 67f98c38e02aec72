import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  DEFAULT_PENALTY_OPTIONS,
  DEFAULT_ROC,
  groupAdvantages,
  type PenaltyOptions,
  rejectEqualReward,
  resampleOnCorrect,
  rocAnswerFormatPenalty,
  rocErrorRatioPenalty,
  rocPenalty,
  roundHalfEven,
  type Scored,
  selectAndScore,
} from '../../src/rl/index.js';
import type { TurnEvent } from '../../src/rl/trajectory.js';
import { Rng } from '../../src/util/rng.js';

const REF: PenaltyOptions = { ...DEFAULT_PENALTY_OPTIONS, formatTurns: 'reference', errorMatch: 'substring' };
const PAPER: PenaltyOptions = { ...DEFAULT_PENALTY_OPTIONS, formatTurns: 'paper' };

// A trace: each tool text becomes a turn (generation, call, result), then a final answering generation.
function trace(
  tools: { text: string; error?: boolean }[],
  answer = '<answer>\\boxed{1}</answer>',
  reward = 1,
): Scored {
  const events: TurnEvent[] = [];
  let text = '';
  tools.forEach((tool, turn) => {
    events.push({ kind: 'generation', turn, start: 0, end: 1, finishReason: 'stop', ms: 1 });
    events.push({ kind: 'tool_call', turn, name: 'python', arguments: '{}' });
    events.push({
      kind: 'tool_result',
      turn,
      text: tool.text,
      error: tool.error ?? false,
      ms: 1,
      start: 0,
      end: 1,
    });
    text += `<tool_call>x</tool_call><|im_end|><tool_response>\n${tool.text}\n</tool_response>`;
  });
  events.push({ kind: 'generation', turn: tools.length, start: 0, end: 1, finishReason: 'stop', ms: 1 });
  text += `</reason> ${answer}<|im_end|>`;
  return {
    text,
    events,
    reward,
    numToolCalls: tools.length,
    numToolErrors: tools.filter((t) => t.error).length,
  };
}

test('roundHalfEven matches Python round()', () => {
  assert.deepEqual([0.5, 1.5, 2.5, 7.5, 8.5, 2.4, 2.6, 0, 3].map(roundHalfEven), [0, 2, 2, 8, 8, 2, 3, 0, 3]);
  assert.equal(roundHalfEven(7.5) + roundHalfEven(8.5), 16);
});

test('error ratio: substring "error", timeouts not counted, no tools = 0.5', () => {
  assert.equal(rocErrorRatioPenalty(trace([]), REF), 0.5);
  assert.equal(rocErrorRatioPenalty(trace([{ text: 'Tool call success\nstdout: 2' }]), REF), 0);
  assert.equal(rocErrorRatioPenalty(trace([{ text: 'stderr: NameError at line 1' }]), REF), 1);
  assert.equal(rocErrorRatioPenalty(trace([{ text: 'reason: worker_timeout', error: true }]), REF), 0);
  assert.equal(rocErrorRatioPenalty(trace([{ text: 'ok' }, { text: 'ZeroDivisionError' }]), REF), 0.5);
  // false positive of the substring rule, and what 'flag' does instead
  const rel = trace([{ text: 'stdout: relative error 0.1' }]);
  assert.equal(rocErrorRatioPenalty(rel, REF), 1);
  assert.equal(rocErrorRatioPenalty(rel, { ...REF, errorMatch: 'flag' }), 0);
  assert.equal(
    rocErrorRatioPenalty(trace([{ text: 'reason: worker_timeout', error: true }]), {
      ...REF,
      errorMatch: 'flag',
    }),
    1,
  );
  assert.equal(rocErrorRatioPenalty(trace([]), { ...REF, noToolErrorPenalty: 0 }), 0);
});

test('error ratio falls back to <tool_response> blocks when a record has no events', () => {
  const t = { text: '<tool_response>Error x</tool_response><tool_response>fine</tool_response>', events: [] };
  assert.equal(rocErrorRatioPenalty(t, REF), 0.5);
});

test('reference totals from the notes (no_tool 1.5, clean 0, erroring 1, timeout 0, two answers 1)', () => {
  const flags = { rocErrorRatio: true, rocAnswerFormat: true };
  assert.equal(rocPenalty(trace([]), flags, REF), 1.5);
  assert.equal(rocPenalty(trace([{ text: 'stdout: 2' }]), flags, REF), 0);
  assert.equal(rocPenalty(trace([{ text: 'NameError' }]), flags, REF), 1);
  assert.equal(rocPenalty(trace([{ text: 'reason: worker_timeout' }]), flags, REF), 0);
  const two = trace([{ text: 'stdout: 2' }], '<answer>1</answer> <answer>\\boxed{1}</answer>');
  assert.equal(rocPenalty(two, flags, REF), 1);
});

test('format penalty: the no-tool quirk is an option; paper mode counts the first turn', () => {
  const noTool = trace([]);
  assert.equal(rocAnswerFormatPenalty(noTool, REF), 1);
  assert.equal(rocAnswerFormatPenalty(noTool, PAPER), 0);
  const two = trace([{ text: 'ok' }], '<answer>a</answer><answer>b</answer>');
  assert.equal(rocAnswerFormatPenalty(two, REF), 1); // (2-1)/1
  assert.equal(rocAnswerFormatPenalty(two, PAPER), 0.5); // (2-1)/2
  assert.equal(rocAnswerFormatPenalty(trace([{ text: 'ok' }], 'no tags'), PAPER), 1);
  assert.equal(rocAnswerFormatPenalty(trace([{ text: 'ok' }], '<answer>a'), PAPER), 1);
  assert.equal(rocAnswerFormatPenalty(trace([{ text: 'ok' }], '<answer>a</answer></answer>'), PAPER), 1);
  // a turn cut by the length budget is not a finished turn
  const cut = trace([{ text: 'ok' }]);
  cut.events[cut.events.length - 1] = {
    kind: 'generation',
    turn: 1,
    start: 0,
    end: 1,
    finishReason: 'length',
    ms: 1,
  };
  assert.equal(rocAnswerFormatPenalty(cut, REF), 1);
  assert.equal(rocAnswerFormatPenalty(cut, PAPER), 0);
});

test('rejectEqualReward classifies all-correct, all-wrong and mixed groups', () => {
  assert.equal(rejectEqualReward([1, 1, 1]), 'all_correct');
  assert.equal(rejectEqualReward([0, 0]), 'all_wrong');
  assert.equal(rejectEqualReward([-1, -1]), 'all_wrong');
  assert.equal(rejectEqualReward([1, 0, 1]), null);
  assert.equal(rejectEqualReward([1, 1 + 1e-9]), 'all_correct');
  assert.equal(rejectEqualReward([]), null);
});

const CFG = {
  downSampleToN: 16,
  minZeroRewardTraceNum: 2,
  minNonZeroRewardTraceNum: 2,
  negativeSelection: 'first' as const,
};

test('RoC keeps proportions with banker rounding: 15 pos/17 neg of 32 -> 8+8 (Math.round would give 17)', () => {
  const rewards = [...Array(15).fill(1), ...Array(17).fill(0)];
  const sel = resampleOnCorrect(rewards, Array(32).fill(0), CFG, new Rng(1));
  assert.equal(sel.reason, 'down_sampled');
  assert.equal(sel.keep!.length, 16);
  assert.equal(sel.keep!.filter((i) => rewards[i] > 0).length, 8);
});

test('RoC raises a side to its minimum: 1 negative of 32 -> 15 pos + 1 neg; 31 neg -> 2 pos', () => {
  const r1 = [...Array(31).fill(1), 0];
  const s1 = resampleOnCorrect(r1, Array(32).fill(0), CFG, new Rng(1));
  assert.deepEqual(
    s1.keep!.filter((i) => r1[i] === 0),
    [31],
  );
  assert.equal(s1.keep!.length, 16);
  const r2 = [1, 1, 1, ...Array(29).fill(0)];
  const s2 = resampleOnCorrect(r2, Array(32).fill(0), CFG, new Rng(1));
  assert.equal(s2.keep!.filter((i) => r2[i] > 0).length, 2);
  assert.equal(s2.keep!.length, 16);
});

test('RoC positives are the lowest-penalty ones, ties in rollout order (stable)', () => {
  const rewards = [1, 1, 1, 1, 0, 0, 0, 0];
  const pen = [1.5, 0, 1, 0, 0, 0, 0, 0];
  const sel = resampleOnCorrect(
    rewards,
    pen,
    { ...CFG, downSampleToN: 4, minZeroRewardTraceNum: 1, minNonZeroRewardTraceNum: 1 },
    new Rng(1),
  );
  assert.deepEqual(sel.keep!.slice(0, 2), [1, 3]);
  assert.deepEqual(sel.keep!.slice(2), [4, 5]); // 'first' negatives
});

test('RoC negatives: seeded uniform choice reproduces, covers all negatives across seeds, never by penalty', () => {
  const rewards = [1, 1, 0, 0, 0, 0, 0, 0];
  const pen = [0, 0, 0, 9, 9, 9, 9, 9];
  const cfg = {
    ...CFG,
    downSampleToN: 4,
    minZeroRewardTraceNum: 1,
    minNonZeroRewardTraceNum: 1,
    negativeSelection: 'random' as const,
  };
  const a = resampleOnCorrect(rewards, pen, cfg, new Rng(5)).keep;
  assert.deepEqual(resampleOnCorrect(rewards, pen, cfg, new Rng(5)).keep, a);
  const seen = new Set<number>();
  for (let s = 0; s < 200; s++) {
    const k = resampleOnCorrect(rewards, pen, cfg, new Rng(s)).keep!;
    assert.equal(k.length, 4);
    for (const i of k) if (rewards[i] === 0) seen.add(i);
  }
  assert.deepEqual([...seen].sort(), [2, 3, 4, 5, 6, 7]);
});

test('RoC group sizes: N < n dropped, N == n kept as is, n = -1 keeps all', () => {
  assert.deepEqual(resampleOnCorrect([1, 0], [0, 0], { ...CFG, downSampleToN: 4 }, new Rng(1)), {
    keep: null,
    reason: 'too_few',
  });
  assert.deepEqual(
    resampleOnCorrect([1, 0, 0], [0, 0, 0], { ...CFG, downSampleToN: 3 }, new Rng(1)).keep,
    [0, 1, 2],
  );
  assert.deepEqual(
    resampleOnCorrect([1, 0, 0], [0, 0, 0], { ...CFG, downSampleToN: -1 }, new Rng(1)).keep,
    [0, 1, 2],
  );
});

test('RoC with odd n never violates the size invariant', () => {
  for (let N = 5; N <= 20; N++) {
    for (let p = 0; p <= N; p++) {
      const rewards = [...Array(p).fill(1), ...Array(N - p).fill(0)];
      for (const n of [3, 5]) {
        const sel = resampleOnCorrect(
          rewards,
          Array(N).fill(0),
          { ...CFG, downSampleToN: n, minZeroRewardTraceNum: 1, minNonZeroRewardTraceNum: 1 },
          new Rng(1),
        );
        if (sel.reason === 'below_minimums') assert.equal(sel.keep!.length, N);
        else assert.equal(sel.keep!.length, n, `N=${N} p=${p} n=${n}`);
      }
    }
  }
});

test('groupAdvantages: unbiased std, eps, singleton and equal groups', () => {
  const a = groupAdvantages([1, 0, 0, 0]);
  const std = Math.sqrt((0.75 ** 2 + 3 * 0.25 ** 2) / 3);
  assert.ok(Math.abs(a[0] - 0.75 / (std + 1e-6)) < 1e-12);
  assert.ok(Math.abs(a.reduce((x, y) => x + y, 0)) < 1e-9);
  assert.deepEqual(groupAdvantages([1, 1, 1]), [0, 0, 0]);
  assert.deepEqual(groupAdvantages([1]), [1 / (1 + 1e-6)]);
  assert.deepEqual(groupAdvantages([]), []);
  assert.deepEqual(groupAdvantages([1, 0], 1e-6, false), [0.5, -0.5]);
});

test('selectAndScore: reject + RoC + advantages + metrics; RoC off is plain GRPO', () => {
  const clean = () => trace([{ text: 'stdout: 5' }]);
  const bad = () => trace([{ text: 'NameError' }, { text: 'stdout: 5' }]);
  const wrong = () => trace([{ text: 'stdout: 4' }], '<answer>4</answer>', 0);
  const mixed = [bad(), bad(), clean(), wrong(), wrong(), wrong(), clean(), bad()];
  const allRight = [clean(), clean(), clean(), clean()];
  const allWrong = [wrong(), wrong(), wrong(), wrong()];
  const roc = { ...DEFAULT_ROC, downSampleToN: 4, minZeroRewardTraceNum: 1, minNonZeroRewardTraceNum: 1 };
  const on = selectAndScore([mixed, allRight, allWrong], roc, PAPER, new Rng(3));
  assert.equal(on.metrics.before, 16);
  assert.equal(on.metrics.after, 4);
  assert.equal(on.metrics.groups_rejected_all_correct, 1);
  assert.equal(on.metrics.groups_rejected_all_wrong, 1);
  const keptPos = on.kept.filter((k) => mixed[k.index].reward > 0).map((k) => k.index);
  assert.deepEqual(keptPos, [2, 6]); // the clean ones
  assert.equal(on.metrics.tool_error_ratio_pos_kept, 0);
  // positives: 3 bad (1 err / 2 calls each) + 2 clean + 4 clean in the all-correct group = 3 / 12
  assert.ok(Math.abs(on.metrics.tool_error_ratio_pos - 3 / 12) < 1e-12);
  assert.ok(on.kept.every((k) => (mixed[k.index].reward > 0 ? k.advantage > 0 : k.advantage < 0)));

  const off = selectAndScore([mixed, allRight], { ...roc, doDownSampling: false }, PAPER, new Rng(3));
  assert.equal(off.metrics.after, 8);
  assert.ok(off.metrics.tool_error_ratio_pos_kept > 0);
  const noReject = selectAndScore(
    [allRight],
    { ...roc, doDownSampling: false, rejectEqualReward: false },
    PAPER,
    new Rng(3),
  );
  assert.deepEqual(
    noReject.kept.map((k) => k.advantage),
    [0, 0, 0, 0],
  );
});
