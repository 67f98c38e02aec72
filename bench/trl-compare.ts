// rstar2's RL step against TRL's GRPOTrainer, on the same model, data and settings, run alternately.
//
// One command builds everything in --work: 256 arithmetic prompts with integer answers ("What is 592+99? ..."),
// a byte-level BPE tokenizer trained on them by `rstar2 tokenizer build` (552 ids; not Qwen3's 151K vocabulary,
// whose embedding would be most of a small model), a random-init Qwen2 (hidden 256, 4 layers, 4 heads, 2 KV
// heads, 3.19M parameters) saved by transformers 5 with TRL's copy of Qwen2.5's chat template, and for the tool
// variant a checkpoint that calls the tool (a short SFT on tool-calling demos, python/bench/trl_grpo.py sft).
// Then, per round, `rstar2 train` on a one-stage RL recipe with model.path = that directory, and TRL's
// GRPOTrainer (python/bench/trl_grpo.py grpo): 4 prompts x 8 samples, 128 response tokens, lr 1e-5, one update
// per step, 2 threads, fp32, no gradient checkpointing (TRL's default is on), no KL, every sample trained (RoC
// and the equal-reward filter off, as TRL has neither), reward 1 for the exact integer in \boxed{}.
//   plain: no tool (rstar2 tool.enabled false; TRL without tools=), one turn.
//   tool:  the SFT checkpoint, the python tool under one name and schema on both sides (rstar2 runs it in its
//          sandbox; TRL's tools= runs a Python function that runs the code in a fresh /usr/bin/python3), at most 2
//          assistant turns.
// Prints per side: step time (median over the steps after the first, all rounds), generated tokens/s (response
// tokens, a tool's output included, over the generation phase), trained tokens/s (prompt + response tokens of
// the trained sequences over the update phase), time to first step (process start to the first step's end),
// peak resident memory (the process tree, sampled), CPU seconds per step (the tree's user + system), and the
// rstar2/TRL ratios; with torch/transformers/trl versions, the CPU and its fp32 matmul rate (2 threads, 1024^3,
// measured in the same run) and the decode bound it gives (rate / (2 x params) tokens/s). Writes --out as JSON.
// TRL's Python packages are python/bench/requirements.txt, installed into .venv when missing.
//
// Run: npx tsx bench/trl-compare.ts [--variants plain,tool] [--rounds 2] [--steps 5] [--sft-steps 120]
//        [--work /tmp/rstar2-trl-compare] [--out bench/samples/trl-compare.json] [--threads 2] [--reuse] [--trl-spin]
//        [--device auto|cpu|cuda] [--shape tiny|0.5b] [--use-installed]
// --device: where both sides run (auto: the GPU where torch sees one; cpu hides it from both). --shape 0.5b is
// Qwen2.5-0.5B's body on the same small vocabulary, for a GPU: there a 3.19M model measures kernel launches, not
// either system. On a GPU this bench has not yet run (bench/gpu-check.sh runs it where trl imports).
// Timings on a shared machine are noisy: compare the ratios of one run, whose sides alternate.
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { join, resolve } from 'node:path';
import { findPython } from '../src/util/python.js';
import { Rng } from '../src/util/rng.js';
import { benchArgs, median } from './args.js';

const { values } = benchArgs(import.meta.url, {
  options: {
    variants: { type: 'string', default: 'plain,tool' },
    rounds: { type: 'string', default: '2' },
    steps: { type: 'string', default: '5' },
    'sft-steps': { type: 'string', default: '120' },
    threads: { type: 'string', default: '2' },
    work: { type: 'string', default: '/tmp/rstar2-trl-compare' },
    out: { type: 'string', default: 'bench/samples/trl-compare.json' },
    // the model, data and SFT checkpoint an earlier run left in --work, instead of building them again
    reuse: { type: 'boolean', default: false },
    // TRL's process under the worker's libgomp wait (GOMP_SPINCOUNT=1000) instead of libgomp's default, to tell
    // a thread-wait effect from the code's own speed on a loaded host
    'trl-spin': { type: 'boolean', default: false },
    device: { type: 'string', default: 'auto' },
    // TRL as the interpreter has it, pins unchecked and nothing installed (a GPU host without network)
    'use-installed': { type: 'boolean', default: false },
    shape: { type: 'string', default: 'tiny' },
  },
});
const variants = values.variants.split(',');
for (const v of variants)
  if (v !== 'plain' && v !== 'tool') throw new Error(`--variants: '${v}' is neither plain nor tool`);
