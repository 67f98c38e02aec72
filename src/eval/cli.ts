import { setMaxListeners } from 'node:events';
import { basename, dirname, resolve } from 'node:path';
import type { Command } from 'commander';
import { deprecatedAliases, float, positiveInt, seed } from '../cli/index.js';
import type { VerifyProfile } from '../reward/types.js';
import { lockDir } from '../util/lock.js';
import { EVAL_MAX_TOKENS, EVAL_SAMPLED } from './defaults.js';
import type { BenchProblem, EvalReport } from './score.js';

// Through src/data's async loader, so --data may be Parquet, a directory or a glob in any layout it reads.
async function benchProblems(spec: string, limit?: number): Promise<BenchProblem[]> {
  const { loadProblems } = await import('../data/index.js');
  const ps = await loadProblems(spec, { requireAnswer: true, limit });
  return ps.map((p) => ({ id: p.id, problem: p.question, answer: p.answer as string }));
}

function summary(r: EvalReport): string {
  const pct = (x: number) => `${(100 * x).toFixed(1)}%`;
  const left = `${r.failed ? `, ${r.failed} failed and left out` : ''}${r.complete ? '' : ', INCOMPLETE'}`;
  return (
    `${r.bench}: avg@${r.k} ${pct(r.avgAtK)}  pass@${r.k} ${pct(r.passAtK[String(r.k)] ?? 0)}  maj@${r.k} ${pct(r.majAtK)}  ` +
    `tokens ${r.meanResponseTokens.toFixed(0)}  tool calls ${r.toolCallsPerAnswer.toFixed(2)}  ` +
    `tool errors ${pct(r.toolErrorRate)}  (${r.problems} problems, ${r.samples} samples${left}, ${r.wallTimeS.toFixed(1)} s)`
  );
}

const failedNote = (r: EvalReport) =>
  `${r.failed} samples failed for infrastructure reasons (first: ${r.failure}) and are left out of the scores`;

/**
 * The model part of the default --out, so that two checkpoints evaluated with default flags land in two
 * directories: a checkpoint under runs/NAME/checkpoints/ is NAME-<checkpoint>, another model dir its name, a
 * served engine its spec without the URL scheme. Short and safe in a file name.
 */
