import { existsSync } from 'node:fs';
import type { Command } from 'commander';
import { streamJsonl } from '../util/jsonl.js';
import { extractAnswer } from './extract.js';
import { VerifierPool } from './pool.js';
import type { VerifyProfile } from './types.js';
import { PROFILE_NAMES } from './verify.js';

const CHUNK = 512;

export function registerRewardCommands(program: Command): void {
  program
    .command('verify')
    .description(
      'Verify answers: reads JSONL lines {"pred": ..., "gold": ...} (extra fields kept) and writes each line to ' +
        'stdout with "correct" and "reason" added (plus "extracted", "matched_by")',
    )
    .argument('<file>', 'JSONL file with pred and gold fields')
    .option(
      '--profile <name>',
      'strict (default reward), lenient (PRIME leniencies), reference (PRIME or Math-Verify, as rStar2), integer (boxed integers only)',
      'strict',
    )
    .option('--extract-only', 'only extract the answer from pred; adds "extracted" and "source"')
    .option('--no-extract', 'pred is already a bare answer (skip extraction from a response)')
    .option('--timeout-ms <n>', 'time limit per check in ms', '1000')
    .option('--workers <n>', 'worker threads (default: min(4, cores))')
    .action(async (file: string, o: Record<string, string | boolean | undefined>) => {
      if (!PROFILE_NAMES.includes(o.profile as VerifyProfile)) {
        throw new Error(
          `--profile must be one of ${PROFILE_NAMES.join(', ')} (got ${JSON.stringify(o.profile)})`,
        );
      }
      const profile = o.profile as VerifyProfile;
      const timeoutMs = Number(o.timeoutMs);
      if (!Number.isFinite(timeoutMs) || timeoutMs <= 0)
        throw new Error(`--timeout-ms must be a positive number`);
      await runVerify(file, {
        profile,
        extractOnly: Boolean(o.extractOnly),
        extract: o.extract !== false,
        timeoutMs,
        workers: o.workers ? Number(o.workers) : undefined,
      });
    });
}

interface Line {
  pred?: unknown;
  gold?: unknown;
  [k: string]: unknown;
}

async function runVerify(
  file: string,
  o: { profile: VerifyProfile; extractOnly: boolean; extract: boolean; timeoutMs: number; workers?: number },
): Promise<void> {
  if (!existsSync(file)) throw new Error(`verify: file not found: ${file}`);
  const pool = o.extractOnly
    ? null
    : new VerifierPool({
        size: o.workers,
        defaults: { profile: o.profile, timeoutMs: o.timeoutMs, extract: o.extract },
      });
  let buf: { n: number; rec: Line }[] = [];
  let n = 0;
  const flush = async () => {
    if (!pool) return;
    const results = await pool.verifyBatch(
      buf.map(({ rec }) => ({ pred: String(rec.pred), gold: String(rec.gold) })),
    );
    const out = buf.map(({ rec }, i) => {
      const r = results[i];
      return JSON.stringify({
        ...rec,
        correct: r.correct,
        reason: r.reason,
        extracted: r.extracted,
        matched_by: r.matchedBy,
      });
    });
    process.stdout.write(`${out.join('\n')}\n`);
    buf = [];
  };
  try {
    for await (const rec of streamJsonl<Line>(file)) {
      n++;
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
