import { existsSync, readFileSync } from 'node:fs';
import { dirname, isAbsolute, join, resolve } from 'node:path';
import YAML from 'yaml';
import { z } from 'zod';
import { SFT_TEMPLATES } from '../data/index.js';
import { RocSchema } from '../rl/index.js';
import { MODULE_NAME } from '../sandbox/index.js';
import { PYTHON_TOOL_NAME, rolloutToolSchema, type ToolSchema } from '../tokenizer/index.js';
import { COMPILE_MODES, LOSS_AGGS, MODEL_IMPLS, PRECISIONS, TrainOptionsSchema } from '../worker/index.js';
import { TASK_KINDS } from './tasks.js';

// A recipe: model + data + an SFT stage followed by RL stages. Validated at the boundary; every default is
// visible through `rstar2 train --print-config`.

export const RECIPES_DIR = new URL('../../data/recipes/', import.meta.url).pathname;

export { RocSchema };

export const LOGGERS = ['jsonl', 'tensorboard', 'wandb'] as const;
export type LoggerName = (typeof LOGGERS)[number];

const Levels = z.array(z.number().int().min(0).max(3)).min(1);

const FieldMapSchema = z
  .object({
    id: z.string().describe("dotted path of a row's id"),
    question: z.string().describe("dotted path of a row's question"),
    answer: z.string().describe("dotted path of a row's gold answer"),
    source: z.string().describe("dotted path of a row's source name"),
  })
  .partial()
  .strict();

const Files = z
  .preprocess((v) => (typeof v === 'string' ? [v] : v), z.array(z.string()).min(1).nullable())
  .default(null);

/** Where problems come from: files (any layout data/ reads) or, with `files: null`, the built-in task generator. */
const FileFields = {
  files: Files.describe('JSONL/Parquet paths or globs (verl, DAPO or plain rows; chat messages for SFT)'),
  layout: z
    .enum(['auto', 'verl', 'dapo', 'plain'])
    .default('auto')
    .describe("the files' row layout; 'auto' detects it per row"),
  map: FieldMapSchema.default({}).describe('dotted paths overriding where question/answer/id are read'),
  limit: z.number().int().min(1).nullable().default(null).describe('read at most this many rows'),
  generate: z
    .boolean()
    .default(true)
    .describe('with no files, use the built-in arithmetic task generator (false: files are required)'),
};

const DataSchema = z
  .object({
    ...FileFields,
    weights: z
      .array(z.number().min(0))
      .min(1)
      .nullable()
      .default(null)
      .describe(
        "one per entry of files: a step's prompts (an SFT batch's examples) come from each entry in this proportion, uniformly within it; null = all rows alike",
      ),
    integerOnly: z.boolean().default(false).describe('keep only problems whose answer is an integer'),
    dedupe: z.boolean().default(true).describe('drop repeated questions (after normalising case and spaces)'),
    maxPromptTokens: z.number().int().min(1).nullable().default(null).describe('drop longer prompts'),
    seed: z
      .number()
      .int()
      .default(1)
      .describe("the task generator's seed, and which problems of files the unsolved filter screens"),
    levels: Levels.default([0, 1, 2, 3]).describe(
      'generated tasks: difficulty levels to draw from (0 = smallest numbers)',
    ),
    kinds: z
      .array(z.enum(TASK_KINDS))
      .min(1)
      .default([...TASK_KINDS])
      .describe('generated tasks: the kinds to draw from'),
    /** 'all': any training problem; 'unsolved': only problems the current policy does not solve every time. */
    filter: z
      .enum(['all', 'unsolved'])
      .default('all')
      .describe(
        "'unsolved': keep only problems the policy at stage start does not solve in every one of filterSamples tries (the paper's filter)",
      ),
    filterSamples: z.number().int().min(1).default(4).describe('samples per problem when filtering'),
    filterPool: z.number().int().min(1).default(256).describe('problems screened when filtering'),
  })
  .strict();

// Both stage types: verl's warmup_style constant | cosine, counted in the stage's own steps so a resume goes on
// along the same curve.
const lrSchedule = {
  lrSchedule: z
    .enum(['constant', 'cosine'])
    .default('constant')
    .describe(
      "'cosine': lr falls on a half cosine from lr at the stage's first step to minLr at its last (a gated stage's cap); warmup still scales the first steps",
    ),
  minLr: z.number().min(0).default(0).describe('where a cosine schedule ends'),
};

