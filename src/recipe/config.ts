import { existsSync, readFileSync } from 'node:fs';
import { isAbsolute, join } from 'node:path';
import YAML from 'yaml';
import { z } from 'zod';
import { TASK_KINDS } from './tasks.js';

// A recipe: model + data + an SFT stage followed by RL stages. Validated at the boundary; every default is
// visible through `rstar2 train --print-config`.

export const RECIPES_DIR = new URL('../../data/recipes/', import.meta.url).pathname;

const Levels = z.array(z.number().int().min(0).max(3)).min(1);

export const RocSchema = z
  .object({
    doDownSampling: z.boolean().default(true).describe('RoC master switch; off = plain GRPO (--roc off)'),
    rejectEqualReward: z.boolean().default(true),
    rocErrorRatio: z.boolean().default(true),
    rocAnswerFormat: z.boolean().default(true),
    minZeroRewardTraceNum: z.number().int().default(2),
    minNonZeroRewardTraceNum: z.number().int().default(2),
    negativeSelection: z.enum(['random', 'first']).default('random'),
    errorMatch: z.enum(['substring', 'flag']).default('substring'),
    noToolErrorPenalty: z.number().default(0.5),
    formatTurns: z.enum(['reference', 'paper']).default('paper'),
  })
  .strict();

const DataSchema = z
  .object({
    seed: z.number().int().default(1),
    levels: Levels.default([0, 1, 2, 3]),
    kinds: z
      .array(z.enum(TASK_KINDS))
      .min(1)
      .default([...TASK_KINDS]),
    /** 'all': any training problem; 'unsolved': only problems the current policy does not solve every time. */
    filter: z.enum(['all', 'unsolved']).default('all'),
    filterSamples: z.number().int().min(1).default(4).describe('samples per problem when filtering'),
    filterPool: z.number().int().min(1).default(256).describe('problems screened when filtering'),
  })
  .strict();

const SftStage = z
  .object({
    type: z.literal('sft'),
    name: z.string().default('sft'),
    steps: z.number().int().min(0).default(300),
    batchSize: z.number().int().min(1).default(32),
    lr: z.number().positive().default(1e-3),
    warmupSteps: z.number().int().min(0).default(20),
    demos: z.number().int().min(1).default(4000),
    demoMix: z
      .object({ direct: z.number().min(0), tool: z.number().min(0), recover: z.number().min(0) })
      .strict()
      .default({ direct: 0.4, tool: 0.4, recover: 0.2 }),
    echo: z
      .boolean()
      .default(false)
      .describe("responses restate the question's expression before answering or calling the tool"),
    data: DataSchema.default(DataSchema.parse({})),
    checkpointEvery: z.number().int().min(1).default(100),
  })
  .strict();

const RlStage = z
  .object({
    type: z.literal('rl'),
    name: z.string().default('rl'),
    steps: z.number().int().min(0).default(40),
    promptsPerStep: z.number().int().min(1).default(16),
    groupSize: z.number().int().min(2).default(8).describe('G: kept per prompt (down_sample_to_n)'),
    oversample: z.number().min(1).default(2).describe('rollouts per prompt = G × oversample when RoC is on'),
    maxResponseTokens: z.number().int().min(16).default(640),
    maxTurns: z.number().int().min(1).default(3),
    temperature: z.number().min(0).default(1),
    lr: z.number().positive().default(3e-4),
    warmupSteps: z.number().int().min(0).default(0),
    clipLow: z.number().default(0.2),
    clipHigh: z.number().default(0.28),
    miniBatches: z.number().int().min(1).default(1).describe('>1 takes several optimizer steps per RL step'),
    roc: RocSchema.default(RocSchema.parse({})),
    data: DataSchema.default(DataSchema.parse({})),
    checkpointEvery: z.number().int().min(1).default(5),
    evalEvery: z
      .number()
      .int()
      .min(0)
      .default(0)
      .describe('held-out eval every N steps (0 = stage end only)'),
  })
  .strict();