const rounds = Number(values.rounds);
const steps = Number(values.steps);
const threads = Number(values.threads);
const shape = values.shape;
if (shape !== 'tiny' && shape !== '0.5b') throw new Error(`--shape: '${shape}' is neither tiny nor 0.5b`);
if (!['auto', 'cpu', 'cuda'].includes(values.device))
  throw new Error(`--device: '${values.device}' is none of auto, cpu, cuda`);
// every child of this bench (both sides, the build, the probe) sees the GPU or, for --device cpu, none
const childEnv: NodeJS.ProcessEnv =
  values.device === 'cpu' ? { ...process.env, CUDA_VISIBLE_DEVICES: '' } : process.env;
if (!(steps >= 2)) throw new Error('--steps must be at least 2: the first step is timed apart');
const ROOT = resolve(import.meta.dirname, '..');
const BIN = join(ROOT, 'bin', 'rstar2.js');
const SCRIPT = join(ROOT, 'python', 'bench', 'trl_grpo.py');
const work = resolve(values.work);
const python = findPython();
const S = { prompts: 4, group: 8, maxTokens: 128, lr: 1e-5, maxTurns: 2 };

function run(cmd: string, args: string[], what: string, env: NodeJS.ProcessEnv = childEnv): string {
  const r = spawnSync(cmd, args, { cwd: ROOT, env, encoding: 'utf8', maxBuffer: 64 << 20 });
  if (r.status !== 0) throw new Error(`${what} failed (exit ${r.status}):\n${r.stderr.slice(-3000)}`);
  return r.stdout;
}

function lastJson(out: string): Record<string, any> {
  const line = out.trim().split('\n').pop() ?? '';
  return JSON.parse(line);
}

// ---- setup ------------------------------------------------------------------------------------------------

function ensureTrl(): void {
  if (values['use-installed']) {
    run(python, ['-c', 'import trl, datasets'], `--use-installed: importing trl and datasets in ${python}`);
    return;
  }
  const req = join(ROOT, 'python', 'bench', 'requirements.txt');
  const pins = readFileSync(req, 'utf8')
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l && !l.startsWith('#'));
  const check = `import importlib.metadata as m, sys
def have(p):
    try:
        return m.version(p.split("==")[0]) == p.split("==")[1]
    except m.PackageNotFoundError:
        return False
bad = [p for p in sys.argv[1:] if not have(p)]`;
  const probe = spawnSync(python, ['-c', `${check}\nsys.exit(1 if bad else 0)`, ...pins], {
    encoding: 'utf8',
    env: childEnv,
  });
  if (probe.status === 0) return;
  console.log(`installing ${req} into ${python} (offline: set PIP_INDEX_URL=file:///opt/pypi/simple)`);
  run(python, ['-m', 'pip', 'install', '-r', req], 'pip install of the TRL requirements');
}

function writeData(file: string): void {
  const rng = new Rng(1);
  const seen = new Set<string>();
  const rows: string[] = [];
  while (rows.length < 256) {
    const op = rng.pick(['+', '-', '*']);
    const a = rng.int(10, 999);
    const b = rng.int(2, 99);
    const expr = `${a}${op}${b}`;
    if (seen.has(expr)) continue;
    seen.add(expr);
    const answer = op === '+' ? a + b : op === '-' ? a - b : a * b;
    const question = `What is ${expr}? Put the integer answer in \\boxed{}.`;
    rows.push(JSON.stringify({ question, answer: String(answer), expr }));
  }
  writeFileSync(file, `${rows.join('\n')}\n`);
}

interface Built {
  data: string;
  base: string;
  tool?: string;
  schema?: string;
  params: number;
  shape?: string; // absent: built before --shape, so tiny
  sft?: Record<string, unknown>;
}