const SftStage = z
  .object({
    type: z.literal('sft'),
    name: z.string().default('sft').describe('names the stage in --set, --stages, checkpoints and metrics'),
    steps: z
      .number()
      .int()
      .min(0)
      .default(300)
      .describe('optimizer steps (with a gate: the most it may take)'),
    batchSize: z.number().int().min(1).default(32).describe('examples per step'),
    sampler: z
      .enum(['epoch', 'independent'])
      .default('epoch')
      .describe(
        "how a step's examples are drawn: 'epoch' walks a seeded shuffle of the examples without replacement, reshuffled each epoch, a short last batch dropped (verl's SFT dataloader), so every example is seen once an epoch; 'independent' draws each example of each step afresh, with replacement (what this project did before: of a large mix most is never seen)",
      ),
    maxTokens: z
      .number()
      .int()
      .min(1)
      .nullable()
      .default(16384)
      .describe(
        'examples whose rendered conversation is longer than this many tokens are dropped before training, and the count said (verl max_length with filtering; a truncated example would teach a cut-off answer); null keeps all',
      ),
    lr: z.number().positive().default(1e-3).describe('AdamW learning rate'),
    ...lrSchedule,
    warmupSteps: z.number().int().min(0).default(20).describe('steps over which lr rises linearly from 0'),
    template: z
      .enum(SFT_TEMPLATES)
      .default('rl')
      .describe(
        "how examples are rendered: 'rl' as rollouts of tokenizer.template (its prompt, the example's tools or else the rollout tool, one user turn); 'model' (the model directory's own chat template) or 'qwen' render each conversation whole with its own tools or none, any number of turns; loss on every assistant turn",
      ),
    demos: z
      .number()
      .int()
      .min(1)
      .default(4000)
      .describe('with no files: how many demos the task generator writes'),
    demoMix: z
      .object({ direct: z.number().min(0), tool: z.number().min(0), recover: z.number().min(0) })
      .strict()
      .default({ direct: 0.4, tool: 0.4, recover: 0.2 })
      .describe(
        'generated demos: shares that answer directly, call the tool once, or make a failing call and then fix it',
      ),
    echo: z
      .boolean()
      .default(false)
      .describe("responses restate the question's expression before answering or calling the tool"),
    trainFailedCalls: z
      .number()
      .min(0)
      .max(1)
      .default(0)
      .describe(
        'the share of recovery demos whose failing call is trained; the rest show it with weight 0, so they teach the fix without teaching the failure',
      ),
    data: DataSchema.default(DataSchema.parse({})),
    optimizer: z
      .enum(['continue', 'fresh'])
      .default('continue')
      .describe(
        "'fresh': a new AdamW and step count at stage start, so warmupSteps apply (a new run, as the reference launches each stage)",
      ),
    checkpointEvery: z.number().int().min(1).default(100).describe('steps between checkpoints'),
    gate: z
      .object({
        loss: z
          .number()
          .positive()
          .nullable()
          .default(null)
          .describe('the stage may end once held-out loss per trained token is at or below this'),
        exact: z
          .number()
          .gt(0)
          .max(1)
          .nullable()
          .default(null)
          .describe(
            "the stage may end once this fraction of held-out examples has every trained assistant turn after the first (of a one-turn example, that turn) as the model's greedy choice under teacher forcing: for tool demos the tool's result copied into the answer exactly, for retries also the fixed call (a first turn with weight 0 is not scored, and the turns after it are)",
          ),
        every: z.number().int().min(1).default(25).describe('steps between held-out checks'),
        heldout: z.number().int().min(1).default(64).describe('demos held out of training for the check'),
        on: z
          .enum(['all', 'tool', 'retry'])
          .default('all')
          .describe(
            "'tool': held-out examples that call a tool (the skill an agent needs before RL); 'retry': those that call it more than once (a failed call, then its fix)",
          ),
        restart: z
          .object({
            loss: z.number().gt(0).describe('the held-out loss a start must reach'),
            within: z.number().int().min(1).describe('steps it has to get there'),
            max: z.number().int().min(1).default(2).describe('re-initialisations at most'),
          })
          .strict()
          .nullable()
          .default(null)
          .describe(
            'a first stage from a preset: if no held-out check within `within` steps of the (re)start reaches `loss`, re-initialise the model (new seed, fresh optimizer) and go on counting steps toward the cap',
          ),
        restoreBest: z
          .boolean()
          .default(false)
          .describe(
            'at the cap without the gate, go on from the best held-out check (exact if the gate has it, else loss) instead of the last step; each new best is checkpointed',
          ),
      })
      .strict()
      .refine((g) => g.loss != null || g.exact != null, { message: 'a gate needs loss, exact or both' })
      .nullable()
      .default(null)
      .describe(
        'a skill gate, checked on held-out demos: the stage ends when every threshold given is met; `steps` becomes a cap, and a stage that hits it without the gate warns',
      ),
  })
  .strict();

