import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import {
  BACKENDS,
  type Backend,
  EmbeddedEngine,
  type Engine,
  type EngineWorker,
  FakeEngine,
  remoteEngine,
  Scheduler,
  type SchedulerOptions,
} from '../engines/index.js';
import {
  type CodeRunner,
  type RunRequest,
  type RunResult,
  SandboxClient,
  type SandboxPoolOptions,
  ShardedPool,
} from '../sandbox/index.js';
import {
  buildCharTokenizer,
  ChatTemplate,
  Tokenizer,
  type ToolSchema,
  tokenizerFromFiles,
} from '../tokenizer/index.js';
import { type BatchingOptions, BatchingRunner } from './batching.js';
import type { AgentTemplate } from './loop.js';
import { agentTemplate } from './template.js';

// Everything a rollout runs on, opened in one place so that `rstar2 rollout`, eval, chat and the trainer
// generate with the same template, scheduler and sandbox and cannot drift apart.

export interface StackOptions {
  /**
   * Engine instances (the caller keeps ownership), or specs: 'embedded' (on `worker`, else on a new torch worker
   * that loads `model`), 'fake' (a scripted smoke model: one python call, then \boxed{2}), sglang+URL,
   * vllm+URL, llamacpp+URL, or a plain URL served by `backend`.
   */
  engines: (Engine | string)[];
  backend?: Backend; // for plain URLs; default sglang
  model?: string; // model directory: weights for 'embedded', and the default tokenizer
  /** An already started and loaded worker for 'embedded' (the trainer's PolicyWorker, which also trains). */
  worker?: EngineWorker;
  capacityTokens?: number; // KV capacity of each engine opened from a spec, instead of what it reports
  /** Instance, or tokenizer.json / its directory. Default: `model`; a char tokenizer when every engine is 'fake'. */
  tokenizer?: Tokenizer | string;
  /** Instance, or a name (rstar2, qwen, compact), 'tokenizer' (the model's own) or a file. Default rstar2. */
  template?: ChatTemplate | string;
  /** The tool prompts show and rollouts run (a recipe's `tool`); default the reference's python tool. */
  tools?: ToolSchema[];
  /** Instance (the caller keeps ownership), 'embedded' (a local sandbox pool) or a sandbox service URL. */
  sandbox?: CodeRunner | string;
  sandboxOptions?: SandboxPoolOptions; // for 'embedded': slots, timeoutMs, isolation, log, … (a shard per 4 cores)
  /** Merge tool calls of concurrent trajectories into runBatch calls (one HTTP request to a service). */
  batching?: boolean | BatchingOptions;
  scheduler?: SchedulerOptions;
  /** Sees each tool execution as it finishes (chat shows code and output live). */
  onTool?: (req: RunRequest, res: RunResult) => void;
}

export interface RolloutStack {
  tokenizer: Tokenizer;
  chat: ChatTemplate;
  template: AgentTemplate;
  engines: Engine[];
  scheduler: Scheduler;
  runner: CodeRunner; // the one to hand the agent loop (observed and batched as asked)
  /** Closes what the stack opened itself: never a passed-in engine, worker or runner. */
  close(): Promise<void>;
}

// A stand-in model for smoke runs without weights: one python call, then a boxed answer.
function scriptedEngine(tok: Tokenizer): Engine {
  const call =
    '<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "print(1+1)", "input": ""}}\n</tool_call><|im_end|>';
  return new FakeEngine((ids) => {
    const seen = tok.decode(ids).includes('<tool_response>');
    const text = seen ? '</reason> <answer>\\boxed{2}</answer><|im_end|>' : `I will compute.\n${call}`;
    return { outputIds: tok.encode(text, { addSpecialTokens: false }) };
  });
}

function openTokenizer(o: StackOptions): Tokenizer {
  if (o.tokenizer instanceof Tokenizer) return o.tokenizer;
  const path = o.tokenizer ?? o.model;
  if (path) return Tokenizer.load(path);
  if (o.engines.every((e) => e === 'fake')) return tokenizerFromFiles(buildCharTokenizer());
  throw new Error(
    'prompts need a tokenizer: give --tokenizer PATH (tokenizer.json or its directory) or --model DIR',
  );
}

/** A tokenizer that does not belong to the model fails only at the first sample, once per sample: its ids past the
 *  model's embedding table ("token id outside the vocabulary"), or the model's samples past the tokenizer's ids.
 *  Models pad vocab_size above the tokenizer's (Qwen2.5: 151,936 for 151,665 ids), never to twice its size. */
