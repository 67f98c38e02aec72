import { openRolloutStack, runTrajectory } from '../agent/index.js';
import type { Backend, Engine } from '../engines/index.js';
import type { RunRequest, RunResult } from '../sandbox/index.js';
import type { Tokenizer, ToolSchema } from '../tokenizer/index.js';
import { EVAL_MAX_TOKENS } from './defaults.js';
import { fakeTrajectory } from './fake.js';
import { perRequest, type RolloutFn } from './run.js';

export interface EvalPolicyOptions {
  model?: string; // checkpoint directory: embedded torch engine (and its tokenizer.json)
  engine?: string; // served engine (sglang+http://…, vllm+…, llamacpp+…, plain URL + backend) or fake:ACC[:MS]
  backend?: string; // for a plain engine URL; default sglang
  tokenizer?: string; // tokenizer.json or its directory, for --engine (default: --model)
  template?: string; // chat template name or file; default rstar2
  sandbox?: string; // 'embedded' (local pool) or a sandbox service URL
  temperature: number;
  topP: number;
  maxTokens?: number; // response budget per trajectory, tool tokens included
  maxTurns?: number;
  /** The tools prompts show and the loop runs (default the python tool; [] none, as recipe tool.enabled false). */
  tools?: ToolSchema[];
  concurrency: number;
  /** Tests and embedders: use this engine (and tokenizer) instead of --model/--engine. */
  engineInstance?: Engine;
  tokenizerInstance?: Tokenizer;
  /** Called as each tool execution finishes (chat shows code and output live). */
  onTool?: (req: RunRequest, res: RunResult) => void;
}

export interface EvalPolicy {
  name: string;
  rollout: RolloutFn;
  close(): Promise<void>;
}

// fake:ACC[:MS] dry-runs the eval plumbing without a model, template or sandbox; MS is a per-trajectory delay,
// so kill/resume can be exercised for real.
function fakePolicy(spec: string, concurrency: number): EvalPolicy | null {
  const m = /^fake(?::([^:]*))?(?::([^:]*))?$/.exec(spec);
  if (!m) return null;
  const acc = m[1] === undefined ? 0.5 : Number(m[1]);
  const ms = m[2] === undefined ? 0 : Number(m[2]);
  if (!(acc >= 0 && acc <= 1)) throw new Error(`--engine fake:ACC needs 0 <= ACC <= 1 (got '${m[1]}')`);
  if (!(ms >= 0)) throw new Error(`--engine fake:ACC:MS needs a delay MS >= 0 (got '${m[2]}')`);
  return {
    name: `fake:${acc}`,
    rollout: perRequest(async (r) => {
      if (ms > 0) await new Promise((ok) => setTimeout(ok, ms));
      return fakeTrajectory(r, acc);
    }, concurrency),
    close: async () => {},
  };
}

// The rollout for eval and chat: the agent loop (same template, tool and limits as training) over the requested
// engine, one trajectory per request.
export async function openPolicy(o: EvalPolicyOptions): Promise<EvalPolicy> {
  if (Boolean(o.model) === Boolean(o.engine) && !o.engineInstance)
    throw new Error('give exactly one of --model DIR or --engine URL');
  const fake = o.engine && !o.engineInstance ? fakePolicy(o.engine, o.concurrency) : null;
  if (fake) return fake;
  const stack = await openRolloutStack({
    engines: [o.engineInstance ?? (o.model ? 'embedded' : (o.engine as string))],
    backend: o.backend as Backend | undefined,
    model: o.model,
    tokenizer: o.tokenizerInstance ?? o.tokenizer,
    template: o.template,
    sandbox: o.sandbox,
    tools: o.tools,
    batching: true,
    onTool: o.onTool,
  });
  const rollout = perRequest(
    (r, signal) =>
      runTrajectory(
        { id: r.problemId, question: r.problem, gold: r.answer },
        r.sample,
        stack.scheduler,
        {
          template: stack.template,
          runner: stack.runner,
          sampling: {
            temperature: o.temperature,
            topP: o.topP,
            ...(o.temperature > 0 ? { seed: r.seed } : {}),
          },
          maxTurns: o.maxTurns ?? 5,
          maxResponseTokens: o.maxTokens ?? EVAL_MAX_TOKENS,
        },
        signal,
      ),
    o.concurrency,
  );
  const name = o.engineInstance?.name ?? (o.model ? `embedded:${o.model}` : (o.engine as string));
  return { name, rollout, close: stack.close };
}