const RlStage = z
  .object({
    type: z.literal('rl'),
    name: z.string().default('rl').describe('names the stage in --set, --stages, checkpoints and metrics'),
    steps: z.number().int().min(0).default(40).describe('RL steps: rollout, reward, RoC, update'),
    promptsPerStep: z
      .number()
      .int()
      .min(1)
      .default(16)
      .describe('prompts per step (more than the data holds is refused)'),
    groupSize: z.number().int().min(2).default(8).describe('G: kept per prompt (down_sample_to_n)'),
    oversample: z.number().min(1).default(2).describe('rollouts per prompt = G × oversample when RoC is on'),
    maxResponseTokens: z
      .number()
      .int()
      .min(16)
      .default(640)
      .describe("a trajectory's token budget over all its turns, tool output included"),
    maxTurns: z.number().int().min(1).default(3).describe('assistant turns per trajectory at most'),
    temperature: z.number().min(0).default(1).describe("rollouts' sampling temperature"),
    topP: z
      .number()
      .gt(0)
      .max(1)
      .default(1)
      .describe("rollouts' nucleus sampling (verl's rollout.top_p); 1 = off, as the paper"),
    lr: z.number().positive().default(3e-4).describe('AdamW learning rate'),
    ...lrSchedule,
    warmupSteps: z.number().int().min(0).default(0).describe('steps over which lr rises linearly from 0'),
    clipLow: TrainOptionsSchema.shape.clipLow.describe('PPO ratio clip below: 1 - clipLow'),
    clipHigh: TrainOptionsSchema.shape.clipHigh.describe('PPO ratio clip above: 1 + clipHigh (clip-higher)'),
    miniBatches: z.number().int().min(1).default(1).describe('>1 takes several optimizer steps per RL step'),
    epochs: z
      .number()
      .int()
      .min(1)
      .default(1)
      .describe(
        "verl's ppo_epochs: passes over a step's kept trajectories, each in miniBatches optimizer steps, the ratio against the same old log-probs; 1 = the paper",
      ),
    kl: z
      .object({
        coef: z.number().min(0).default(0).describe("verl's kl_loss_coef; 0 = off, as the paper"),
        estimator: z
          .enum(['k1', 'k3'])
          .default('k3')
          .describe("k1 = log π - log π_ref (verl's 'kl'); k3 = r - log r - 1 (verl's 'low_var_kl')"),
        reference: z
          .enum(['initial', 'stage'])
          .default('initial')
          .describe(
            "π_ref: the weights the run's first RL stage started from (verl's reference policy), or those this stage started from",
          ),
      })
      .strict()
      .default({ coef: 0, estimator: 'k3', reference: 'initial' })
      .describe(
        'a KL loss against a reference policy, held by a second worker process (one more copy of the weights)',
      ),
    entropyCoef: z
      .number()
      .min(0)
      .default(0)
      .describe(
        "verl's entropy_coeff: minus this times the policy's entropy in the loss; 0 = off, as the paper",
      ),
    optimizer: z
      .enum(['continue', 'fresh'])
      .default('continue')
      .describe(
        "'fresh': a new AdamW and step count at stage start, so warmupSteps apply (a new run, as the reference launches each stage)",
      ),
    oldLogprobs: z
      .enum(['engine', 'recompute'])
      .default('engine')
      .describe(
        "the ratio's denominator: the engine's sampling logprobs, or recomputed by the trainer before the update (reference)",
      ),
    lossAgg: z
      .enum(LOSS_AGGS, {
        // the old name claimed verl's scaling, which divides by the nominal batch, not by what RoC kept
        error: (i) =>
          i.input === 'verl'
            ? "'verl' was renamed: 'micro-mean-batch' is what it computed (micro-batches weighted by their share of the kept sequences); verl's own scaling is 'micro-mean-nominal'"
            : undefined,
      })
      .default('token-mean')
      .describe(
        "'token-mean' over every trained token of the step; 'micro-mean-nominal' as verl: each micro-batch's token-mean times its sequences / (prompts × rollouts per prompt), so a step that RoC and the equal-reward filter cut weighs less; 'micro-mean-batch': the same over the kept sequences",
      ),
    sampler: z
      .enum(['epoch', 'independent'])
      .default('epoch')
      .describe(
        "how a step's prompts are drawn: 'epoch' walks a seeded shuffle of the pool without replacement, reshuffled each epoch, a short last batch dropped (verl's shuffled dataloader); 'independent' draws each step's prompts afresh",
      ),
    sandboxFaults: z
      .enum(['drop', 'keep'])
      .default('drop')
      .describe(
        "a sample with a tool call the sandbox failed to run (internal_error, busy, queue_timeout): 'drop' leaves it out of its group and counts it in `failed` (an outage is not the policy's doing); 'keep' scores and trains it on its text like any other, as the reference does (code-judge's failure text is the tool's answer). A sample the engine failed is always left out",
      ),
    emptyStep: z
      .enum(['skip', 'redraw'])
      .default('skip')
      .describe(
        'a step whose groups are all rejected: counted and skipped, or redrawn with new prompts and not counted (reference)',
      ),
    roc: RocSchema.default(RocSchema.parse({})),
    data: DataSchema.default(DataSchema.parse({})),
    checkpointEvery: z.number().int().min(1).default(5).describe('steps between checkpoints'),
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
    name: z.string().default('recipe').describe("the default run directory's name: runs/NAME-roc-TIME"),
    seed: z
      .number()
      .int()
      .default(1)
      .describe('seeds initialisation, demo mixing, batches and sampling (--seed overrides)'),
    logger: z
      .preprocess(
        // "tensorboard,wandb" from --logger or --set; jsonl is always written (resume and the dashboard read it)
        (v) => (typeof v === 'string' ? v.split(',').map((s) => s.trim()) : v),
        z.array(z.enum(LOGGERS)).transform((l) => [...new Set(['jsonl' as const, ...l])]),
      )
      .default(['jsonl'])
      .describe(
        'where step metrics go: jsonl (metrics.jsonl, always), tensorboard (<run>/tensorboard/); wandb is refused with how to sync the TensorBoard files instead',
      ),
    model: z
      .object({
        path: z
          .string()
          .nullable()
          .default(null)
          .describe(
            'a Hugging Face model directory (config.json, safetensors, tokenizer.json); null = preset',
          ),
        preset: z
          .enum(['tiny', 'small', 'tiny-qwen3'])
          .default('tiny')
          .describe('a fresh model when path is null'),
        requirePath: z
          .boolean()
          .default(false)
          .describe(
            'refuse to train or dry-run without model.path (a recipe for a real base model, as paper)',
          ),
        backend: z
          .enum(MODEL_IMPLS)
          .default('native')
          .describe(
            "how model.path loads: 'native' (built-in Qwen2/Qwen3) or 'transformers' (AutoModelForCausalLM, other architectures; needs transformers; trains and scores only, so RL rolls out on --engines)",
          ),
        threads: z.number().int().min(1).default(2).describe("the policy worker's torch CPU threads"),
        precision: z
          .enum(PRECISIONS)
          .default('fp32')
          .describe(
            "'bf16-mixed': bf16 autocast over fp32 weights and AdamW state; 'bf16': weights and AdamW state in bf16",
          ),
        compile: z
          .enum(COMPILE_MODES)
          .default('auto')
          .describe(
            "torch.compile of the decoder layer's pieces and the log-prob slices: 'auto' on GPUs, 'on' on any device, 'off'; where it fails the worker says so once and runs uncompiled",
          ),
        gradientCheckpointing: z
          .boolean()
          .default(false)
          .describe(
            'recompute each decoder layer in backward: activation memory of one layer, ~1.3x the compute',
          ),
        maxTokensPerMicroBatch: z
          .number()
          .int()
          .min(1)
          .nullable()
          .default(null)
          .describe(
            'training micro-batches packed to this many tokens with no padding; null = padded, length-grouped',
          ),
        nprocPerNode: z
          .number()
          .int()
          .min(1)
          .default(1)
          .describe(
            'policy worker ranks on this node, data-parallel (`rstar2 train --nproc-per-node` overrides)',
          ),
        sharding: z
          .enum(['ddp', 'fsdp'])
          .default('ddp')
          .describe(
            'ddp: a replica per rank; fsdp: parameters, gradients and optimizer sharded (torch >= 2.2, GPUs)',
          ),
        offloadOptimizer: z
          .boolean()
          .default(false)
          .describe('fsdp: CPU offload of shards, gradients and optimizer'),
      })
      .strict()
      .default({
        path: null,
        preset: 'tiny',
        requirePath: false,
        backend: 'native',
        threads: 2,
        precision: 'fp32',
        compile: 'auto',
        gradientCheckpointing: false,
        maxTokensPerMicroBatch: null,
        nprocPerNode: 1,
        sharding: 'ddp',
        offloadOptimizer: false,
      }),
    tokenizer: z
      .object({
        template: z
          .enum(['compact', 'rstar2', 'qwen', 'quick', 'model'])
          .default('compact')
          .describe(
            "chat template; 'model' = the model directory's own (chat_template.jinja, else tokenizer_config.json's)",
          ),
        kind: z
          .enum(['char', 'bpe'])
          .default('char')
          .describe(
            "presets only (a model directory brings its tokenizer): characters, or byte-level BPE trained on the recipe's data files",
          ),
        vocabSize: z.number().int().min(300).default(1024).describe('bpe: vocabulary size'),
        toolCallStyle: z
          .enum(['compact', 'template'])
          .default('compact')
          .describe(
            "how SFT data's tool calls are written: as rollouts of our models do, or as the template renders them",
          ),
      })
      .strict()
      .default({ template: 'compact', kind: 'char', vocabSize: 1024, toolCallStyle: 'compact' }),
    tool: z
      .object({
        enabled: z
          .boolean()
          .default(true)
          .describe(
            'false: no tool at all: prompts carry no tool schema and no tool call is parsed or run, so every sample is one turn (plain single-turn tasks)',
          ),
        name: z
          .string()
          .default(PYTHON_TOOL_NAME)
          .describe(
            'the tool prompts show and rollouts run (the sandboxed python tool, under this name); a call to any other name is a tool error',
          ),
        schema: z
          .union([z.string(), z.record(z.string(), z.unknown())])
          .nullable()
          .default(null)
          .describe(
            "how prompts describe it: null = the reference's schema under tool.name; else a JSON file or an object {type: function, function: {name, description, parameters}} whose parameters take code (and input)",
          ),
      })
      .strict()
      .default({ enabled: true, name: PYTHON_TOOL_NAME, schema: null }),
    eval: z
      .object({
        ...FileFields,
        n: z.number().int().min(1).default(200).describe('problems (the first n of files, or generated)'),
        seed: z.number().int().default(1).describe("the task generator's seed for generated problems"),
        levels: Levels.default([0, 1, 2, 3]).describe(
          'generated problems: difficulty levels (0 = smallest numbers)',
        ),
        kinds: z
          .array(z.enum(TASK_KINDS))
          .min(1)
          .default([...TASK_KINDS])
          .describe('generated problems: the kinds to draw from'),
        temperature: z
          .number()
          .min(0)
          .default(0)
          .describe('sampling temperature of held-out samples (0 = greedy)'),
        topP: z.number().gt(0).max(1).default(1).describe('nucleus sampling of held-out samples; 1 = off'),
        samples: z.number().int().min(1).default(1).describe('samples per problem: accuracy is avg@k pass@1'),
        maxResponseTokens: z
          .number()
          .int()
          .min(16)
          .default(640)
          .describe("a held-out sample's token budget over all its turns"),
        maxTurns: z.number().int().min(1).default(3).describe('assistant turns per held-out sample at most'),
        atStart: z
          .boolean()
          .default(true)
          .describe(
            "an eval before an RL stage's first step (the baseline its gain is measured from); false skips it",
          ),
      })
      .strict()
      .default({
        files: null,
        layout: 'auto',
        map: {},
        limit: null,
        generate: true,
        n: 200,
        seed: 1,
        levels: [0, 1, 2, 3],
        kinds: [...TASK_KINDS],
        temperature: 0,
        topP: 1,
        samples: 1,
        maxResponseTokens: 640,
        maxTurns: 3,
        atStart: true,
      }),
    health: z
      .object({
        zeroRewardSteps: z
          .number()
          .int()
          .min(1)
          .default(3)
          .describe('warn after this many RL steps at reward 0'),
        strict: z.boolean().default(false).describe('stop the run (exit 3) at the first warning'),
        stallMinutes: z
          .number()
          .positive()
          .default(30)
          .describe('warn when no step finishes for this long; the dashboard marks the run stalled'),
      })
      .strict()
      .default({ zeroRewardSteps: 3, strict: false, stallMinutes: 30 }),
    data: z
      .object({
        sft: Files.describe('chat-message files for every SFT stage that names none'),
        train: Files.describe('problem files for every RL stage that names none'),
        weights: z
          .array(z.number().min(0))
          .min(1)
          .nullable()
          .default(null)
          .describe('one per entry of train: the mix of sources in those stages (their data.weights)'),
      })
      .strict()
      .default({ sft: null, train: null, weights: null })
      .describe('shorthand: --set data.train=FILE fills each stage without its own files'),
    reward: z
      .object({
        profile: z
          .enum(['integer', 'strict', 'lenient', 'reference'])
          .default('strict')
          .describe("reward/'s verifier profile; one function scores train, eval and rollout"),
        timeoutMs: z
          .number()
          .int()
          .min(100)
          .default(1000)
          .describe(
            "time limit per check; past it (+1 s grace the check's worker thread is replaced) the trajectory scores 0 and the step counts it in reward_timeouts",
          ),
        module: z
          .string()
          .nullable()
          .default(null)
          .describe(
            'an ES module whose default export ({text, gold, row}) => reward | {reward, correct?, reason?, penalty?} scores instead of profile, on the same threads under the same time limit',
          ),
      })
      .strict()
      .default({ profile: 'strict', timeoutMs: 1000, module: null }),
    sandbox: z
      .object({
        workers: z.number().int().min(1).default(2).describe('sandbox slots: tool calls run at once'),
        timeoutMs: z.number().int().min(100).default(4000).describe("a tool call's wall-clock limit"),
        memoryMb: z
          .number()
          .int()
          .min(1)
          .default(1024)
          .describe(
            "address-space limit per process of a tool call (RLIMIT_AS), and as root the resident memory of all of a call's processes",
          ),
        preload: z
          .array(z.string().regex(MODULE_NAME, 'a module name'))
          .default([])
          .describe('modules the sandbox imports once, for every tool call (e.g. sympy, numpy)'),
        demoteAfterMs: z
          .number()
          .int()
          .min(0)
          .default(50)
          .describe(
            'a tool call still running after this many ms, having computed for a tenth of it, gets the lowest CPU priority, so short calls pass a busy one; 0 = never (long honest calls on a full sandbox then keep their share)',
          ),
      })
      .strict()
      .default({ workers: 2, timeoutMs: 4000, memoryMb: 1024, preload: [], demoteAfterMs: 50 }),
    weightSync: z
      .object({
        dtype: z
          .enum(['auto', 'bfloat16', 'float16', 'float32'])
          .default('auto')
          .describe(
            "what a broadcast sends the engines (--engines): their dtype; 'auto' = the model's own as they read it, float32 checkpoints as float16",
          ),
        bucketMiB: z
          .number()
          .int()
          .min(1)
          .default(512)
          .describe(
            'the most one engine update call carries: SGLang holds all of a call on the GPU beside its KV pool before loading it',
          ),
      })
      .strict()
      .default({ dtype: 'auto', bucketMiB: 512 }),
    stages: z.array(z.discriminatedUnion('type', [SftStage, RlStage])).min(1),
  })
  .strict();