function build(): Built {
  mkdirSync(work, { recursive: true });
  const saved = join(work, 'built.json');
  if (values.reuse && existsSync(saved)) {
    const b: Built = JSON.parse(readFileSync(saved, 'utf8'));
    if ((b.shape ?? 'tiny') === shape && (!variants.includes('tool') || b.tool)) return b;
  }
  const data = join(work, 'data.jsonl');
  const base = join(work, 'base');
  writeData(data);
  const corpus = join(work, 'corpus.jsonl');
  run(python, [SCRIPT, 'corpus', '--data', data, '--out', corpus], 'the tokenizer corpus');
  const tok = join(work, 'tokenizer');
  run(
    process.execPath,
    [
      BIN,
      'tokenizer',
      'build',
      '--out',
      tok,
      '--kind',
      'bpe',
      '--corpus',
      corpus,
      '--vocab-size',
      '1024',
      '--force',
    ],
    'rstar2 tokenizer build',
  );
  const made = lastJson(
    run(
      python,
      [SCRIPT, 'model', '--tokenizer-json', join(tok, 'tokenizer.json'), '--out', base, '--shape', shape],
      'the model',
    ),
  );
  const out: Built = { data, base, params: made.params, shape };
  if (variants.includes('tool')) {
    out.schema = join(work, 'tool-schema.json');
    writeFileSync(
      out.schema,
      run(
        python,
        [SCRIPT, 'grpo', '--schema', '--model', base, '--data', data, '--out-dir', work],
        'the tool schema',
      ),
    );
    out.tool = join(work, 'tool-sft');
    const t0 = Date.now();
    out.sft = lastJson(
      run(
        python,
        [
          SCRIPT,
          'sft',
          '--model',
          base,
          '--data',
          data,
          '--out',
          out.tool,
          '--steps',
          values['sft-steps'],
          '--threads',
          String(threads),
          // the demos' rate for the tiny model diverges on the 0.5B one
          '--lr',
          shape === 'tiny' ? '2e-3' : '3e-4',
        ],
        'the tool-calling SFT',
      ),
    );
    out.sft.seconds = (Date.now() - t0) / 1000;
  }
  writeFileSync(saved, JSON.stringify(out));
  return out;
}

function machine(): Record<string, unknown> {
  const probe = `import json, time, torch, transformers, trl
torch.set_num_threads(${threads})
gpu = torch.cuda.is_available()
n = 4096 if gpu else 1024
a, b = torch.randn(n, n, device="cuda" if gpu else "cpu"), torch.randn(n, n, device="cuda" if gpu else "cpu")
sync = torch.cuda.synchronize if gpu else (lambda: None)
for _ in range(3): a @ b
sync()
ts = []
for _ in range(10):
    t0 = time.perf_counter(); a @ b; sync(); ts.append(time.perf_counter() - t0)
ts.sort()
print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
                  "gpu": torch.cuda.get_device_name() if gpu else None, "matmul_n": n,
                  "matmul_gflops": 2 * n**3 / ts[len(ts) // 2] / 1e9}))`;
  const got = lastJson(run(python, ['-c', probe], 'the matmul probe'));
  if (values.device === 'cuda' && !got.gpu)
    throw new Error(`--device cuda: torch in ${python} sees no GPU (torch.cuda.is_available() is false)`);
  return { cpu: cpus()[0]?.model ?? 'unknown', cores: cpus().length, ...got };
}

// ---- measuring a process tree -------------------------------------------------------------------------------

interface Sample {
  t: number; // s since the side's start
  cpu: number; // user + system seconds of the live tree (and of the children it reaped)
  rss: number; // MiB, summed over the tree
  load: number; // the host's 1-minute load average: other work sharing the cores
}

const TICK = 100; // USER_HZ

function tree(root: number): number[] {
  const kids = new Map<number, number[]>();
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      kids.set(ppid, [...(kids.get(ppid) ?? []), Number(d)]);
    } catch {} // gone meanwhile
  }
  const out = [root];
  for (let i = 0; i < out.length; i++) out.push(...(kids.get(out[i]) ?? []));
  return out;
}

