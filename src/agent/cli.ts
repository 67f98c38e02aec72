import { statSync, writeFileSync } from 'node:fs';
import type { Command } from 'commander';
import { commaList, deprecatedAliases, float, positiveInt, seed, topK } from '../cli/index.js';
import { isLayout, LAYOUTS, type Layout } from '../data/layouts.js';
import { ROUTING_POLICIES, type RoutingPolicy } from '../engines/scheduler.js';
import { BACKENDS, type Backend } from '../engines/types.js';
import type { RolloutOptions, TurnBoundary } from './loop.js';

interface RolloutFlags {
  engines: string[];
  backend: string;
  model?: string;
  tokenizer?: string;
  template: string;
  data: string;
  layout: string;
  map?: string;
  limit?: number;
  samples: number;
  out: string;
  resume?: boolean;
  sandbox: string;
  policy: string;
  budgetCoef: number;
  capacity?: number;
  maxTurns: number;
  maxResponseTokens: number;
  maxParallelCalls: number;
  tool: boolean;
  turnBoundary: string;
  temperature: number;
  topP: number;
  topK: number;
  seed?: number;
  printConfig?: boolean;
}

export function registerAgentCommands(program: Command): void {
  const rollout = program
    .command('rollout')
    .description('sample multi-turn tool-using trajectories for a problem file and write them as JSONL')
    .requiredOption(
      '--engines <specs>',
      "engines, comma-separated (repeatable): 'embedded' (torch worker on --model), 'fake' (scripted smoke " +
        'model), or URLs (sglang+http://h:p, vllm+http://h:p, llamacpp+http://h:p, or plain http://h:p with ' +
        '--backend)',
      commaList,
    )
    .option('--backend <name>', `backend of plain engine URLs (${BACKENDS.join(', ')})`, 'sglang')
    .option('--model <dir>', 'model directory (weights for embedded; tokenizer.json for all)')
    .option(
      '--tokenizer <path>',
      'tokenizer.json or its directory (default: --model; fake: a char tokenizer)',
    )
    .option('--template <name>', "chat template: rstar2, qwen, compact, 'tokenizer', or a file", 'rstar2')
    .requiredOption(
      '--data <file>',
      'problems: a .jsonl or .parquet file, a directory of them, or a glob; rows in the verl, DAPO-Math or ' +
        "plain {id, problem, answer} layout (see 'rstar2 data inspect --help')",
    )
    .option('--layout <name>', `problem row layout: auto, ${LAYOUTS.join(', ')}`, 'auto')
    .option('--map <fields>', 'problem fields from other dotted paths, e.g. question=q,answer=extra_info.gt')
    .option('--limit <n>', 'use only the first n problems', positiveInt())
    .option('-n, --samples <n>', 'samples per problem', positiveInt(), 8)
    .requiredOption(
      '--out <file>',
      'trajectories JSONL, appended as they finish; an existing one is refused unless --resume',
    )
    .option(
      '--resume',
      'continue the --out of an earlier run of this rollout (same problems and --samples): keep its trajectories, ' +
        'sample only the missing ones and those that failed outside the model (engine error, sandbox fault)',
    )
    .option('--sandbox <where>', "'embedded' (local bubblewrap pool) or a sandbox service URL", 'embedded')
    .option(
      '--policy <name>',
      `engine routing: ${ROUTING_POLICIES.join(', ')} (round-robin = static split; auto = kv-predict on engines with ≥ 500K KV tokens, else round-robin)`,
      'auto',
    )
    .option(
      '--budget-coef <x>',
      'KV credit = capacity / coef (>1 is more conservative)',
      float({ min: 0, minExclusive: true }),
      1,
    )
    .option(
      '--capacity <tokens>',
      'KV capacity per engine, overriding what the engine reports',
      positiveInt(),
    )
    .option('--max-turns <n>', 'assistant turns per trajectory', positiveInt(), 5)
    .option('--max-response-tokens <n>', 'response budget, tool tokens included', positiveInt(), 8192)
    .option('--max-parallel-calls <n>', 'tool calls executed per turn', positiveInt(), 1)
    .option(
      '--no-tool',
      'prompts show no tool and no call is parsed or run (a model trained with tool.enabled: false)',
    )
    .option(
      '--turn-boundary <mode>',
      "'reference' (tool turn right after <|im_end|>) or 'rerender' (adds '\\n')",
      'reference',
    )
    .option('--temperature <t>', 'sampling temperature', float({ min: 0 }), 1.0)
    .option('--top-p <p>', 'nucleus sampling (1 = off)', float({ min: 0, minExclusive: true, max: 1 }), 1.0)
    .option('--top-k <k>', 'top-k sampling (-1 = off)', topK(), -1)
    .option('--seed <n>', 'sampling seed', seed())
    .option('--print-config', 'print the resolved configuration and exit');
  deprecatedAliases(rollout, { '--engine <spec...>': '--engines', '--n <n>': '--samples' });
  rollout.action(async (f: RolloutFlags) => {
    const policy = f.policy as RoutingPolicy;
    if (!ROUTING_POLICIES.includes(policy))
      throw new Error(`--policy must be one of ${ROUTING_POLICIES.join(', ')}`);
    if (!['reference', 'rerender'].includes(f.turnBoundary)) {
      throw new Error("--turn-boundary must be 'reference' or 'rerender'");
    }
    if (!BACKENDS.includes(f.backend as Backend))
      throw new Error(`--backend must be one of ${BACKENDS.join(', ')}`);
    if (f.layout !== 'auto' && !isLayout(f.layout)) {
      throw new Error(`--layout must be auto or one of ${LAYOUTS.join(', ')}`);
    }
    const { parseFieldMap } = await import('../data/index.js');
    const n = f.samples;
    const config = {
      engines: f.engines,
      backend: f.backend,
      model: f.model ?? null,
      template: f.template,
      data: f.data,
      layout: f.layout as Layout | 'auto',
      map: f.map ? parseFieldMap(f.map) : null,
      limit: f.limit ?? null,
      n,
      out: f.out,
      resume: f.resume ?? false,
      sandbox: f.sandbox,
      policy,
      budgetCoef: f.budgetCoef,
      capacity: f.capacity ?? null,
      maxTurns: f.maxTurns,
      maxResponseTokens: f.maxResponseTokens,
      maxParallelCalls: f.maxParallelCalls,
      tool: f.tool,
      turnBoundary: f.turnBoundary as TurnBoundary,
      sampling: {
        temperature: f.temperature,
        topP: f.topP,
        topK: f.topK,
        ...(f.seed === undefined ? {} : { seed: f.seed }),
      },
    };
    if (f.printConfig) {
      console.log(JSON.stringify(config, null, 2));
      return;
    }
    const { loadRolloutProblems } = await import('./problems.js');
    const { openRolloutStack } = await import('./stack.js');
    const { streamRollouts } = await import('./loop.js');
    const { appendJsonl } = await import('../util/jsonl.js');
    const { resumeTrajectoryFile } = await import('../eval/index.js');
    const { lockFile } = await import('../util/lock.js');
    const { Progress } = await import('../util/progress.js');
    const problems = await loadRolloutProblems(f.data, {
      layout: config.layout,
      map: config.map ?? undefined,
      limit: config.limit ?? undefined,
    });
    // before the engines start, so a wrong file costs nothing; nothing finished is ever truncated
    const outStat = statSync(f.out, { throwIfNoEntry: false });
    if (outStat && !outStat.isFile()) throw new Error(`--out ${f.out} is not a file`);
    // held to the end: a second rollout or resume on this file would sample the same samples, and the resume's
    // rewrite would drop what the first appended meanwhile
    lockFile(f.out, 'rollout --out');
    let saved = new Set<string>();
    if (f.resume) saved = resumeTrajectoryFile(f.out, problems, n);
    else if (outStat && outStat.size > 0) {
      throw new Error(
        `${f.out} already holds trajectories: --resume continues that rollout; to start over, remove it or give another --out`,
      );
    }
    const total = problems.length * n - saved.size;
    if (saved.size > 0) console.error(`rollout: resuming ${f.out}: ${saved.size} trajectories already saved`);
    if (total === 0) {
      console.log(JSON.stringify({ trajectories: 0, resumed: saved.size, out: f.out }));
      return;
    }
    const stack = await openRolloutStack({
      engines: f.engines,
      backend: f.backend as Backend,
      model: f.model,
      tokenizer: f.tokenizer,
      template: f.template,
      sandbox: f.sandbox,
      tools: config.tool ? undefined : [],
      capacityTokens: config.capacity ?? undefined,
      scheduler: {
        policy,
        budgetCoef: config.budgetCoef,
      },
    });
    // Ctrl-C / SIGTERM: in-flight trajectories end as finish 'error' records and are still
    // written; a second signal exits at once.
    const ac = new AbortController();
    const onSignal = () => {
      if (ac.signal.aborted) process.exit(130);
      console.error('rollout: stopping, writing in-flight trajectories as errors (signal again to quit now)');
      ac.abort();
    };
    process.on('SIGINT', onSignal);
    process.on('SIGTERM', onSignal);
    try {
      writeFileSync(f.out, '', { flag: 'a' });
      const bar = new Progress('rollout', total);
      const finishes: Record<string, number> = {};
      let turns = 0;
      let tools = 0;
      let toolErrors = 0;
      let tokens = 0;
      const t0 = Date.now();
      const opts: RolloutOptions = {
        scheduler: stack.scheduler,
        template: stack.template,
        runner: stack.runner,
        problems,
        n,
        skip: saved,
        sampling: config.sampling,
        maxTurns: config.maxTurns,
        maxResponseTokens: config.maxResponseTokens,
        maxParallelCalls: config.maxParallelCalls,
        turnBoundary: config.turnBoundary,
        signal: ac.signal,
      };
      for await (const t of streamRollouts(opts)) {
        appendJsonl(f.out, [t]);
        finishes[t.finish] = (finishes[t.finish] ?? 0) + 1;
        turns += t.events.filter((e) => e.kind === 'generation').length;
        tools += t.numToolCalls;
        toolErrors += t.numToolErrors;
        tokens += t.responseIds.length;
        bar.tick(1, `tools ${tools} err ${toolErrors}`);
      }
      bar.finish();
      const secs = (Date.now() - t0) / 1000;
      console.log(
        JSON.stringify({
          trajectories: total,
          ...(saved.size > 0 ? { resumed: saved.size } : {}),
          finish: finishes,
          turns,
          toolCalls: tools,
          toolErrors,
          meanResponseTokens: Math.round(tokens / Math.max(1, total)),
          seconds: Number(secs.toFixed(2)),
          out: f.out,
          ...(ac.signal.aborted ? { interrupted: true } : {}),
        }),
      );
      if (ac.signal.aborted) process.exitCode = 130;
    } finally {
      process.off('SIGINT', onSignal);
      process.off('SIGTERM', onSignal);
      await stack.close();
    }
  });
}
