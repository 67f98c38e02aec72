import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { basename, dirname, join, relative, resolve } from 'node:path';
import type { Command } from 'commander';
import { commaList, deprecatedAliases, nonNegativeInt, positiveInt, seed } from '../cli/index.js';
import { readJson } from '../util/jsonl.js';
import { freshDir, lockDir } from '../util/lock.js';
import type { LaunchOptions } from '../worker/launch.js';
import type { Overrides, Recipe } from './config.js';
import type { Policy } from './trainer.js';
import type { WeightSyncMode } from './weight-sync.js';

interface TrainFlags {
  recipe?: string;
  out?: string;
  roc?: string;
  resume?: string;
  printConfig?: boolean;
  fork?: string;
  policyBackend: string;
  /** --policy-backend was given (not its default). */
  policyBackendGiven?: boolean;
  insecureNoSandbox?: boolean;
  engines?: string[];
  syncDir?: string;
  weightSync: string;
  weightSyncMaster?: string;
  seed?: number;
  set: string[];
  stages?: string[];
  strictHealth?: boolean;
  dryRun?: boolean;
  logger?: string[];
  nprocPerNode?: number;
  nnodes?: number;
  nodeRank?: number;
  master?: string;
}

// torchrun's flags: this node's share of the worker's ranks. Not recipe fields: the same run may be resumed
// on another layout (the loss is a global token mean, so the layout does not change what is trained).
async function launchFlags(flags: TrainFlags): Promise<LaunchOptions> {
  const { checkLaunch } = await import('../worker/index.js');
  const launch: LaunchOptions = {
    ranks: flags.nprocPerNode,
    nnodes: flags.nnodes,
    nodeRank: flags.nodeRank,
    master: flags.master,
  };
  checkLaunch(launch);
  return Object.fromEntries(Object.entries(launch).filter(([, v]) => v !== undefined));
}

// A node other than node 0 only runs its ranks; they take every request from rank 0.
async function joinJob(recipe: Recipe, launch: LaunchOptions): Promise<void> {
  const { runNodeRanks } = await import('../worker/index.js');
  const { workerStartOptions } = await import('./policy.js');
  const opts = { ...workerStartOptions(recipe.model), ...launch };
  console.error(`node ${launch.nodeRank}: starting ${opts.ranks} rank(s); rank 0 is at ${launch.master}`);
  process.exitCode = await runNodeRanks(opts);
}

async function makePolicy(
  recipe: Recipe,
  flags: TrainFlags,
  runDir: string,
  launch: LaunchOptions,
): Promise<Policy> {
  if (flags.policyBackend === 'fake') {
    const { FakePolicy } = await import('./fake.js');
    return new FakePolicy();
  }
  const { EmbeddedPolicy } = await import('./policy.js');
  const { remoteEngine } = await import('../engines/index.js');
  const mode = flags.weightSync as WeightSyncMode;
  const engines = (flags.engines ?? []).map((spec) => remoteEngine(spec));
  return EmbeddedPolicy.create(recipe, {
    insecureSandbox: flags.insecureNoSandbox,
    engines,
    syncDir: resolve(flags.syncDir ?? join(runDir, 'engine-weights')),
    weightSync: { mode, master: flags.weightSyncMaster },
    launch,
  });
}

