import type { Trajectory } from '../../src/rl/trajectory.js';

// A real-shaped scored trajectory: generated ids (mask 1) then a tool observation (mask 0) per call.
export function traj(
  promptId: string,
  sample: number,
  o: {
    correct?: boolean;
    extracted?: string | null;
    gen?: number;
    obs?: number;
    calls?: number;
    errors?: number;
    finish?: Trajectory['finish'];
  } = {},
): Trajectory {
  const gen = o.gen ?? 10;
  const obs = o.obs ?? 0;
  const calls = o.calls ?? 0;
  const ids = Array.from({ length: gen + obs }, (_, i) => 100 + i);
  const mask = [...Array(gen).fill(1), ...Array(obs).fill(0)];
  const extracted = o.extracted === undefined ? null : o.extracted;
  return {
    id: `${promptId}#${sample}`,
    promptId,
    sample,
    promptIds: [1, 2, 3],
    responseIds: ids,
    responseMask: mask,
    responseLogprobs: mask.map((m) => (m ? -0.5 : 0)),
    events: [{ kind: 'generation', turn: 0, start: 0, end: gen, finishReason: 'stop', ms: 5 }],
    finish: o.finish ?? 'answered',
    text: extracted === null ? 'no answer' : `so \\boxed{${extracted}}`,
    numToolCalls: calls,
    numToolErrors: o.errors ?? 0,
    ms: 1000,
    gold: '1',
    reward: o.correct ? 1 : 0,
    correct: o.correct ?? false,
    verify: { extracted, matchedBy: o.correct ? 'integer' : null },
  };
}
