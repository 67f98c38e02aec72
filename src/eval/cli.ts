import { resolve } from 'node:path';
import { type Command, InvalidArgumentError } from 'commander';
import { loadProblems } from '../data/index.js';
import type { VerifyProfile } from '../reward/types.js';
import { EVAL_MAX_TOKENS, openBackend } from './backend.js';
import { listBenchmarks, resolveBench } from './bench.js';
import { readEvalDir, rescoreEvalDir, reverifyEvalDir, runEval } from './run.js';
import type { BenchProblem, EvalReport } from './score.js';
import { openVerifier } from './verify.js';

const num =
  (name: string, lo: number, hi: number, int = false) =>
  (v: string) => {
    const x = Number(v);
    if (v.trim() === '' || !Number.isFinite(x) || x < lo || x > hi || (int && !Number.isInteger(x))) {
      throw new InvalidArgumentError(`${name} must be ${int ? 'an integer' : 'a number'} in [${lo}, ${hi}]`);
    }
    return x;
  };

// Through src/data's async loader, so --data may be Parquet, a directory or a glob in any layout it reads.
async function benchProblems(spec: string, limit?: number): Promise<BenchProblem[]> {
  const ps = await loadProblems(spec, { requireAnswer: true, limit });
  return ps.map((p) => ({ id: p.id, problem: p.question, answer: p.answer as string }));
}

function summary(r: EvalReport): string {
  const pct = (x: number) => `${(100 * x).toFixed(1)}%`;
  return (
    `${r.bench}: avg@${r.k} ${pct(r.avgAtK)}  pass@${r.k} ${pct(r.passAtK[String(r.k)] ?? 0)}  maj@${r.k} ${pct(r.majAtK)}  ` +
    `tokens ${r.meanResponseTokens.toFixed(0)}  tool calls ${r.toolCallsPerAnswer.toFixed(2)}  ` +
    `tool errors ${pct(r.toolErrorRate)}  (${r.problems} problems, ${r.samples} samples, ${r.wallTimeS.toFixed(1)} s)`
  );
}

export function registerEvalCommands(program: Command): void {
  program
    .command('eval')
    .description(
      'sample k answers per benchmark problem with the Python tool and report avg@k, pass@k, maj@k (resumable)',
    )
    .option('--model <dir>', 'checkpoint directory (embedded engine)')
    .option(
      '--engine <url>',
      'served engine: sglang+http://h:p, vllm+http://h:p, llamacpp+http://h:p, a plain URL (see --backend), or fake:ACC (dry run)',
    )
    .option('--backend <name>', 'backend of a plain --engine URL: sglang, vllm, llamacpp', 'sglang')
    .option('--tokenizer <path>', 'tokenizer.json or its directory (default: --model)')
    .option('--template <name>', 'chat template: rstar2, qwen, compact, tokenizer, or a file', 'rstar2')
    .option('--sandbox <where>', "'embedded' (local bubblewrap pool) or a sandbox service URL", 'embedded')
    .option('--max-turns <n>', 'assistant turns per trajectory', num('--max-turns', 1, 1000, true), 5)
    .option('--bench <name>', 'named benchmark: aime24, aime25, hmmt25, math500, ...')
    .option(
      '--data <file>',
      'problems with gold answers: a .jsonl or .parquet file, a directory of them, or a glob; verl, DAPO-Math ' +
        'or plain {id, problem, answer} rows',
    )
    .option('--k <n>', 'samples per problem', num('--k', 1, 1024, true), 16)
    .option(
      '--temperature <t>',
      'sampling temperature (0 = greedy: k identical samples)',
      num('--temperature', 0, 10),
      0.6,
    )
    .option('--top-p <p>', 'nucleus sampling top-p', num('--top-p', 0, 1), 0.95)
    .option(
      '--max-tokens <n>',
      'response budget per trajectory, all turns and tool tokens',
      num('--max-tokens', 1, 1e7, true),
      EVAL_MAX_TOKENS,
    )
    .option('--limit <n>', 'only the first N problems', num('--limit', 1, 1e9, true))
    .option('--seed <n>', 'base sampling seed', num('--seed', 0, 2 ** 31, true), 0)
    .option('--concurrency <n>', 'trajectories in flight', num('--concurrency', 1, 4096, true), 64)
    .option('--out <dir>', 'eval directory (default evals/<bench>-k<k>-t<temperature>)')
    .option(
      '--no-retry-errors',
      'on resume, keep samples that ended in an engine error instead of regenerating them',
    )
    .option(
      '--verify-profile <name>',
      "answer checking: integer, strict, lenient or reference (what rStar2's reward accepts)",
      'strict',
    )
    .option('--no-progress', 'no progress bar')
    .option('--list-benchmarks', 'print the named benchmarks found and exit')
    .action(async (o) => {
      if (o.listBenchmarks) {
        for (const b of listBenchmarks()) console.log(`${b}\t${resolveBench(b)}`);
        return;
      }
      if (Boolean(o.bench) === Boolean(o.data))
        throw new Error('give exactly one of --bench NAME or --data FILE');
      const dataFile = resolve(o.data ?? resolveBench(o.bench));
      const bench: string = o.bench ?? dataFile.replace(/^.*\//, '').replace(/\.(jsonl|parquet)$/, '');
      const problems = await benchProblems(dataFile, o.limit);
      const out = resolve(o.out ?? `evals/${bench}-k${o.k}-t${o.temperature}`);
      const backend = await openBackend({
        model: o.model,
        engine: o.engine,
        backend: o.backend,
        tokenizer: o.tokenizer,
        template: o.template,
        sandbox: o.sandbox,
        maxTurns: o.maxTurns,
        temperature: o.temperature,
        topP: o.topP,
        maxTokens: o.maxTokens,
        concurrency: o.concurrency,
      });
      const verifier = openVerifier(o.verifyProfile);
      const ac = new AbortController();
      const onSig = () => ac.abort();
      process.once('SIGINT', onSig);
      try {
        const report = await runEval({
          outDir: out,
          config: {
            bench,
            dataFile,
            k: o.k,
            temperature: o.temperature,
            topP: o.topP,
            maxTokens: o.maxTokens,
            maxTurns: o.maxTurns,
            template: o.template,
            seed: o.seed,
            engine: backend.name,
            limit: o.limit,
            verifyProfile: o.verifyProfile,
          },
          problems,
          rollout: backend.rollout,
          verify: verifier.verify,
          retryErrors: o.retryErrors,
          progress: o.progress,
          signal: ac.signal,
        });
        console.log(summary(report));
        console.log(`report: ${out}/report.md`);
      } finally {
        process.off('SIGINT', onSig);
        await backend.close();
        await verifier.close();
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
      const { config } = readEvalDir(dir);
      // a data file that is gone (or a glob that no longer matches) leaves the saved gold answers to score by
      const problems = await benchProblems(config.dataFile, config.limit).catch((e: Error) => {
        if (e.message.startsWith('no problems:')) return undefined;
        throw e;
      });
      let report: EvalReport;
      if (o.reverify) {
        const verifier = openVerifier((o.verifyProfile ?? config.verifyProfile ?? 'strict') as VerifyProfile);
        try {
          report = await reverifyEvalDir(dir, verifier.verify, problems);
        } finally {
          await verifier.close();
        }
      } else report = rescoreEvalDir(dir, problems);
      console.log(summary(report));
    });
}