const shellWord = (w: string) => (/^[\w@%+=:,./-]+$/.test(w) ? w : `'${w.replace(/'/g, `'\\''`)}'`);

/** The command that goes on with this run: this program, and the flags the run's config.json does not hold. */
function resumeCommand(runDir: string, flags: TrainFlags): string {
  const script = process.argv[1] ?? 'rstar2';
  const prog =
    basename(script) === 'rstar2' ? ['rstar2'] : ['node', relative(process.cwd(), script) || script];
  const opt = (name: string, v: string | number | undefined) => (v === undefined ? [] : [name, String(v)]);
  return [
    ...prog,
    'train',
    '--resume',
    runDir,
    ...(flags.policyBackend !== 'embedded' ? ['--policy-backend', flags.policyBackend] : []),
    ...(flags.insecureNoSandbox ? ['--insecure-no-sandbox'] : []),
    ...opt('--engines', flags.engines?.join(',')),
    ...opt('--sync-dir', flags.syncDir),
    ...(flags.weightSync !== 'auto' ? ['--weight-sync', flags.weightSync] : []),
    ...opt('--weight-sync-master', flags.weightSyncMaster),
    ...opt('--nproc-per-node', flags.nprocPerNode),
    ...opt('--nnodes', flags.nnodes),
    ...opt('--master', flags.master),
  ]
    .map(shellWord)
    .join(' ');
}

/** `rstar2 train`: flags checked, the run's recipe and directory resolved, then a dry run or the training. */
async function train(flags: TrainFlags): Promise<void> {
  const { set, overrides } = await trainOverrides(flags);
  const launch = await policyLaunch(flags);
  if ((launch.nodeRank ?? 0) > 0) return joinJob(await nodeRecipe(flags, set, overrides), launch);
  const { recipe, runDir } = flags.resume ? await resumedRun(flags, set) : await newRun(flags, overrides);
  if (flags.printConfig) return printConfig(recipe);
  const { checkRunnable } = await import('./config.js');
  const { checkLoggers } = await import('./loggers.js');
  checkLoggers(recipe.logger);
  checkRunnable(recipe);
  // a module that is missing or exports no function fails here, dry run included, not as a 0 on every check
  if (recipe.reward.module) await (await import('../reward/index.js')).loadRewardModule(recipe.reward.module);
  if (flags.dryRun) {
    const { dryRun } = await import('./dry-run.js');
    const { remoteEngine } = await import('../engines/index.js');
    const engines = (flags.engines ?? []).map((spec) => remoteEngine(spec));
    await dryRun(recipe, {
      engines,
      insecureSandbox: flags.insecureNoSandbox,
      weightSync: flags.weightSync as WeightSyncMode,
    });
    return;
  }
  await runTraining(recipe, !flags.resume && !flags.out ? freshDir(runDir) : runDir, flags, launch);
}

/** The flags that become recipe overrides (--set, --seed, --strict-health, --logger, --roc, --stages). */
async function trainOverrides(flags: TrainFlags): Promise<{ set: string[]; overrides: Overrides }> {
  const { LOGGERS } = await import('./config.js');
  if (flags.roc !== undefined && flags.roc !== 'on' && flags.roc !== 'off') {
    throw new Error(`--roc must be "on" or "off", got "${flags.roc}"`);
  }
  const { WEIGHT_SYNC_MODES } = await import('./weight-sync.js');
  if (!(WEIGHT_SYNC_MODES as readonly string[]).includes(flags.weightSync))
    throw new Error(
      `--weight-sync must be one of ${WEIGHT_SYNC_MODES.join(', ')}, got "${flags.weightSync}"`,
    );
  const set = [...flags.set];
  if (flags.seed !== undefined) set.push(`seed=${flags.seed}`);
  if (flags.strictHealth) set.push('health.strict=true');
  if (flags.logger !== undefined) {
    const names = flags.logger;
    const bad = names.filter((n) => !(LOGGERS as readonly string[]).includes(n));
    if (bad.length > 0)
      throw new Error(`--logger: unknown ${bad.join(', ')} (choose from ${LOGGERS.join(', ')})`);
    set.push(`logger=${JSON.stringify(names)}`);
  }
  const overrides: Overrides = {
    set,
    ...(flags.roc ? { roc: flags.roc as 'on' | 'off' } : {}),
    ...(flags.stages ? { stages: flags.stages } : {}),
  };
  return { set, overrides };
}

/** Which policy trains (--policy-backend), held to the launch and engine flags; this node's launch options. */
async function policyLaunch(flags: TrainFlags): Promise<LaunchOptions> {
  const { readState } = await import('./trainer.js');
  // a run trained on the fake policy resumes on it: its checkpoints are the fake's, which the worker cannot load
  const last = flags.resume ? readState(flags.resume) : null;
  if (
    last &&
    flags.policyBackend === 'embedded' &&
    existsSync(join(flags.resume!, last.checkpoint, 'fake-policy.json'))
  ) {
    if (flags.policyBackendGiven)
      throw new Error(
        `--resume ${flags.resume}: its checkpoints are the fake policy's (--policy-backend fake); the embedded worker cannot load them`,
      );
    flags.policyBackend = 'fake';
  }
  const launch = await launchFlags(flags);
  // before --dry-run and before the run directory is made: a dry run must not pass what the run refuses
  if (flags.policyBackend !== 'embedded' && flags.policyBackend !== 'fake')
    throw new Error(`unknown --policy-backend ${flags.policyBackend} (choose: embedded, fake)`);
  if (flags.policyBackend === 'fake') {
    if (Object.keys(launch).length > 0)
      throw new Error('--nproc-per-node/--nnodes/--master need --policy-backend embedded');
    if (flags.engines) throw new Error('--engines needs --policy-backend embedded (the torch worker trains)');
  }
  return launch;
}

