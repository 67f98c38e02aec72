import { existsSync, statSync } from 'node:fs';
import { resolve } from 'node:path';
import type { Command } from 'commander';
import { deprecatedAliases, positiveInt } from '../cli/index.js';
import type { VerifyProfile } from './types.js';

const CHUNK = 512;

export function registerRewardCommands(program: Command): void {
  const verify = program
    .command('verify')
    .description(
      'Verify answers: reads JSONL lines {"pred": ..., "gold": ...} (extra fields kept) and writes each line to ' +
        'stdout with "correct" and "reason" added (plus "extracted", "matched_by")',
    )
    .argument('<file>', 'JSONL file with pred and gold fields')
    .option(
      '--verify-profile <name>',
      'strict (default reward), lenient (PRIME leniencies), reference (PRIME or Math-Verify, as rStar2), integer (boxed integers only)',
      'strict',
    )
    .option('--extract-only', 'only extract the answer from pred; adds "extracted" and "source"')
    .option('--no-extract', 'pred is already a bare answer (skip extraction from a response)')
    .option('--timeout-ms <ms>', 'time limit per check', positiveInt(), 1000)
    .option('--workers <n>', 'worker threads (default: min(4, cores))', positiveInt())
    .option(
      '--reward-module <file>',
      "score with this ES module's default export ({text, gold, row}) => reward | {reward, correct?, reason?, " +
        'penalty?} instead of --verify-profile; row is the whole line; adds "reward"',
    );
  deprecatedAliases(verify, { '--profile <name>': '--verify-profile' });
  verify.action(
    async (
      file: string,
      o: {
        verifyProfile: string;
        extractOnly?: boolean;
        extract: boolean;
        timeoutMs: number;
        workers?: number;
        rewardModule?: string;
      },
    ) => {
      const { PROFILE_NAMES } = await import('./verify.js');
      if (!PROFILE_NAMES.includes(o.verifyProfile as VerifyProfile)) {
        throw new Error(
          `--verify-profile must be one of ${PROFILE_NAMES.join(', ')} (got ${JSON.stringify(o.verifyProfile)})`,
        );
      }
      await runVerify(file, {
        profile: o.verifyProfile as VerifyProfile,
        extractOnly: Boolean(o.extractOnly),
        extract: o.extract !== false,
        timeoutMs: o.timeoutMs,
        workers: o.workers,
        module: o.rewardModule && resolve(o.rewardModule),
      });
    },
  );
}

interface Line {
  pred?: unknown;
  gold?: unknown;
  [k: string]: unknown;
}

async function runVerify(
  file: string,
  o: {
    profile: VerifyProfile;
    extractOnly: boolean;
    extract: boolean;
    timeoutMs: number;
    workers?: number;
    module?: string;
  },
): Promise<void> {
  if (!existsSync(file)) throw new Error(`verify: file not found: ${file}`);
  if (statSync(file).isDirectory()) throw new Error(`verify: ${file} is a directory, not a JSONL file`);
  const { streamJsonlLines } = await import('../util/jsonl.js');
  const { extractAnswer } = await import('./extract.js');
  const { VerifierPool } = await import('./pool.js');
  if (o.module) await (await import('./custom.js')).loadRewardModule(o.module); // fails once, here, if it is bad
  const pool = o.extractOnly
    ? null
    : new VerifierPool({
        size: o.workers,
        defaults: { profile: o.profile, timeoutMs: o.timeoutMs, extract: o.extract, module: o.module },
      });
  let buf: { n: number; rec: Line }[] = [];
  const flush = async () => {
    if (!pool || buf.length === 0) return;
    const results = await pool.verifyBatch(
      buf.map(({ rec }) => ({ pred: String(rec.pred), gold: String(rec.gold), row: rec })),
    );
    const out = buf.map(({ rec }, i) => {
      const r = results[i];
      return JSON.stringify({
        ...rec,
        correct: r.correct,
        ...(r.reward !== undefined ? { reward: r.reward } : {}),
        reason: r.reason,
        extracted: r.extracted,
        matched_by: r.matchedBy,
      });
    });
    process.stdout.write(`${out.join('\n')}\n`);
    buf = [];
  };
  try {
    for await (const { line: n, value: rec } of streamJsonlLines<Line>(file)) {
      if (rec === null || typeof rec !== 'object' || typeof rec.pred !== 'string') {
        throw new Error(`${file}:${n}: each line needs a string "pred" field`);
      }
      if (o.extractOnly) {
        const ex = extractAnswer(rec.pred);
        process.stdout.write(
          `${JSON.stringify({ ...rec, extracted: ex?.answer ?? null, source: ex?.source ?? null })}\n`,
        );
        continue;
      }
      if (typeof rec.gold !== 'string' && typeof rec.gold !== 'number') {
        throw new Error(`${file}:${n}: missing "gold" field (string or number)`);
      }
      buf.push({ n, rec });
      if (buf.length >= CHUNK) await flush();
    }
    await flush();
  } finally {
    await pool?.close();
  }
}
