import type { EvalPolicy } from '../eval/index.js';
import type { Trajectory } from '../rl/index.js';

// One user message → one agent trajectory. The rStar2 template is single-question, so each message
// is answered on its own (no conversation memory); the tool state does not persist either.
export async function ask(
  policy: EvalPolicy,
  text: string,
  seed: number,
  signal?: AbortSignal,
): Promise<Trajectory> {
  const question = text.trim();
  if (question === '') throw new Error('empty message');
  let result: Trajectory | undefined;
  await policy.rollout(
    [{ problemId: 'chat', problem: question, answer: '', sample: 0, seed }],
    (t) => {
      result = t;
    },
    signal,
  );
  if (!result) throw new Error('the model produced no answer (interrupted)');
  return result;
}
