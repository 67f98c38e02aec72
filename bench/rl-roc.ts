// GRPO-RoC selection cost per RL step at the reference's scale: 128 prompts × 32 rollouts, each trace with
// up to 4 tool turns (penalty scoring + reject + RoC + advantages), so its share of a step can be judged.
// Run: flock /tmp/bench.lock node --import tsx bench/rl-roc.ts [--reps 7]

import { DEFAULT_PENALTY_OPTIONS, DEFAULT_ROC, type Scored, selectAndScore } from '../src/rl/index.js';
import type { TurnEvent } from '../src/rl/trajectory.js';
import { Rng } from '../src/util/rng.js';
import { benchArgs } from './args.js';

const { values } = benchArgs(import.meta.url, { options: { reps: { type: 'string', default: '7' } } });
const rng = new Rng(1);
const filler = 'x'.repeat(2000);
const groups: Scored[][] = Array.from({ length: 128 }, () =>
  Array.from({ length: 32 }, () => {
    const calls = rng.int(0, 4);
    const events: TurnEvent[] = [];
    let text = filler;
    for (let i = 0; i < calls; i++) {
      const err = rng.next() < 0.2;
      const t = err ? 'Tool call failure\nstderr: NameError' : 'Tool call success\nstdout: 42';
      events.push({ kind: 'generation', turn: i, start: 0, end: 1, finishReason: 'stop', ms: 1 });
      events.push({ kind: 'tool_result', turn: i, text: t, error: err, ms: 1, start: 0, end: 1 });
      text += `<tool_response>\n${t}\n</tool_response>${filler}`;
    }
    events.push({ kind: 'generation', turn: calls, start: 0, end: 1, finishReason: 'stop', ms: 1 });
    text += '<answer> \\boxed{42} </answer>';
    return { text, events, reward: rng.next() < 0.5 ? 1 : 0, numToolCalls: calls, numToolErrors: 0 };
  }),
);
const times: number[] = [];
for (let r = 0; r < Number(values.reps); r++) {
  const t0 = performance.now();
  const res = selectAndScore(
    groups,
    { ...DEFAULT_ROC, downSampleToN: 16 },
    DEFAULT_PENALTY_OPTIONS,
    new Rng(r),
  );
  times.push(performance.now() - t0);
  if (res.metrics.after % 16 !== 0) throw new Error('bad selection size');
}
times.sort((a, b) => a - b);
console.log(
  `selectAndScore 128x32 traces: median ${times[times.length >> 1].toFixed(1)} ms over ${times.length} reps`,
);