/** The recipe a node other than node 0 starts its ranks with: node 0's --recipe or run directory. */
async function nodeRecipe(flags: TrainFlags, set: string[], overrides: Overrides): Promise<Recipe> {
  const { loadRecipe, parseRecipe, runConfig } = await import('./config.js');
  const cfg = flags.resume ? join(flags.resume, 'config.json') : undefined;
  if (!cfg && !flags.recipe) throw new Error('--node-rank needs the same --recipe or --resume as node 0');
  return cfg ? parseRecipe(runConfig(readJson(cfg)), cfg, { set }) : loadRecipe(flags.recipe!, overrides);
}

/** --resume: the run's own config.json with the --set changes a resume may make (recorded in changes.jsonl). */
async function resumedRun(flags: TrainFlags, set: string[]): Promise<{ recipe: Recipe; runDir: string }> {
  const { parseRecipe, runConfig } = await import('./config.js');
  const { readState } = await import('./trainer.js');
  const { RESUMABLE, recordChanges, resumeChanges } = await import('./changes.js');
  const runDir = flags.resume as string;
  const cfg = join(runDir, 'config.json');
  if (!existsSync(cfg)) throw new Error(`--resume ${runDir}: no config.json there (not a run directory?)`);
  if (flags.recipe || flags.roc || flags.seed !== undefined || flags.stages)
    throw new Error(
      `--recipe, --roc, --seed and --stages cannot change a run being resumed; its config.json decides. ` +
        `--set may change ${RESUMABLE}. To change anything else, start a new run from one of its checkpoints: ` +
        `rstar2 train --fork ${join(runDir, 'checkpoints', 'STAGE-step-N')} --out NEW [--set …]`,
    );
  const before = parseRecipe(runConfig(readJson(cfg)), cfg);
  const recipe = parseRecipe(runConfig(readJson(cfg)), cfg, { set });
  const state = readState(runDir);
  const changes = resumeChanges(before, recipe, state);
  for (const c of changes)
    console.error(`resume changes ${c.path}: ${JSON.stringify(c.from)} -> ${JSON.stringify(c.to)}`);
  if (!flags.dryRun && !flags.printConfig) recordChanges(runDir, recipe, changes, state);
  return { recipe, runDir };
}