export function modelTag(model?: string, engine?: string): string {
  let tag = (engine ?? '').replace(/^(\w+\+)?https?:\/\//, '$1');
  if (model) {
    const dir = resolve(model);
    tag =
      basename(dirname(dir)) === 'checkpoints'
        ? `${basename(dirname(dirname(dir)))}-${basename(dir)}`
        : basename(dir);
  }
  return (
    tag
      .replace(/[^\w.-]+/g, '-')
      .replace(/^[-.]+|-+$/g, '')
      .slice(-60) || 'model'
  );
}

export function registerEvalCommands(program: Command): void {
  const evalCmd = program
    .command('eval')
    .description(
      'sample k answers per benchmark problem with the Python tool and report avg@k, pass@k, maj@k (resumable)',
    )
    .option('--model <dir>', 'checkpoint directory (embedded engine)')
    .option(
      '--engine <spec>',
      'served engine: sglang+http://h:p, vllm+http://h:p, llamacpp+http://h:p, a plain URL (see --backend), or fake:ACC (dry run)',
    )
    .option('--backend <name>', 'backend of a plain --engine URL: sglang, vllm, llamacpp', 'sglang')
    .option('--tokenizer <path>', 'tokenizer.json or its directory (default: --model)')
    .option('--template <name>', 'chat template: rstar2, qwen, compact, tokenizer, or a file', 'rstar2')
    .option('--sandbox <where>', "'embedded' (local bubblewrap pool) or a sandbox service URL", 'embedded')
    .option('--max-turns <n>', 'assistant turns per trajectory', positiveInt(), 5)
    .option('--bench <name>', 'named benchmark: aime24, aime25, hmmt25, math500, ...')
    .option(
      '--data <file>',
      'problems with gold answers: a .jsonl or .parquet file, a directory of them, or a glob; verl, DAPO-Math ' +
        'or plain {id, problem, answer} rows',
    )
    .option(
      '-n, --samples <n>',
      'samples per problem (the k of avg@k, pass@k, maj@k)',
      positiveInt(),
      EVAL_SAMPLED.samples,
    )
    .option(
      '--temperature <t>',
      'sampling temperature (0 = greedy: k identical samples, as the release validates)',
      float({ min: 0 }),
      EVAL_SAMPLED.temperature,
    )
    .option(
      '--top-p <p>',
      'nucleus sampling top-p',
      float({ min: 0, minExclusive: true, max: 1 }),
      EVAL_SAMPLED.topP,
    )
    .option(
      '--max-response-tokens <n>',
      'response budget per trajectory, all turns and tool tokens',
      positiveInt(),
      EVAL_MAX_TOKENS,
    )
    .option(
      '--no-tool',
      'prompts show no tool and no call is parsed or run (a model trained with tool.enabled: false)',
    )
    .option('--limit <n>', 'only the first n problems', positiveInt())
    .option('--seed <n>', 'base sampling seed', seed(), 0)
    .option('--concurrency <n>', 'trajectories in flight', positiveInt(4096), 64)
    .option('--out <dir>', 'eval directory (default evals/<bench>-<model>-k<samples>-t<temperature>)')
    .option(
      '--no-retry-errors',
      'on resume, keep samples that failed for infrastructure reasons (engine error, sandbox unreachable) ' +
        'instead of regenerating them; they stay left out of the scores',
    )
    .option(
      '--verify-profile <name>',
      "answer checking: integer, strict, lenient or reference (what rStar2's reward accepts)",
      'strict',
    )
    .option(
      '--reward-module <file>',
      "score with this ES module's default export ({text, gold, row}) => reward instead of --verify-profile " +
        '(recorded as verifyProfile module:<path>)',
    )
    .option('--no-progress', 'no progress bar')
    .option('--list-benchmarks', 'print the named benchmarks found and exit');
  deprecatedAliases(evalCmd, { '--k <k>': '--samples', '--max-tokens <n>': '--max-response-tokens' });
  evalCmd.action(async (o) => {
    const { benchAliases, listBenchmarks, resolveBench } = await import('./bench.js');
    if (o.listBenchmarks) {
      for (const b of listBenchmarks()) {
        const also = benchAliases(b);
        console.log(`${b}\t${resolveBench(b)}${also.length ? `\t(also --bench ${also.join(', ')})` : ''}`);
      }
      return;
    }
    if (Boolean(o.bench) === Boolean(o.data))
      throw new Error('give exactly one of --bench NAME or --data FILE');
    const dataFile = resolve(o.data ?? resolveBench(o.bench));
    const bench: string = o.bench ?? dataFile.replace(/^.*\//, '').replace(/\.(jsonl|parquet)$/, '');
    const problems = await benchProblems(dataFile, o.limit);
    const out = resolve(
      o.out ?? `evals/${bench}-${modelTag(o.model, o.engine)}-k${o.samples}-t${o.temperature}`,
    );
    const release = lockDir(out, 'eval');
    const { openPolicy } = await import('./policy.js');
    const { MODULE_PROFILE, openVerifier } = await import('./verify.js');
    const { loadRewardModule } = await import('../reward/index.js');
    const { runEval } = await import('./run.js');
    const policy = await openPolicy({
      model: o.model && resolve(o.model), // the engine name is resume identity: the same path from any directory
      engine: o.engine,
      backend: o.backend,
      tokenizer: o.tokenizer,
      template: o.template,
      sandbox: o.sandbox,
      maxTurns: o.maxTurns,
      temperature: o.temperature,
      topP: o.topP,
      maxTokens: o.maxResponseTokens,
      tools: o.tool ? undefined : [],
      concurrency: o.concurrency,
    });
    const verifyProfile = o.rewardModule ? `${MODULE_PROFILE}${resolve(o.rewardModule)}` : o.verifyProfile;
    if (o.rewardModule) await loadRewardModule(resolve(o.rewardModule)); // a bad module fails here, not per sample
    const verifier = openVerifier(verifyProfile);
    const ac = new AbortController();
    // one signal spans every sample in flight, and each listens on it (engine and worker): --concurrency of them
    // are no leak, which Node's warning at 11 took them for
    setMaxListeners(4 * o.concurrency + 10, ac.signal);
    const onSig = () => ac.abort();
    process.once('SIGINT', onSig);
    try {
      const report = await runEval({
        outDir: out,
        config: {
          bench,
          dataFile,
          k: o.samples,
          temperature: o.temperature,
          topP: o.topP,
          maxTokens: o.maxResponseTokens,
          maxTurns: o.maxTurns,
          template: o.template,
          ...(o.tool ? {} : { tool: 'none' }), // recorded only when off: evals from before all showed the tool
          seed: o.seed,
          engine: policy.name,
          limit: o.limit,
          verifyProfile,
        },
        problems,
        rollout: policy.rollout,
        verify: verifier.verify,
        retryErrors: o.retryErrors,
        progress: o.progress,
        signal: ac.signal,
      });
      if (report.samples > 0) console.log(summary(report));
      console.log(`report: ${out}/report.md`);
      // an eval short of samples is no result: a script running it must not take its numbers as one
      if (report.failed > 0) {
        const again = o.retryErrors === false ? 'without --no-retry-errors' : 'the same command';
        throw new Error(
          `eval INCOMPLETE: ${failedNote(report)}; fix the cause and re-run ${again} to regenerate them`,
        );
      }
    } finally {
      process.off('SIGINT', onSig);
      await policy.close();
      await verifier.close();
      release();
    }
  });

  program
    .command('eval-rescore')
    .description('recompute report.json/report.md of a saved eval directory without generating')
    .argument('<dir>', 'eval directory written by rstar2 eval')
    .option('--reverify', 'also re-check every saved answer with the current verifier')
    .option(
      '--verify-profile <name>',
      "with --reverify: integer, strict, lenient or reference (default: the eval's own)",
    )
    .action(async (dir: string, o: { reverify?: boolean; verifyProfile?: string }) => {
      const { readEvalDir, rescoreEvalDir, reverifyEvalDir } = await import('./run.js');
      const { openVerifier } = await import('./verify.js');
      const { config } = readEvalDir(dir);
      // a data file that is gone (or a glob that no longer matches) leaves the saved gold answers to score by
      const problems = await benchProblems(config.dataFile, config.limit).catch((e: Error) => {
        if (e.message.startsWith('no problems:')) return undefined;
        throw e;
      });
      let report: EvalReport;
      if (o.reverify) {
        const profile = o.verifyProfile ?? config.verifyProfile ?? 'strict';
        const verifier = openVerifier(profile as VerifyProfile);
        try {
          report = await reverifyEvalDir(dir, verifier.verify, problems, profile);
        } finally {
          await verifier.close();
        }
      } else report = rescoreEvalDir(dir, problems);
      console.log(summary(report));
      if (report.failed > 0)
        console.error(`eval-rescore: ${failedNote(report)}; resume the eval to regenerate them`);
    });
}