function sample(root: number, t0: number): Sample | null {
  let cpu = 0;
  let rss = 0;
  let any = false;
  for (const pid of tree(root)) {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      // fields 14-17 (utime, stime, cutime, cstime) are f[11..14]; 24 (rss pages) is f[21]
      cpu += (Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14])) / TICK;
      rss += (Number(f[21]) * 4096) / 2 ** 20;
      any = true;
    } catch {}
  }
  return any ? { t: (Date.now() - t0) / 1000, cpu, rss, load: loadavg()[0] } : null;
}

function cpuAt(samples: Sample[], t: number): number {
  let best = samples[0];
  for (const s of samples) if (Math.abs(s.t - t) < Math.abs(best.t - t)) best = s;
  return best.cpu;
}

/** Runs a side's command, sampling its process tree every 250 ms; resolves with its stdout and the samples. */
function measured(
  cmd: string,
  args: string[],
  env: NodeJS.ProcessEnv,
): Promise<{ out: string; samples: Sample[]; t0: number }> {
  return new Promise((ok, fail) => {
    const t0 = Date.now();
    const p = spawn(cmd, args, { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    p.stdout.on('data', (d) => {
      out += d;
    });
    p.stderr.on('data', (d) => {
      err = (err + d).slice(-8000);
    });
    const samples: Sample[] = [];
    const timer = setInterval(() => {
      const s = p.pid ? sample(p.pid, t0) : null;
      if (s) samples.push(s);
    }, 250);
    p.on('error', fail);
    p.on('close', (code) => {
      clearInterval(timer);
      if (code !== 0) fail(new Error(`${cmd} ${args.join(' ')} exited ${code}:\n${err}`));
      else ok({ out, samples, t0 });
    });
  });
}

// ---- the two sides ------------------------------------------------------------------------------------------

interface Step {
  end: number; // s since the process started
  genS: number;
  genTokens: number;
  updateS: number;
  trainTokens: number;
  toolCalls?: number;
}

interface SideRun {
  steps: Step[];
  peakRssMiB: number;
  cpuPerStep: number[];
  reward: number[];
  meanLoad: number;
}

function finish(steps: Step[], samples: Sample[], reward: number[]): SideRun {
  const cpuPerStep = steps.slice(1).map((s, i) => cpuAt(samples, s.end) - cpuAt(samples, steps[i].end));
  const meanLoad = samples.reduce((a, s) => a + s.load, 0) / samples.length;
  return { steps, peakRssMiB: Math.max(...samples.map((s) => s.rss)), cpuPerStep, reward, meanLoad };
}

async function rstar2(
  model: string,
  data: string,
  variant: string,
  schema: string | undefined,
  dir: string,
): Promise<SideRun> {
  const tool =
    variant === 'tool'
      ? `tool: { name: python_code_with_standard_io, schema: ${schema} }`
      : 'tool: { enabled: false }';
  const recipe = join(dir, 'recipe.yaml');
  mkdirSync(dir, { recursive: true });
  writeFileSync(
    recipe,
    `name: trl-compare
seed: 1
reward: { profile: integer }
model: { path: ${model}, threads: ${threads} }
tokenizer: { template: model }
${tool}
eval: { atStart: false, files: [${data}], n: 1, maxResponseTokens: 16, maxTurns: 1 }
stages:
  - type: rl
    name: rl
    steps: ${steps}
    promptsPerStep: ${S.prompts}
    groupSize: ${S.group}
    oversample: 1
    maxResponseTokens: ${S.maxTokens}
    maxTurns: ${variant === 'tool' ? S.maxTurns : 1}
    lr: ${S.lr}
    checkpointEvery: 100000
    roc: { doDownSampling: false, rejectEqualReward: false }
    data: { files: [${data}] }
`,
  );
  const runDir = join(dir, 'run');
  const { samples, t0 } = await measured(
    process.execPath,
    [BIN, 'train', '--recipe', recipe, '--out', runDir],
    {
      ...childEnv,
      RSTAR2_NO_PROGRESS: '1',
    },
  );
  const metrics = readFileSync(join(runDir, 'metrics.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l))
    .filter((m) => m.stage === 'rl' && typeof m.step === 'number');
  const out: Step[] = metrics.map((m) => {
    const trajs = readFileSync(
      join(runDir, 'trajectories', `rl-step-${String(m.step).padStart(6, '0')}.jsonl`),
      'utf8',
    )
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    const gen = trajs.reduce((a, t) => a + t.responseIds.length, 0);
    return {
      end: (Date.parse(m.time) - t0) / 1000,
      genS: m.time_rollout_s,
      genTokens: gen,
      updateS: m.time_update_s,
      trainTokens: trajs.reduce((a, t) => a + t.promptIds.length + t.responseIds.length, 0),
      toolCalls: m.tool_calls_mean,
    };
  });
  return finish(
    out,
    samples,
    metrics.map((m) => m.reward_mean),
  );
}

async function trl(model: string, data: string, variant: string, dir: string): Promise<SideRun> {
  mkdirSync(dir, { recursive: true });
  const args = [SCRIPT, 'grpo', '--model', model, '--data', data, '--out-dir', dir, '--steps', String(steps)];
  args.push('--prompts', String(S.prompts), '--group', String(S.group), '--max-tokens', String(S.maxTokens));
  args.push('--lr', String(S.lr), '--threads', String(threads), '--max-turns', String(S.maxTurns));
  if (variant === 'tool') args.push('--tools');
  const { out, samples, t0 } = await measured(python, args, {
    ...childEnv,
    TRL_EXPERIMENTAL_SILENCE: '1',
    ...(values['trl-spin'] ? { GOMP_SPINCOUNT: '1000' } : {}),
  });
  const r = lastJson(out);
  const done: Step[] = r.steps.map((s: Record<string, number>) => ({
    end: s.end - t0 / 1000,
    genS: s.gen_s,
    genTokens: s.gen_tokens,
    updateS: s.step_s - s.gen_s,
    trainTokens: s.train_tokens,
    toolCalls: s.tool_calls_per_sample,
  }));
  return finish(done, samples, r.reward_mean);
}

// ---- the run ------------------------------------------------------------------------------------------------

interface Summary {
  stepS: number;
  stepsTimed: number;
  genTokensPerS: number;
  trainTokensPerS: number;
  firstStepS: number;
  peakRssMiB: number;
  cpuPerStepS: number;
  toolCallsPerSample?: number;
  rewardMean: number;
  meanLoad: number;
}

function summarise(runs: SideRun[]): Summary {
  const later = runs.flatMap((r) => r.steps.slice(1).map((s, i) => ({ s, prev: r.steps[i] })));
  const all = runs.flatMap((r) => r.steps);
  const calls = all.map((s) => s.toolCalls).filter((c): c is number => typeof c === 'number');
  return {
    stepS: median(later.map(({ s, prev }) => s.end - prev.end)),
    stepsTimed: later.length,
    genTokensPerS: median(later.map(({ s }) => s.genTokens / s.genS)),
    trainTokensPerS: median(later.map(({ s }) => s.trainTokens / s.updateS)),
    firstStepS: median(runs.map((r) => r.steps[0].end)),
    peakRssMiB: Math.max(...runs.map((r) => r.peakRssMiB)),
    cpuPerStepS: median(runs.flatMap((r) => r.cpuPerStep)),
    ...(calls.length ? { toolCallsPerSample: calls.reduce((a, b) => a + b, 0) / calls.length } : {}),
    rewardMean: runs.flatMap((r) => r.reward).reduce((a, b) => a + b, 0) / all.length,
    meanLoad: runs.reduce((a, r) => a + r.meanLoad, 0) / runs.length,
  };
}

const fmt = (x: number, d = 1) => (Number.isFinite(x) ? x.toFixed(d) : '-');

ensureTrl();
// the probe first: --device cuda without a GPU fails before minutes of building
const host = machine();
const built = build();
const boundTokS = ((host.matmul_gflops as number) * 1e9) / (2 * built.params);
console.log(
  `${host.cpu}, ${host.cores} cores${host.gpu ? `, ${host.gpu}` : ''}; torch ${host.torch}, transformers ` +
    `${host.transformers}, trl ${host.trl}; fp32 matmul ${fmt(host.matmul_gflops as number)} GFLOP/s ` +
    `${host.gpu ? 'on the GPU' : `on ${threads} threads -> decode bound ${fmt(boundTokS, 0)} tokens/s`} for ` +
    `${built.params} parameters (${shape})`,
);
if (built.sft) console.log(`tool SFT: ${JSON.stringify(built.sft)}`);
const results: Record<string, { rstar2: SideRun[]; trl: SideRun[] }> = {};
for (const variant of variants) {
  const model = variant === 'tool' ? (built.tool as string) : built.base;
  const got = { rstar2: [] as SideRun[], trl: [] as SideRun[] };
  results[variant] = got;
  for (let r = 0; r < rounds; r++) {
    // ABBA: each side goes first in every other round
    const order = r % 2 === 0 ? (['rstar2', 'trl'] as const) : (['trl', 'rstar2'] as const);
    for (const side of order) {
      const dir = join(work, `${variant}-${side}-${r}`);
      rmSync(dir, { recursive: true, force: true }); // a run directory of an earlier bench is not resumed
      const t = Date.now();
      const res =
        side === 'rstar2'
          ? await rstar2(model, built.data, variant, built.schema, dir)
          : await trl(model, built.data, variant, dir);
      got[side].push(res);
      const later = res.steps.slice(1).map((s, i) => s.end - res.steps[i].end);
      console.log(
        `${variant} round ${r + 1} ${side}: ${fmt((Date.now() - t) / 1000)} s in all, steps ${later.map((x) => fmt(x)).join(' ')} s`,
      );
    }
  }
}

const report: Record<string, unknown> = {
  bench: 'trl-compare',
  date: new Date().toISOString(),
  machine: host,
  settings: {
    ...S,
    steps,
    rounds,
    threads,
    shape,
    device: host.gpu ? 'cuda' : 'cpu',
    trlSpin: values['trl-spin'],
    params: built.params,
    sft: built.sft,
    decodeBoundTokensPerS: host.gpu ? null : boundTokS,
  },
  variants: {} as Record<string, unknown>,
};
for (const [variant, got] of Object.entries(results)) {
  const a = summarise(got.rstar2);
  const b = summarise(got.trl);
  (report.variants as Record<string, unknown>)[variant] = { rstar2: a, trl: b, runs: got };
  console.log(`\n${variant}: median over ${a.stepsTimed} / ${b.stepsTimed} steps after the first`);
  console.log('                          rstar2       TRL   rstar2/TRL');
  const row = (name: string, x: number, y: number, d = 1) =>
    console.log(
      `${name.padEnd(24)}${fmt(x, d).padStart(8)}${fmt(y, d).padStart(10)}${fmt(x / y, 2).padStart(12)}`,
    );
  row('step s', a.stepS, b.stepS, 2);
  row('generated tokens/s', a.genTokensPerS, b.genTokensPerS, 0);
  row('trained tokens/s', a.trainTokensPerS, b.trainTokensPerS, 0);
  row('time to first step s', a.firstStepS, b.firstStepS);
  row('peak RSS MiB', a.peakRssMiB, b.peakRssMiB, 0);
  row('CPU s per step', a.cpuPerStepS, b.cpuPerStepS, 2);
  if (a.toolCallsPerSample !== undefined || b.toolCallsPerSample !== undefined)
    row('tool calls per sample', a.toolCallsPerSample ?? Number.NaN, b.toolCallsPerSample ?? Number.NaN, 2);
  row('host load (1 min)', a.meanLoad, b.meanLoad);
  // a GPU's decode is bound by memory, not by this rate
  if (!host.gpu)
    console.log(`rstar2 generation: ${fmt((100 * a.genTokensPerS) / boundTokS)} % of the decode bound`);
}
writeFileSync(values.out, `${JSON.stringify(report, null, 1)}\n`);
console.log(`\nwrote ${values.out}`);