export type Recipe = z.infer<typeof RecipeSchema>;
export type Stage = Recipe['stages'][number];
export type SftStageConfig = z.infer<typeof SftStage>;
export type RlStageConfig = z.infer<typeof RlStage>;

export interface Overrides {
  roc?: 'on' | 'off';
  /** `path=value` pairs (`--set`): dotted paths into the recipe, stages by index or name, values as YAML. */
  set?: string[];
  /** Only these stages, by name (`--stages sft,stage1-8k`), in the recipe's order. */
  stages?: string[];
  /** Data not given yet is let through, to be shown as what is to be filled in (`--print-config`). */
  incomplete?: boolean;
}

const STAGE_TYPES = { sft: SftStage, rl: RlStage } as const;
type Node = Record<string | number, unknown>;
const stageType = (x: unknown) => (x as { type?: string })?.type as keyof typeof STAGE_TYPES | undefined;
const isStage = (x: unknown) => stageType(x) === 'sft' || stageType(x) === 'rl';
// a stage written without a name has its type's default name ('sft', 'rl')
const stageName = (x: unknown) => (x as { name?: string })?.name ?? stageType(x);

/** The fields of the object schema under wrappers (default, nullable, preprocess), or null for a value. */
function shapeOf(s: z.ZodType | undefined): Record<string, z.ZodType> | null {
  for (let i = 0; s && i < 8; i++) {
    const d = s.def as { type: string; innerType?: z.ZodType; out?: z.ZodType };
    if (d.type === 'object') return (s as unknown as { shape: Record<string, z.ZodType> }).shape;
    s = d.innerType ?? d.out;
  }
  return null;
}