function checkVocab(model: string, tokenizer: Tokenizer, from: string): void {
  let vocab: unknown;
  try {
    const cfg = JSON.parse(readFileSync(join(model, 'config.json'), 'utf8'));
    vocab = cfg.vocab_size ?? cfg.text_config?.vocab_size;
  } catch {
    return; // the worker's load names what is wrong with the directory
  }
  if (typeof vocab === 'number' && (tokenizer.vocabSize > vocab || vocab > 2 * tokenizer.vocabSize))
    throw new Error(
      `${from} has ${tokenizer.vocabSize} token ids but ${join(model, 'config.json')} has vocab_size ${vocab}: ` +
        'the tokenizer and the model do not belong together',
    );
}

function observed(runner: CodeRunner, onTool: (req: RunRequest, res: RunResult) => void): CodeRunner {
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

export async function openRolloutStack(o: StackOptions): Promise<RolloutStack> {
  if (o.engines.length === 0) throw new Error('a rollout stack needs at least one engine');
  if (o.backend && !BACKENDS.includes(o.backend)) {
    throw new Error(`--backend must be one of ${BACKENDS.join(', ')}`);
  }
  // a mistyped --sandbox is refused before a worker loads a model: as a URL every tool call would fail
  if (typeof o.sandbox === 'string' && o.sandbox !== 'embedded' && !/^https?:\/\//.test(o.sandbox))
    throw new Error(
      `--sandbox must be 'embedded' or a sandbox service URL such as http://127.0.0.1:8088, got '${o.sandbox}'`,
    );
  const tokenizer = openTokenizer(o);
  const chat =
    o.template instanceof ChatTemplate ? o.template : ChatTemplate.resolve(o.template ?? 'rstar2', tokenizer);
  const closers: (() => Promise<void>)[] = [];
  const close = async () => {
    for (const c of closers.splice(0).reverse()) await c().catch(() => {});
  };
  try {
    const capacity = o.capacityTokens ? { capacityTokens: o.capacityTokens } : {};
    const engines: Engine[] = [];
    // built-in engines started here, side by side: each its own worker, told its place so that it takes its
    // own GPU (round the GPUs) or its share of one GPU's memory
    const started = o.worker ? 0 : o.engines.filter((e) => e === 'embedded').length;
    let slot = 0;
    for (const e of o.engines) {
      if (typeof e !== 'string') engines.push(e);
      else if (e === 'fake') engines.push(scriptedEngine(tokenizer));
      else if (e === 'embedded') {
        let worker = o.worker;
        if (!worker) {
          if (!o.model) throw new Error('--engines embedded needs --model DIR');
          checkVocab(
            o.model,
            tokenizer,
            typeof o.tokenizer === 'string' ? o.tokenizer : o.tokenizer ? 'the tokenizer' : o.model,
          );
          const { PolicyWorker } = await import('../worker/index.js');
          const env = started > 1 ? { RSTAR2_ENGINE: `${slot++}/${started}` } : undefined;
          const w = await PolicyWorker.start({ env });
          closers.push(() => w.close());
          await w.load(o.model);
          worker = w;
        }
        // close() on an EmbeddedEngine closes its worker, so the engine is never closed here: the worker is
        // closed above when the stack started it, and left alone when it was passed in
        engines.push(new EmbeddedEngine(worker, capacity));
      } else {
        const remote = remoteEngine(e, { backend: o.backend, ...capacity });
        closers.push(() => remote.close());
        engines.push(remote);
      }
    }
    const scheduler = await Scheduler.create(engines, o.scheduler);
    closers.push(() => scheduler.close());
    let runner: CodeRunner;
    if (typeof o.sandbox === 'object') runner = o.sandbox;
    else {
      const where = o.sandbox ?? 'embedded';
      const base =
        where === 'embedded' ? await ShardedPool.start(o.sandboxOptions) : new SandboxClient({ url: where });
      closers.push(() => base.close());
      runner = base;
    }
    if (o.onTool) runner = observed(runner, o.onTool);
    if (o.batching) runner = new BatchingRunner(runner, o.batching === true ? {} : o.batching);
    return {
      tokenizer,
      chat,
      template: agentTemplate(tokenizer, { chat, tools: o.tools }),
      engines,
      scheduler,
      runner,
      close,
    };
  } catch (e) {
    await close();
    throw e;
  }
}