/** A new run (--recipe, or --fork from another run's checkpoint, made here and then resumed). */
async function newRun(flags: TrainFlags, overrides: Overrides): Promise<{ recipe: Recipe; runDir: string }> {
  const { loadRecipe, parseRecipe, runConfig } = await import('./config.js');
  const { forkRun } = await import('./trainer.js');
  let recipe: Recipe;
  let forkSrc: string | undefined;
  if (flags.fork) {
    forkSrc = dirname(flags.fork).replace(/\/checkpoints$/, '');
    const cfg = join(forkSrc, 'config.json');
    if (!flags.recipe && !existsSync(cfg))
      throw new Error(`--fork ${flags.fork}: no config.json in ${forkSrc}`);
    recipe = flags.recipe
      ? loadRecipe(flags.recipe, overrides)
      : parseRecipe(runConfig(readJson(cfg)), cfg, overrides);
  } else {
    if (!flags.recipe) throw new Error('give --recipe NAME|FILE (e.g. --recipe quickstart) or --resume RUN');
    // --print-config shows a recipe whose data are still to be given, with placeholders
    recipe = loadRecipe(flags.recipe, { ...overrides, incomplete: flags.printConfig });
  }
  const stamp = new Date().toISOString().replace(/[-:]/g, '').slice(0, 15);
  const runDir = flags.out ?? join('runs', `${recipe.name}-${flags.roc === 'off' ? 'grpo' : 'roc'}-${stamp}`);
  if (existsSync(join(runDir, 'state.json'))) {
    throw new Error(`${runDir} already holds a run (state.json); use --resume ${runDir} or another --out`);
  }
  // a dry run writes nothing: the fork is made by the real command
  if (forkSrc && !flags.printConfig && !flags.dryRun) {
    if (!flags.out) throw new Error('--fork needs --out DIR for the new run');
    forkRun(forkSrc, basename(flags.fork!), runDir, recipe);
    flags.resume = runDir;
  }
  return { recipe, runDir };
}

async function printConfig(recipe: Recipe): Promise<void> {
  const { withPlaceholders } = await import('./config.js');
  const { shown, missing } = withPlaceholders(recipe);
  process.stdout.write(JSON.stringify(shown, null, 2) + '\n');
  if (missing.length > 0)
    console.error(`to fill in before it runs:\n${missing.map((m) => `  ${m}`).join('\n')}`);
}

/** Trains in the locked run directory; the first signal stops after the current step, the second at once. */
async function runTraining(recipe: Recipe, runDir: string, flags: TrainFlags, launch: LaunchOptions) {
  const { Trainer } = await import('./trainer.js');
  const { healthSummary } = await import('./health.js');
  const release = lockDir(runDir, 'run');
  const t0 = Date.now();
  const policy = await makePolicy(recipe, flags, runDir, launch);
  const trainer = new Trainer(recipe, runDir, policy);
  const again = `resume with:\n  ${resumeCommand(runDir, flags)}`;
  let signals = 0;
  const stop = (sig: NodeJS.Signals) => {
    if (++signals > 1) {
      console.error(`\n${sig} again: stopping now; a resume goes on from the last checkpoint; ${again}`);
      process.exit(130);
    }
    console.error(`\n${sig}: stopping after the current step, with a checkpoint (${sig} again: stop now)`);
    trainer.requestStop();
  };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
  try {
    console.error(`run directory: ${runDir}`);
    let evals: { stage: string; step: number; accuracy: number }[];
    try {
      ({ evals } = await trainer.run(Boolean(flags.resume)));
    } catch (e) {
      if (await stoppedEarly(e, runDir, signals > 0, again)) return;
      throw e;
    }
    const first = evals[0];
    const last = evals[evals.length - 1];
    const mins = ((Date.now() - t0) / 60000).toFixed(1);
    if (first && last) {
      console.log(
        `held-out accuracy: ${(first.accuracy * 100).toFixed(1)}% (${first.stage} step ${first.step}) -> ` +
          `${(last.accuracy * 100).toFixed(1)}% (${last.stage} step ${last.step}); ${mins} min; run: ${runDir}`,
      );
    } else console.log(`done in ${mins} min; run: ${runDir}`);
    if (trainer.warnings.length > 0) console.log(healthSummary(trainer.warnings));
  } finally {
    process.off('SIGINT', stop);
    process.off('SIGTERM', stop);
    await policy.close();
    release();
  }
}

/** A run that ended on a health stop, a signal's stop or an interruption: said, with its exit code; else false. */
async function stoppedEarly(e: unknown, runDir: string, signalled: boolean, again: string): Promise<boolean> {
  const { readState, Stopped } = await import('./trainer.js');
  const { HealthError } = await import('./health.js');
  if (e instanceof HealthError) {
    console.error(`${e.message}\nstopped after the last checkpoint; run: ${runDir}`);
    process.exitCode = 3;
    return true;
  }
  // after a terminal's Ctrl-C the policy worker, in the same process group, may have died of it first
  if (!(e instanceof Stopped) && !signalled) return false;
  const s = readState(runDir);
  const why = e instanceof Stopped ? 'stopped' : `interrupted (${(e as Error).message})`;
  const at = s ? `${s.stage} step ${s.step} (${s.checkpoint})` : 'none yet, a resume starts over';
  console.error(`${why}; last checkpoint: ${at}; ${again}`);
  process.exitCode = 130;
  return true;
}