export const RecipeSchema = z
  .object({
    name: z.string().default('recipe'),
    seed: z.number().int().default(1),
    model: z
      .object({
        preset: z.enum(['tiny', 'small']).default('tiny'),
        init: z
          .string()
          .nullable()
          .default(null)
          .describe('checkpoint dir to start from instead of a fresh model'),
        threads: z.number().int().min(1).default(2),
      })
      .strict()
      .default({ preset: 'tiny', init: null, threads: 2 }),
    tokenizer: z
      .object({ template: z.enum(['compact', 'rstar2', 'qwen', 'quick']).default('compact') })
      .strict()
      .default({ template: 'compact' }),
    eval: z
      .object({
        n: z.number().int().min(1).default(200),
        seed: z.number().int().default(1),
        levels: Levels.default([0, 1, 2, 3]),
        kinds: z
          .array(z.enum(TASK_KINDS))
          .min(1)
          .default([...TASK_KINDS]),
        temperature: z.number().min(0).default(0),
        maxResponseTokens: z.number().int().min(16).default(640),
        maxTurns: z.number().int().min(1).default(3),
      })
      .strict()
      .default({
        n: 200,
        seed: 1,
        levels: [0, 1, 2, 3],
        kinds: [...TASK_KINDS],
        temperature: 0,
        maxResponseTokens: 640,
        maxTurns: 3,
      }),
    sandbox: z
      .object({
        workers: z.number().int().min(1).default(2),
        timeoutMs: z.number().int().min(100).default(4000),
      })
      .strict()
      .default({ workers: 2, timeoutMs: 4000 }),
    stages: z.array(z.discriminatedUnion('type', [SftStage, RlStage])).min(1),
  })
  .strict();

export type Recipe = z.infer<typeof RecipeSchema>;
export type Stage = Recipe['stages'][number];
export type SftStageConfig = z.infer<typeof SftStage>;
export type RlStageConfig = z.infer<typeof RlStage>;

export interface Overrides {
  roc?: 'on' | 'off';
}

export function parseRecipe(raw: unknown, source = '<recipe>', overrides: Overrides = {}): Recipe {
  const r = RecipeSchema.safeParse(raw);
  if (!r.success) {
    const msgs = r.error.issues.map((i) => `  ${i.path.join('.') || '(root)'}: ${i.message}`);
    throw new Error(`invalid recipe ${source}:\n${msgs.join('\n')}`);
  }
  const names = new Set<string>();
  for (const s of r.data.stages) {
    if (names.has(s.name)) throw new Error(`invalid recipe ${source}: duplicate stage name "${s.name}"`);
    names.add(s.name);
    if (s.type === 'rl' && s.roc.minZeroRewardTraceNum + s.roc.minNonZeroRewardTraceNum > s.groupSize) {
      throw new Error(
        `invalid recipe ${source}: stage ${s.name}: minZeroRewardTraceNum + minNonZeroRewardTraceNum must be <= groupSize`,
      );
    }
  }
  if (overrides.roc) {
    for (const s of r.data.stages) if (s.type === 'rl') s.roc.doDownSampling = overrides.roc === 'on';
  }
  return r.data;
}

/** A recipe by name (data/recipes/NAME.yaml) or by path (.yaml/.yml/.json). */
export function loadRecipe(nameOrPath: string, overrides: Overrides = {}): Recipe {
  const candidates =
    nameOrPath.includes('/') || /\.(ya?ml|json)$/.test(nameOrPath) || isAbsolute(nameOrPath)
      ? [nameOrPath]
      : [join(RECIPES_DIR, `${nameOrPath}.yaml`), join(RECIPES_DIR, `${nameOrPath}.yml`)];
  const path = candidates.find((p) => existsSync(p));
  if (!path) throw new Error(`recipe not found: ${nameOrPath} (looked at ${candidates.join(', ')})`);
  let raw: unknown;
  try {
    raw = path.endsWith('.json')
      ? JSON.parse(readFileSync(path, 'utf8'))
      : YAML.parse(readFileSync(path, 'utf8'));
  } catch (e) {
    throw new Error(`cannot parse recipe ${path}: ${(e as Error).message}`);
  }
  return parseRecipe(raw, path, overrides);
}