/** The fields the section at `path` of a raw recipe takes (a stage's by its type), for errors that list them. */
function fieldsAt(raw: unknown, path: PropertyKey[]): string[] {
  let shape = shapeOf(RecipeSchema);
  let node = raw as Node | undefined;
  for (let i = 0; i < path.length && shape; i++) {
    node = node?.[path[i] as string] as Node | undefined;
    if (path[i] === 'stages' && i === 0) {
      node = node?.[path[i + 1] as number] as Node | undefined;
      const t = stageType(node);
      shape = t ? shapeOf(STAGE_TYPES[t]) : null;
      i++;
    } else shape = shapeOf(shape[path[i] as string]);
  }
  return shape ? Object.keys(shape) : [];
}

function stageList(stages: unknown[]): string {
  const names = stages.map((x, i) => stageName(x) ?? String(i));
  return `stages: ${names.join(', ')}; by name, by index 0-${stages.length - 1}, or * for every stage`;
}

/** Sets keys[i..] below `node`; returns how many places were set (a wildcard sets several). */
function setPath(node: Node, keys: string[], i: number, value: unknown, s: string): number {
  const k = keys[i];
  const here = keys.slice(0, i).join('.') || 'the recipe';
  if (!Array.isArray(node)) return setChild(node, k, keys, i, value, s);
  const stages = node.some(isStage);
  if (k === '*') {
    // over stages, a field reaches the stages whose type has it: `stages.*.promptsPerStep` sets the RL ones
    const field = keys[i + 1];
    let n = 0;
    for (const [j, el] of node.entries()) {
      const t = stageType(el);
      if (field !== undefined && isStage(el) && t && !(field in (shapeOf(STAGE_TYPES[t]) ?? {}))) continue;
      n += setChild(node, j, keys, i, value, s);
    }
    if (n === 0)
      throw new Error(
        `--set ${s}: no element of ${here} takes '${field}'` +
          (stages
            ? ` (sft stages take: ${fieldsAt({ stages: [{ type: 'sft' }] }, ['stages', 0]).join(', ')}; rl stages take: ${fieldsAt({ stages: [{ type: 'rl' }] }, ['stages', 0]).join(', ')})`
            : ''),
      );
    return n;
  }
  const key = /^\d+$/.test(k)
    ? Number(k)
    : node.findIndex((x) => (stages ? stageName(x) : (x as { name?: string })?.name) === k);
  if (key < 0 || key >= node.length)
    throw new Error(
      `--set ${s}: no ${stages ? 'stage' : 'element'} '${k}' in ${here}${stages ? ` (${stageList(node)})` : ''}`,
    );
  return setChild(node, key, keys, i, value, s);
}

