import { BatchingRunner } from '../agent/batching.js';
import { runTrajectory } from '../agent/loop.js';
import { agentTemplate } from '../agent/template.js';
import { EmbeddedEngine } from '../engines/embedded.js';
import { BACKENDS, type Backend as RemoteBackend, remoteEngine } from '../engines/factory.js';
import { Scheduler } from '../engines/scheduler.js';
import type { Engine } from '../engines/types.js';
import { SandboxClient } from '../sandbox/client.js';
import { SandboxPool } from '../sandbox/pool.js';
import type { CodeRunner, RunRequest, RunResult } from '../sandbox/types.js';
import { ChatTemplate, Tokenizer } from '../tokenizer/index.js';
import { fakeTrajectory } from './fake.js';
import { perRequest, type RolloutFn } from './run.js';

export interface BackendOptions {
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
  concurrency: number;
  /** Tests and embedders: use this engine (and tokenizer) instead of --model/--engine. */
  engineInstance?: Engine;
  tokenizerInstance?: Tokenizer;
  /** Called as each tool execution finishes (chat shows code and output live). */
  onTool?: (req: RunRequest, res: RunResult) => void;
}

export interface Backend {
  name: string;
  rollout: RolloutFn;
  close(): Promise<void>;
}

// Reference eval budget: data.max_response_length=30720 (aime_eval.sh), 5 assistant turns.
export const EVAL_MAX_TOKENS = 30720;

function observed(runner: CodeRunner, onTool: BackendOptions['onTool']): CodeRunner {
  if (!onTool) return runner;
  return {
    run: async (req) => {
      const res = await runner.run(req);
      onTool(req, res);
      return res;
    },
    runBatch: async (reqs) => {
      const res = await runner.runBatch(reqs);
      for (const [i, r] of reqs.entries()) onTool(r, res[i]);
      return res;
    },
    close: () => runner.close(),
  };
}

// The rollout for eval and chat: the agent loop (same template, tool and limits as training) over
// the requested engine, or the synthetic `fake:ACC` policy that dry-runs the plumbing.
export async function openBackend(o: BackendOptions): Promise<Backend> {
  if (Boolean(o.model) === Boolean(o.engine) && !o.engineInstance)
    throw new Error('give exactly one of --model DIR or --engine URL');
  // fake:ACC[:MS] — MS is a per-trajectory delay, so kill/resume can be exercised for real
  const fake = o.engine ? /^fake(?::([^:]*))?(?::([^:]*))?$/.exec(o.engine) : null;
  if (fake) {
    const acc = fake[1] === undefined ? 0.5 : Number(fake[1]);
    const ms = fake[2] === undefined ? 0 : Number(fake[2]);
    if (!(acc >= 0 && acc <= 1)) throw new Error(`--engine fake:ACC needs 0 <= ACC <= 1 (got '${fake[1]}')`);
    if (!(ms >= 0)) throw new Error(`--engine fake:ACC:MS needs a delay MS >= 0 (got '${fake[2]}')`);
    return {
      name: `fake:${acc}`,
      rollout: perRequest(async (r) => {
        if (ms > 0) await new Promise((ok) => setTimeout(ok, ms));
        return fakeTrajectory(r, acc);
      }, o.concurrency),
      close: async () => {},
    };
  }
  if (o.backend && !BACKENDS.includes(o.backend as RemoteBackend)) {
    throw new Error(`--backend must be one of ${BACKENDS.join(', ')}`);
  }
  const tokPath = o.tokenizer ?? o.model;
  if (!tokPath && !o.tokenizerInstance) {
    throw new Error('--engine URL needs --tokenizer PATH (tokenizer.json or its directory)');
  }
  const tok = o.tokenizerInstance ?? Tokenizer.load(tokPath as string);
  const template = agentTemplate(tok, { chat: ChatTemplate.resolve(o.template ?? 'rstar2', tok) });
  const closers: (() => Promise<void>)[] = [];
  const close = async () => {
    for (const c of closers.reverse()) await c().catch(() => {});
  };
  try {
    let engine: Engine;
    if (o.engineInstance) engine = o.engineInstance;
    else if (o.model) {
      const { PolicyWorker } = await import('../worker/index.js');
      const w = await PolicyWorker.start();
      closers.push(() => w.close());
      await w.load(o.model);
      engine = new EmbeddedEngine(w);
    } else {
      engine = remoteEngine(o.engine as string, { backend: (o.backend ?? 'sglang') as RemoteBackend });
    }
    const scheduler = await Scheduler.create([engine]);
    closers.push(() => scheduler.close());
    const sandbox = o.sandbox ?? 'embedded';
    const base: CodeRunner =
      sandbox === 'embedded' ? await SandboxPool.start() : new SandboxClient({ url: sandbox });
    closers.push(() => base.close());
    const runner = new BatchingRunner(observed(base, o.onTool));
    const rollout = perRequest(
      (r, signal) =>
        runTrajectory(
          { id: r.problemId, question: r.problem, gold: r.answer },
          r.sample,
          scheduler,
          {
            template,
            runner,
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
    const name = o.engineInstance
      ? o.engineInstance.name
      : o.model
        ? `embedded:${o.model}`
        : (o.engine as string);
    return { name, rollout, close };
  } catch (e) {
    await close();
    throw e;
  }
}