function renderPng(svg: string, png: string): void {
  const chromium = process.env.CHROMIUM ?? '/usr/bin/chromium';
  if (!existsSync(chromium))
    throw new Error(`--png needs chromium at ${chromium} (set CHROMIUM to another path)`);
  const size = /width="(\d+)" height="(\d+)"/.exec(readFileSync(svg, 'utf8'));
  const r = spawnSync(
    chromium,
    [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      `--screenshot=${png}`,
      `--window-size=${size?.[1] ?? 1080},${size?.[2] ?? 290}`,
      `file://${svg}`,
    ],
    { encoding: 'utf8', timeout: 60_000 },
  );
  if (r.status !== 0 || !existsSync(png))
    throw new Error(`chromium failed to render ${png}: ${r.stderr?.slice(-400)}`);
}

export function registerRecipeCommands(program: Command): void {
  const trainCmd = program
    .command('train')
    .description(
      'Train with a recipe: SFT then GRPO-RoC stages, writing a run directory (docs/RUN_DIR.md). ' +
        'Ctrl-C or SIGTERM stops after the current step with a checkpoint and prints the resume command; ' +
        'a second one stops at once',
    )
    .option('--recipe <name|file>', 'recipe name in data/recipes/ (e.g. quickstart) or a YAML/JSON file')
    .option('--out <dir>', 'run directory (default runs/<recipe>-<roc|grpo>-<time>)')
    .option('--roc <on|off>', 'Resample-on-Correct on (GRPO-RoC) or off (plain GRPO) in every RL stage')
    .option(
      '--resume <run>',
      'continue the run in this directory from its last checkpoint; --set may change the reward, eval, health ' +
        "and logger settings and the steps and sizes of stages not yet started (recorded in the run's changes.jsonl)",
    )
    .option(
      '--fork <run/checkpoint>',
      "start a new run (--out) from another run's checkpoint, with any --set, e.g. runs/a/checkpoints/sft-step-000150",
    )
    .option('--print-config', 'print the fully resolved recipe (with defaults) and exit')
    .option(
      '--dry-run',
      'open and check everything (model, tokenizer, data after each filter, first prompts, engines, sandbox, memory plan); train nothing',
    )
    .option('--seed <n>', "the run's seed (model init, data order, sampling); same as --set seed=N", seed())
    .option(
      '--set <path=value>',
      "override a recipe field (repeatable): --set stages.0.steps=5 --set eval.n=50 --set 'stages.*.maxTurns=2' " +
        '(stages by index, by name, or * for every stage that has the field)',
      (v: string, acc: string[]) => [...acc, v],
      [] as string[],
    )
    .option(
      '--stages <names>',
      'run only these stages of the recipe, in its order: --stages sft,stage1-8k',
      commaList,
    )
    .option('--strict-health', 'stop with exit code 3 at the first health warning (the run is not learning)')
    .option(
      '--logger <names>',
      'also log step metrics to: tensorboard (event files in <run>/tensorboard/), comma-separated; ' +
        'metrics.jsonl is always written (same as --set logger=...; allowed with --resume)',
      commaList,
    )
    .option(
      '--policy-backend <name>',
      'the policy trained: embedded (torch worker + sandbox) or fake (a 3-parameter stand-in, no torch)',
      'embedded',
    )
    .option(
      '--insecure-no-sandbox',
      'run tool code without bubblewrap isolation (development only; in a container that refuses namespaces, ' +
        'RSTAR2_SANDBOX_ISOLATION=landlock isolates without them)',
    )
    .option(
      '--engines <specs>',
      'roll out on remote engines instead of the worker: sglang+http://h:p,vllm+http://h:p (comma-separated, ' +
        'repeatable); weights are synced to them before each rollout that follows an update',
      commaList,
    )
    .option(
      '--sync-dir <dir>',
      'model directory the engines load synced weights from (shared storage; start vLLM with --model DIR) ' +
        '(default: <run>/engine-weights)',
    )
    .option(
      '--weight-sync <mode>',
      'how engines get each update: nccl (broadcast from the trainer over a process group: NCCL from a GPU ' +
        'trainer, gloo from a CPU one), disk (via --sync-dir), ' +
        'or auto: nccl when every engine can join a group and is on a private network, else disk; ' +
        'a failed broadcast falls back to disk',
      'auto',
    )
    .option(
      '--weight-sync-master <addr[:port]>',
      "the trainer's address (and a free port) as the engines reach it for nccl sync (default: detected)",
    )
    .option(
      '--nproc-per-node <n>',
      "policy worker ranks on this node (torchrun's flag; default model.nprocPerNode)",
      positiveInt(),
    )
    .option(
      '--nnodes <n>',
      'nodes in the job (default 1); every node runs rstar2 train with the same recipe',
      positiveInt(),
    )
    .option(
      '--node-rank <n>',
      'this node (default 0); node 0 trains, the others only run their ranks',
      nonNegativeInt(),
    )
    .option(
      '--master <addr:port>',
      "node 0's address and a free port, reachable from every node (needed with --nnodes > 1)",
    );
  deprecatedAliases(trainCmd, { '--backend <name>': '--policy-backend' });
  trainCmd.action((flags: TrainFlags, cmd: Command) =>
    train({ ...flags, policyBackendGiven: cmd.getOptionValueSource('policyBackend') !== 'default' }),
  );

  program
    .command('export')
    .description(
      'a checkpoint as a model directory to serve or publish: weights, config and tokenizer, no optimizer or ' +
        'trainer state, and the chat template the run trained with in tokenizer_config.json (and chat_template.jinja)',
    )
    .argument('<checkpoint>', 'a checkpoint directory, e.g. runs/a/checkpoints/rl-step-000040')
    .requiredOption('--out <dir>', 'the model directory to write (new or empty)')
    .option(
      '--template <name>',
      "the chat template to write (default: the run's tokenizer.template; 'model' keeps the checkpoint's own)",
    )
    .action(async (checkpoint: string, o: { out: string; template?: string }) => {
      const { exportCheckpoint } = await import('./export.js');
      const r = exportCheckpoint(checkpoint, o.out, o.template);
      console.log(`wrote ${o.out}: ${r.files.join(', ')} (chat template: ${r.template})`);
    });

  program
    .command('export-metrics')
    .description(
      "Write a run's metrics.jsonl and evals.jsonl as a TensorBoard event file (the scalars --logger tensorboard logs)",
    )
    .argument('<run>', 'run directory')
    .requiredOption('--tensorboard <dir>', 'directory for the event file (new, or without event files)')
    .action(async (run: string, o: { tensorboard: string }) => {
      const { exportMetrics } = await import('./loggers.js');
      const r = exportMetrics(run, o.tensorboard);
      console.log(`wrote ${r.records} records to ${r.path}`);
    });

  program
    .command('train-plot')
    .description(
      'Plot reward, held-out accuracy and tool-error ratio among positives of one or more runs (SVG)',
    )
    .argument('<runs...>', 'run directories (label = directory name)')
    .requiredOption('--out <file>', 'SVG file to write')
    .option('--png <file>', 'also render a PNG with headless chromium (/usr/bin/chromium)')
    .action(async (runs: string[], o: { out: string; png?: string }) => {
      const { plotRuns } = await import('./plot.js');
      for (const r of runs)
        if (!existsSync(join(r, 'metrics.jsonl'))) throw new Error(`${r}: no metrics.jsonl`);
      writeFileSync(o.out, plotRuns(runs));
      console.log(`wrote ${o.out}`);
      if (o.png) {
        renderPng(resolve(o.out), resolve(o.png));
        console.log(`wrote ${o.png}`);
      }
    });
}