function setChild(
  node: Node,
  key: string | number,
  keys: string[],
  i: number,
  value: unknown,
  s: string,
): number {
  if (i === keys.length - 1) {
    node[key] = structuredClone(value);
    return 1;
  }
  const next = node[key];
  if (next === undefined || next === null) node[key] = {};
  else if (typeof next !== 'object')
    throw new Error(`--set ${s}: ${keys.slice(0, i + 1).join('.')} is a value, not a section`);
  return setPath(node[key] as Node, keys, i + 1, value, s);
}

/**
 * Applies `--set a.b.c=value` to a raw (unvalidated) recipe; stages may be addressed by index, by name, or
 * all at once with `*` (`stages.*.maxResponseTokens=256`).
 */
export function applySets(raw: unknown, sets: string[]): unknown {
  const root = structuredClone(raw) as Node;
  for (const s of sets) {
    const eq = s.indexOf('=');
    if (eq <= 0) throw new Error(`--set ${s}: expected path=value, e.g. stages.0.steps=10`);
    setPath(root, s.slice(0, eq).split('.'), 0, YAML.parse(s.slice(eq + 1)), s);
  }
  return root;
}

/** Whether `--set` path `keys` names the place at `path` (or a section around or inside it). */
function setMatches(keys: string[], path: PropertyKey[], raw: unknown): boolean {
  const n = Math.min(keys.length, path.length);
  for (let i = 0; i < n; i++) {
    const p = path[i];
    const name =
      i === 1 && path[0] === 'stages'
        ? stageName((raw as { stages?: unknown[] }).stages?.[p as number])
        : undefined;
    if (keys[i] !== '*' && keys[i] !== String(p) && keys[i] !== name) return false;
  }
  return true;
}

/** One line per schema issue, naming the --set that caused it (not the recipe file) and the fields a section takes. */
function issueLines(
  issues: z.core.$ZodIssue[],
  raw: unknown,
  sets: string[],
): { lines: string[]; fromSet: boolean } {
  let fromSet = true;
  const lines = issues.map((i) => {
    const keys = i.code === 'unrecognized_keys' ? i.keys.map((k) => [...i.path, k]) : [i.path];
    const set = sets.find((s) => keys.some((p) => setMatches(s.slice(0, s.indexOf('=')).split('.'), p, raw)));
    if (!set) fromSet = false;
    // stages by name, as --set and the recipe file write them
    const stage =
      i.path[0] === 'stages'
        ? stageName((raw as { stages?: unknown[] }).stages?.[i.path[1] as number])
        : undefined;
    const where = i.path.map((k, j) => (j === 1 && stage ? stage : String(k))).join('.');
    const fields =
      i.code === 'unrecognized_keys'
        ? ` (${where || 'the recipe'} takes: ${fieldsAt(raw, i.path).join(', ')})`
        : '';
    return `  ${set ? `--set ${set}: ` : ''}${where || '(root)'}: ${i.message}${fields}`;
  });
  return { lines, fromSet };
}

/** Keeps the named stages (`--stages sft,stage1-8k`), in the recipe's order. */
function pickStages<T extends { name: string }>(stages: T[], names: string[], source: string): T[] {
  const unknown = names.filter((n) => !stages.some((s) => s.name === n));
  if (unknown.length > 0)
    throw new Error(
      `--stages: no stage ${unknown.map((n) => `'${n}'`).join(', ')} in recipe ${source} (stages: ${stages.map((s) => s.name).join(', ')})`,
    );
  return stages.filter((s) => names.includes(s.name));
}

/** Stages without files of their own take the recipe's data.sft / data.train; the kinds that filled one. */
function fillSharedData(recipe: Recipe): Set<string> {
  const filled = new Set<string>();
  for (const s of recipe.stages) {
    const key = s.type === 'sft' ? 'sft' : 'train';
    const shared = recipe.data[key];
    if (!s.data.files && shared) {
      s.data.files = [...shared];
      if (key === 'train' && recipe.data.weights) s.data.weights ??= [...recipe.data.weights];
      filled.add(key);
    }
  }
  return filled;
}

