import type { Trajectory, TurnEvent } from '../rl/index.js';
import { Rng } from '../util/rng.js';
import type { RolloutRequest } from './run.js';

// A synthetic, deterministic policy for dry runs of the eval/dashboard plumbing (`--engine fake:ACC`):
// real-shaped trajectories (a reasoning turn, a python call, its observation, a boxed answer) whose
// answer is right with probability ACC. No model is involved.
export function fakeTrajectory(
  req: Pick<RolloutRequest, 'problemId' | 'answer' | 'sample' | 'seed'>,
  acc: number,
): Trajectory {
  const rng = new Rng(req.seed * 2654435761 + 17);
  const right = rng.next() < acc;
  const toolError = rng.next() < 0.2;
  const guess = right ? req.answer || '42' : String(rng.int(0, 999));
  const code = toolError ? 'print(x)' : 'print(6 * 7)';
  const args = JSON.stringify({ code });
  const call = `<tool_call>\n{"name": "execute_python_code_with_standard_io", "arguments": ${args}}\n</tool_call>`;
  const gen1 = `<reason>Let me check the arithmetic with the tool.</reason>\n${call}<|im_end|>`;
  const obs = toolError
    ? "Tool call failure\nreason: \nstderr: NameError: name 'x' is not defined\n\nexecution time: 0.03s"
    : 'Tool call success\nstdout: 42\n\nexecution time: 0.01s';
  const obsWrapped = `\n<|im_start|>user\n<tool_response>\n${obs}\n</tool_response><|im_end|>\n<|im_start|>assistant\n`;
  const gen2 = `<reason>The tool ${toolError ? 'failed, so I reason directly' : 'confirms it'}.</reason>\n<answer>The answer is \\boxed{${guess}}.</answer><|im_end|>`;
  const n1 = 20 + rng.int(0, 30);
  const n2 = 30;
  const n3 = 15 + rng.int(0, 40);
  const ids = Array.from({ length: n1 + n2 + n3 }, () => rng.int(10, 5000));
  const mask = [...Array(n1).fill(1), ...Array(n2).fill(0), ...Array(n3).fill(1)];
  const events: TurnEvent[] = [
    { kind: 'generation', turn: 0, start: 0, end: n1, finishReason: 'stop', ms: 40 },
    { kind: 'tool_call', turn: 0, name: 'execute_python_code_with_standard_io', arguments: args },
    {
      kind: 'tool_result',
      turn: 0,
      text: obs,
      error: toolError,
      ms: 12,
      status: toolError ? 'error' : 'ok',
      start: n1,
      end: n1 + n2,
    },
    { kind: 'generation', turn: 1, start: n1 + n2, end: n1 + n2 + n3, finishReason: 'stop', ms: 50 },
  ];
  return {
    id: `${req.problemId}#${req.sample}`,
    promptId: req.problemId,
    sample: req.sample,
    promptIds: [1, 2, 3, 4],
    responseIds: ids,
    responseMask: mask,
    responseLogprobs: mask.map((m) => (m ? -Math.round(rng.next() * 1000) / 1000 : 0)),
    events,
    finish: 'answered',
    text: gen1 + obsWrapped + gen2,
    numToolCalls: 1,
    numToolErrors: toolError ? 1 : 0,
    engine: 'fake',
    ms: 100 + rng.int(0, 400),
  };
}