/** What the schema cannot say of one stage alone or beside the others. */
function checkStage(s: Recipe['stages'][number], source: string): void {
  const w = s.data.weights;
  if (w && (w.length !== s.data.files?.length || w.every((x) => x === 0)))
    throw new Error(
      `invalid recipe ${source}: stage ${s.name}: data.weights needs one weight per entry of data.files ` +
        `(${s.data.files?.length ?? 0}), not all 0; got [${w.join(', ')}]`,
    );
  if (s.lrSchedule === 'cosine' && s.minLr > s.lr)
    throw new Error(`invalid recipe ${source}: stage ${s.name}: minLr ${s.minLr} is above lr ${s.lr}`);
  if (s.type === 'sft' && s.gate && s.gate.heldout >= s.demos)
    throw new Error(`invalid recipe ${source}: stage ${s.name}: gate.heldout must be < demos`);
  if (s.type === 'rl' && s.lossAgg === 'micro-mean-nominal' && s.promptsPerStep % s.miniBatches !== 0)
    throw new Error(
      `invalid recipe ${source}: stage ${s.name}: lossAgg 'micro-mean-nominal' scales by mini-batches of ` +
        `promptsPerStep / miniBatches prompts (verl's ppo_mini_batch_size), so promptsPerStep ${s.promptsPerStep} ` +
        `must be a multiple of miniBatches ${s.miniBatches}`,
    );
  if (s.type === 'rl' && s.roc.minZeroRewardTraceNum + s.roc.minNonZeroRewardTraceNum > s.groupSize) {
    throw new Error(
      `invalid recipe ${source}: stage ${s.name}: minZeroRewardTraceNum + minNonZeroRewardTraceNum must be <= groupSize`,
    );
  }
}

function noData(source: string, where: string, path: string): Error {
  return new Error(
    `invalid recipe ${source}: ${where} has no data: give ${path}.files (JSONL/Parquet paths or globs, e.g. ` +
      `--set ${path}.files=[train.jsonl]) or set ${path}.generate: true for the built-in arithmetic tasks`,
  );
}

/** tool.schema read and checked at parse time, so a run's config.json holds the schema it ran with. */
function readToolSchema(t: Recipe['tool'], source: string): void {
  try {
    let schema: unknown = t.schema;
    if (typeof schema === 'string') {
      if (!existsSync(schema)) throw new Error(`tool.schema: no such file ${schema}`);
      try {
        schema = JSON.parse(readFileSync(schema, 'utf8'));
      } catch (e) {
        throw new Error(`tool.schema ${t.schema}: not valid JSON (${(e as Error).message})`);
      }
    }
    if (schema !== null) t.schema = rolloutToolSchema(t.name, schema) as unknown as Record<string, unknown>;
    else rolloutToolSchema(t.name);
  } catch (e) {
    throw new Error(`invalid recipe ${source}: ${(e as Error).message}`);
  }
}

export function parseRecipe(raw: unknown, source = '<recipe>', overrides: Overrides = {}): Recipe {
  const sets = overrides.set ?? [];
  const input = sets.length ? applySets(raw, sets) : raw;
  const r = RecipeSchema.safeParse(input);
  if (!r.success) {
    const { lines, fromSet } = issueLines(r.error.issues, input, sets);
    throw new Error(
      `${fromSet ? `--set does not fit recipe ${source}` : `invalid recipe ${source}`}:\n${lines.join('\n')}`,
    );
  }
  const filled = fillSharedData(r.data);
  // the shorthand fills only stages without files of their own: one that fills none would be ignored unseen
  for (const set of sets) {
    const key = /^data\.(sft|train)=/.exec(set)?.[1];
    const kind = key === 'sft' ? 'sft' : 'rl';
    const stages = r.data.stages.filter((s) => (s.type === 'sft') === (kind === 'sft'));
    if (key && !filled.has(key))
      throw new Error(
        `--set data.${key}: ${stages.length ? `every ${kind} stage (${stages.map((s) => s.name).join(', ')}) lists its own files` : `the recipe has no ${kind} stage`}, ` +
          `so it would be ignored; set stages.NAME.data.files instead`,
      );
  }
  // after the shorthand's check: data.sft with --stages that drops the SFT stage is not a mistake
  if (overrides.stages) r.data.stages = pickStages(r.data.stages, overrides.stages, source);
  if (!r.data.eval.files && !r.data.eval.generate && !overrides.incomplete)
    throw noData(source, 'eval', 'eval');
  const names = new Set<string>();
  for (const s of r.data.stages) {
    if (!s.data.files && !s.data.generate && !overrides.incomplete)
      throw noData(source, `stage ${s.name}`, `stages.${s.name}.data`);
    if (names.has(s.name)) throw new Error(`invalid recipe ${source}: duplicate stage name "${s.name}"`);
    names.add(s.name);
    checkStage(s, source);
  }
  readToolSchema(r.data.tool, source);
  // absolute, so the run's config.json finds it from any directory a resume starts in
  if (r.data.reward.module) r.data.reward.module = resolve(r.data.reward.module);
  if (r.data.eval.samples > 1 && r.data.eval.temperature === 0)
    throw new Error(`invalid recipe ${source}: eval.samples > 1 needs eval.temperature > 0`);
  if (overrides.roc) {
    for (const s of r.data.stages) if (s.type === 'rl') s.roc.doDownSampling = overrides.roc === 'on';
  }
  return r.data;
}

/**
 * A recipe as `--print-config` shows it: each place still to be filled in (a required model.path, a stage or eval
 * without data) holds a placeholder saying how to fill it, and `missing` lists them.
 */
export function withPlaceholders(recipe: Recipe): { shown: unknown; missing: string[] } {
  const shown = structuredClone(recipe) as unknown as {
    model: { path: unknown };
    eval: { files: unknown };
    stages: { name: string; type: string; data: { files: unknown } }[];
  };
  const missing: string[] = [];
  const fill = (what: string, how: string) => {
    missing.push(`${what}: ${how}`);
    return `<to fill in: ${how}>`;
  };
  if (recipe.model.requirePath && !recipe.model.path)
    shown.model.path = fill('model.path', '--set model.path=DIR (a Hugging Face model directory)');
  if (!recipe.eval.files && !recipe.eval.generate)
    shown.eval.files = fill('eval.files', '--set eval.files=[FILE]');
  for (const [i, s] of recipe.stages.entries())
    if (!s.data.files && !s.data.generate)
      shown.stages[i].data.files = fill(
        `stages.${s.name}.data.files`,
        `--set data.${s.type === 'sft' ? 'sft' : 'train'}=FILES (every ${s.type} stage) or --set stages.${s.name}.data.files=[FILE]`,
      );
  return { shown, missing };
}

/**
 * A run directory's config.json as a recipe to parse: a run written before an option existed or was renamed keeps
 * what it did then (stages drew prompts and examples independently before `sampler`, and SFT kept examples of any
 * length before `maxTokens`; lossAgg 'verl' computed what is now 'micro-mean-batch'), where a recipe written today
 * gets the new default or the rename's error.
 */
export function runConfig(raw: unknown): unknown {
  const r = structuredClone(raw) as {
    stages?: { type?: string; sampler?: string; lossAgg?: string; maxTokens?: number | null }[];
  };
  for (const s of Array.isArray(r?.stages) ? r.stages : []) {
    if (s?.type !== 'rl' && s?.type !== 'sft') continue;
    if (s.sampler === undefined) s.sampler = 'independent';
    if (s.type === 'sft' && s.maxTokens === undefined) s.maxTokens = null;
    if (s.lossAgg === 'verl') s.lossAgg = 'micro-mean-batch';
  }
  return r;
}

/** The tool a recipe's rollouts serve, as its prompts show it (recipe `tool`). */
export function recipeTool(recipe: Recipe): ToolSchema {
  return rolloutToolSchema(recipe.tool.name, recipe.tool.schema);
}

/** The tools prompts show and rollouts run: the recipe's tool, or none with `tool.enabled: false`. */
export function recipeTools(recipe: Recipe): ToolSchema[] {
  return recipe.tool.enabled ? [recipeTool(recipe)] : [];
}

/** What a recipe needs before it can train (or dry-run), beyond its schema; `--print-config` shows it anyway. */
export function checkRunnable(recipe: Recipe): void {
  const dir = recipe.model.path;
  if (dir && !existsSync(join(dir, 'config.json')))
    throw new Error(
      `model.path ${dir}: ${existsSync(dir) ? 'no config.json there' : 'no such directory'}; model.path is a local ` +
        'Hugging Face model directory (config.json, safetensors, tokenizer.json): a hub id such as Qwen/Qwen3-0.6B is ' +
        'not downloaded, fetch it first (huggingface-cli download Qwen/Qwen3-0.6B --local-dir DIR) and give DIR',
    );
  if (recipe.model.requirePath && !recipe.model.path)
    throw new Error(
      `recipe ${recipe.name} trains a real base model: give one with --set model.path=DIR (a Hugging Face ` +
        `directory: config.json, safetensors, tokenizer.json; hub ids are not downloaded), or --set ` +
        `model.requirePath=false to train a fresh '${recipe.model.preset}' preset instead`,
    );
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
  return parseRecipe(resolvePaths(raw, dirname(path)), path, overrides);
}

/**
 * Paths written in a recipe file (model.path, data and eval files) are relative to that file, so a recipe and
 * its data move together; paths given with --set stay relative to the working directory.
 */
function resolvePaths(raw: unknown, base: string): unknown {
  const r = structuredClone(raw) as {
    model?: { path?: unknown };
    reward?: { module?: unknown };
    tool?: { schema?: unknown };
    data?: { sft?: unknown; train?: unknown };
    eval?: { files?: unknown };
    stages?: { data?: { files?: unknown } }[];
  };
  if (!r || typeof r !== 'object') return raw;
  const abs = (p: unknown) => (typeof p === 'string' && !isAbsolute(p) ? resolve(base, p) : p);
  const absAll = (fs: unknown) => (Array.isArray(fs) ? fs.map(abs) : fs);
  if (r.model && typeof r.model === 'object') r.model.path = abs(r.model.path);
  if (r.reward && typeof r.reward === 'object') r.reward.module = abs(r.reward.module);
  if (r.tool && typeof r.tool === 'object') r.tool.schema = abs(r.tool.schema);
  if (r.eval && typeof r.eval === 'object') r.eval.files = absAll(r.eval.files);
  if (r.data && typeof r.data === 'object') {
    r.data.sft = typeof r.data.sft === 'string' ? abs(r.data.sft) : absAll(r.data.sft);
    r.data.train = typeof r.data.train === 'string' ? abs(r.data.train) : absAll(r.data.train);
  }
  if (Array.isArray(r.stages))
    for (const st of r.stages)
      if (st?.data && typeof st.data === 'object') st.data.files = absAll(st.data.files);
  return r;
}
