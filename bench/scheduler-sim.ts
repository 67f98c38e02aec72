// Rollout scheduling simulation: named hardware regimes × response budgets × seeds, comparing the static
// split (the live default on small KV pools) with lock-step turns, least-requests, rStar2's worst-case KV budget and the
// predictive 'kv-predict' policy (src/engines/predict.ts, the code the live Scheduler runs). Virtual time,
// deterministic per seed; every assumption is printed in the header and listed in docs/DECISIONS.md.
//
// Engine model (SGLang-like, per engine): a KV pool of C tokens; a FCFS waiting queue admitted while
// SGLang's estimate fits: running requests' remaining max_new_tokens clipped at 4096, × new_token_ratio
// (0.7 → 0.098 over 600 steps, reset on retraction); cached (radix) prefixes count as available and are
// evicted LRU when the pool is actually short. A turn's context stays cached while its tool runs. A decode
// step that overflows evicts cached prefixes, then retracts the newest running request: only the current
// turn's generated tail is freed, its prefix stays cached (and may be evicted later). Re-prefilled tokens
// are tokens computed before and computed again. Decode step = base + kv × running-batch KV + seq × batch;
// prefill = prefillBase + perToken × tokens, in the same step.
//
// Run: flock /tmp/bench.lock npx tsx bench/scheduler-sim.ts [--regime NAME] [--budget 8192|12288]
//        [--seeds 1,2,3] [--calibrate samples.jsonl [--comm-ms MS]] [--order evidence|plain|oracle|oracle-lengths|oracle-peak]
//        [--prompt-share 0.5] [--replay RUN_DIR|EVAL_DIR|T.jsonl[,…]]
// --calibrate fits the regime's time constants (src/engines/calibrate.ts) from {batch, kv, ms} decode-step and
// {tokens, ms} prefill lines measured on your engine, or on one GPU by `python python/bench/decode_timing.py`
// (one tensor-parallel rank: the regime's assumed all-reduce time is added; --comm-ms 0 where the samples came
// from a whole tensor-parallel engine, which includes it); --order plain ranks waiting prompts without their
// in-flight siblings' progress (the ablation of kv-predict's evidence ordering); --order oracle admits each
// sample in order of its true length, which no scheduler can know, oracle-lengths also charges it that length,
// and oracle-peak admits while the engine's true peak KV (from every placed trajectory's true remaining length)
// stays under 98 % of its pool: what perfect length prediction would buy. --prompt-share: how much of the
// log-length variance is the prompt's (default 0.5, assumed); a training run logs its own as rollout.prompt_share.
// --replay draws each seed's trajectories from a real rollout instead of the assumed lengths: whole prompt groups,
// with replacement, each sample's prompt tokens, generated and tool tokens per turn and tool times as recorded
// (a run's trajectories/*.jsonl, an eval's trajectories.jsonl, `rstar2 rollout --out`); --budget defaults to
// the longest response there, and a longer response is cut at --budget.
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fitEngineModel, parseSamples } from '../src/engines/calibrate.js';
import { LengthModel, Overcommit } from '../src/engines/predict.js';
import { AUTO_PREDICT_MIN_KV, KvLedger } from '../src/engines/scheduler.js';
import type { Trajectory } from '../src/rl/trajectory.js';
import { streamJsonl } from '../src/util/jsonl.js';
import { Rng } from '../src/util/rng.js';
import { benchArgs } from './args.js';

interface Regime {
  engines: number;
  trajectories: number; // in all
  capacity: number; // KV tokens per engine
  stepBaseMs: number; // weight read, one rank
  commMs: number; // tensor-parallel all-reduces per step: no single GPU measures it, so --calibrate keeps it
  kvMsPerToken: number; // reading one running-context token's KV
  seqMs: number; // per sequence in the batch (sampling, compute not hidden under the memory read)
  prefillBaseMs: number;
  prefillMsPerToken: number;
}

// Qwen3-14B (the paper's base model): 29.6 GB of bf16 weights; KV 160 KiB per token (40 layers × 8 KV
// heads × 128 × K,V × 2 bytes). Bandwidth/FLOP figures are assumptions (achieved ≈ 80 % of peak
// bandwidth, ≈ 40–48 % of peak FLOPs), not measurements: --calibrate replaces them.
const REGIMES: Record<string, Regime> = {
  // one H100 80 GB per engine; weight read 10 ms ≈ 1.25 × a full 128K-token KV read
  'TP1-80GB': {
    engines: 4,
    trajectories: 512,
    capacity: 131_072,
    stepBaseMs: 10,
    commMs: 0,
    kvMsPerToken: 61e-6,
    seqMs: 0.02,
    prefillBaseMs: 1,
    prefillMsPerToken: 1 / 16,
  },
  // the reference's script: TP4 at gpu_memory_utilization 0.8 ≈ 1.2M KV tokens; 4× the bandwidth and
  // FLOPs, plus ≈ 2 ms of all-reduce per step: weight read ÷ full KV read ≈ 0.25
  'TP4-H100': {
    engines: 2,
    trajectories: 2048,
    capacity: 1_200_000,
    stepBaseMs: 2.5,
    commMs: 2,
    kvMsPerToken: 15.25e-6,
    seqMs: 0.005,
    prefillBaseMs: 2,
    prefillMsPerToken: 1 / 64,
  },
  // the paper's hardware: MI300X 192 GB at 0.8 ≈ 790K KV tokens, ≈ 4.2 TB/s achieved: 7 ms weights,
  // 39 ns per KV token (ratio ≈ 0.23)
  'MI300X-TP1-192GB': {
    engines: 4,
    trajectories: 4096,
    capacity: 790_000,
    stepBaseMs: 7,
    commMs: 0,
    kvMsPerToken: 39e-6,
    seqMs: 0.02,
    prefillBaseMs: 1,
    prefillMsPerToken: 1 / 17.6,
  },
};

const { values: args } = benchArgs(import.meta.url, {
  options: {
    regime: { type: 'string' },
    budget: { type: 'string' },
    seeds: { type: 'string', default: '1,2,3' },
    calibrate: { type: 'string' },
    'comm-ms': { type: 'string' },
    order: { type: 'string', default: 'evidence' },
    'prompt-share': { type: 'string', default: '0.5' },
    replay: { type: 'string' },
  },
});
if (!['evidence', 'plain', 'oracle', 'oracle-lengths', 'oracle-peak'].includes(args.order as string))
  throw new Error(`--order: evidence, plain, oracle, oracle-lengths or oracle-peak, not ${args.order}`);
const GROUP = 16; // GRPO samples per prompt, adjacent in the batch (verl interleave=True)
// share of the log-length variance that belongs to the prompt: an assumption; a training run measures its own
// (metrics.jsonl rollout.prompt_share)
const PROMPT_SHARE = Number(args['prompt-share']);
if (!(PROMPT_SHARE >= 0 && PROMPT_SHARE <= 1))
  throw new Error(`--prompt-share: 0 to 1, not ${args['prompt-share']}`);
const LEN_SIGMA = 0.75; // lognormal response length (all turns, tool tokens included); median = budget / 4
const RATIO_INIT = 0.7; // SGLang init_new_token_ratio
const RATIO_MIN = RATIO_INIT * 0.14; // SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
const RATIO_DECAY = (RATIO_INIT - RATIO_MIN) / 600; // per decode step
const CLIP_ESTIMATE = 4096; // SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
const ORDER = args.order;

interface Turn {
  gen: number;
  toolMs: number;
  toolTokens: number;
}
interface Traj {
  id: number;
  group: string;
  prompt: number;
  turns: Turn[];
  turn: number;
  ctx: number; // context tokens so far
  computed: number; // context tokens ever held in KV (prefilled or decoded)
  turnStart: number; // context when this turn's generation began
  left: number; // tokens still to generate this turn
  engine: number;
}

function lognormal(rng: Rng, median: number, sigma: number): number {
  const u = Math.max(rng.next(), 1e-12);
  const z = Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * rng.next());
  return median * Math.exp(sigma * z);
}

function makeTrajectories(seed: number, n: number, budget: number): Traj[] {
  const rng = new Rng(seed);
  const sigmaPrompt = LEN_SIGMA * Math.sqrt(PROMPT_SHARE);
  const sigmaSample = LEN_SIGMA * Math.sqrt(1 - PROMPT_SHARE);
  let prompt = 0;
  let median = 0;
  return Array.from({ length: n }, (_, id) => {
    if (id % GROUP === 0) {
      prompt = rng.int(300, 700);
      median = lognormal(rng, budget / 4, sigmaPrompt);
    }
    const r = rng.next();
    const nTurns = r < 0.2 ? 1 : r < 0.5 ? 2 : r < 0.75 ? 3 : r < 0.9 ? 4 : 5;
    const toolTokens = Array.from({ length: nTurns - 1 }, () => rng.int(40, 120));
    const toolSum = toolTokens.reduce((a, b) => a + b, 0);
    const total = Math.max(
      nTurns * 20,
      Math.min(budget - toolSum, Math.round(lognormal(rng, median, sigmaSample))),
    );
    const w = Array.from({ length: nTurns }, () => 0.2 + rng.next());
    const ws = w.reduce((a, b) => a + b, 0);
    const turns = w.map((x, i) => ({
      gen: Math.max(10, Math.round((total * x) / ws)),
      // tool latency: lognormal median 200 ms σ 0.8 (mean ≈ 0.28 s, the paper's ≈ 0.3 s), 4 s timeout
      toolMs: Math.min(4000, lognormal(rng, 200, 0.8)),
      toolTokens: toolTokens[i] ?? 0,
    }));
    const group = `p${Math.floor(id / GROUP)}`;
    return {
      id,
      group,
      prompt,
      turns,
      turn: 0,
      ctx: prompt,
      computed: 0,
      turnStart: prompt,
      left: 0,
      engine: -1,
    };
  });
}

interface Sample {
  prompt: number;
  turns: Turn[];
}

/** The trajectory files behind one --replay entry: a file, a run dir's trajectories/, or an eval dir's file. */
function replayFiles(path: string): string[] {
  if (!existsSync(path)) throw new Error(`--replay: ${path} does not exist`);
  if (!statSync(path).isDirectory()) return [path];
  const steps = join(path, 'trajectories');
  if (existsSync(steps) && statSync(steps).isDirectory()) {
    const files = readdirSync(steps)
      .filter((f) => f.endsWith('.jsonl'))
      .sort()
      .map((f) => join(steps, f));
    if (files.length) return files;
  }
  if (existsSync(join(path, 'trajectories.jsonl'))) return [join(path, 'trajectories.jsonl')];
  throw new Error(
    `--replay: ${path} holds neither trajectories/*.jsonl (a run) nor trajectories.jsonl (an eval)`,
  );
}

/** A recorded trajectory as the simulation runs it: one turn per generation, each followed by its tool's
 *  result (tokens and time) if it had one. */
function replaySample(t: Trajectory, where: string): Sample {
  if (!Array.isArray(t.promptIds) || !Array.isArray(t.events) || typeof t.promptId !== 'string')
    throw new Error(`--replay: ${where} is not a trajectory record (promptId, promptIds, events)`);
  const turns: Turn[] = [];
  for (const e of t.events) {
    if (e.kind === 'generation') turns.push({ gen: e.end - e.start, toolMs: 0, toolTokens: 0 });
    else if (e.kind === 'tool_result' && turns.length) {
      const last = turns[turns.length - 1];
      last.toolTokens += e.end - e.start;
      last.toolMs += e.ms;
    }
  }
  return { prompt: t.promptIds.length, turns };
}

async function readReplay(spec: string) {
  const groups = new Map<string, Sample[]>();
  let skipped = 0;
  const files = spec.split(',').flatMap(replayFiles);
  for (const f of files) {
    let line = 0;
    for await (const t of streamJsonl<Trajectory>(f)) {
      line++;
      const s = replaySample(t, `${f}:${line}`);
      if (t.finish === 'error' || !s.turns.length) {
        skipped++; // an engine failure: its lengths say nothing about the policy's
        continue;
      }
      const g = groups.get(t.promptId) ?? [];
      g.push(s);
      groups.set(t.promptId, g);
    }
  }
  const all = [...groups.values()];
  if (!all.length) throw new Error(`--replay: no trajectory without an error in ${files.join(', ')}`);
  return { groups: all, files, skipped };
}

/** One step's batch drawn from the replay: whole groups, with replacement, until n samples; the last group may
 *  be cut short. A response longer than the budget is cut there, as the budget would have ended it. */
function drawReplay(groups: Sample[][], seed: number, n: number, budget: number): Traj[] {
  const rng = new Rng(seed);
  const out: Traj[] = [];
  for (let k = 0; out.length < n; k++) {
    for (const s of rng.pick(groups)) {
      if (out.length === n) break;
      let left = budget;
      const turns: Turn[] = [];
      for (const x of s.turns) {
        if (left <= 0) break;
        const gen = Math.max(1, Math.min(x.gen, left));
        left -= gen + x.toolTokens;
        turns.push({ ...x, gen });
      }
      out.push({
        id: out.length,
        group: `p${k}`,
        prompt: s.prompt,
        turns,
        turn: 0,
        ctx: s.prompt,
        computed: 0,
        turnStart: s.prompt,
        left: 0,
        engine: -1,
      });
    }
  }
  return out;
}

const respLen = (t: Traj) => t.turns.reduce((a, x) => a + x.gen + x.toolTokens, 0);

/** Diagnostic (--order oracle-peak): the most KV these trajectories will hold at once, from their true remaining
 *  lengths, if each grows a token per step (tool waits ignored) and frees its KV when it ends. */
function truePeak(ts: Traj[]): number {
  const xs = ts.map((t) => [t.ctx, t.prompt + respLen(t) - t.ctx]).sort((a, b) => b[1] - a[1]);
  let peak = 0;
  let held = 0;
  for (let j = 0; j < xs.length; j++) {
    held += xs[j][0];
    peak = Math.max(peak, held + (j + 1) * xs[j][1]); // just before the j-th longest ends
  }
  return peak;
}

type Policy = 'static' | 'static-sync' | 'least-requests' | 'kv-budget' | 'kv-predict';
const POLS: Policy[] = ['static', 'static-sync', 'least-requests', 'kv-budget', 'kv-predict'];

class Heap<T> {
  private a: [number, number, T][] = [];
  private seq = 0;
  push(t: number, v: T) {
    this.a.push([t, this.seq++, v]);
    let i = this.a.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (this.less(p, i)) break;
      [this.a[p], this.a[i]] = [this.a[i], this.a[p]];
      i = p;
    }
  }
  pop(): [number, T] | undefined {
    if (this.a.length === 0) return undefined;
    const top = this.a[0];
    const last = this.a.pop() as [number, number, T];
    if (this.a.length > 0) {
      this.a[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < this.a.length && this.less(l, m)) m = l;
        if (r < this.a.length && this.less(r, m)) m = r;
        if (m === i) break;
        [this.a[m], this.a[i]] = [this.a[i], this.a[m]];
        i = m;
      }
    }
    return [top[0], top[2]];
  }
  private less(i: number, j: number) {
    return this.a[i][0] < this.a[j][0] || (this.a[i][0] === this.a[j][0] && this.a[i][1] < this.a[j][1]);
  }
}

interface EngineState {
  running: Traj[];
  waiting: Traj[];
  cached: Map<Traj, number>; // radix-cached prefixes not held by a running request (insertion = LRU)
  cachedSum: number;
  resident: Map<Traj, number>; // KV held by running requests
  residentSum: number;
  stepping: boolean;
  ratio: number;
  busyMs: number;
  kvMs: number; // resident KV tokens × step ms: time-weighted fill
  batchMs: number;
  prefillMs: number;
  retractions: number;
  evictions: number;
  reprefilled: number;
}

interface Result {
  policy: Policy;
  makespan: number;
  tail: number; // seconds from the 90 % finish to the last
  idle: number;
  fill: number; // mean resident KV over capacity while stepping
  batch: number; // mean running batch while stepping
  prefillS: number; // engine seconds spent prefilling, all engines
  retractions: number;
  evictions: number;
  reprefilled: number;
}

function simulate(policy: Policy, src: Traj[], R: Regime, budget: number, prior: number[]): Result {
  const N = R.engines;
  const C = R.capacity;
  const ev = new Heap<() => void>();
  const engines: EngineState[] = Array.from({ length: N }, () => ({
    running: [],
    waiting: [],
    cached: new Map(),
    cachedSum: 0,
    resident: new Map(),
    residentSum: 0,
    stepping: false,
    ratio: RATIO_INIT,
    busyMs: 0,
    kvMs: 0,
    batchMs: 0,
    prefillMs: 0,
    retractions: 0,
    evictions: 0,
    reprefilled: 0,
  }));
  const trajs = src.map((t) => ({ ...t }));
  const ledger = new KvLedger(
    engines.map(() => C),
    1,
  );
  // kv-predict: one global queue per prompt group (a group's unstarted samples share a prediction)
  const model = new LengthModel(budget);
  model.seed(prior);
  const over = new Overcommit();
  const members: Set<Traj>[] = engines.map(() => new Set());
  const charge = (t: Traj) =>
    Math.max(
      t.ctx,
      t.prompt + (ORDER === 'oracle-lengths' ? respLen(t) : model.predict(t.group, t.ctx - t.prompt)),
    );
  const placed = (k: number) => {
    let c = 0;
    for (const t of members[k]) c += charge(t);
    return c;
  };
  const started = new Map<string, Set<Traj>>(); // kv-predict: in-flight trajectories per prompt
  const groups = new Map<string, Traj[]>();
  for (const t of trajs) {
    const g = groups.get(t.group);
    if (g) g.push(t);
    else groups.set(t.group, [t]);
  }
  let fifo = 0;
  let done = 0;
  const finishes: number[] = [];
  const barrier: Traj[][] = engines.map(() => []);
  let now = 0;

  const cacheDel = (e: EngineState, t: Traj) => {
    const v = e.cached.get(t);
    if (v === undefined) return;
    e.cached.delete(t);
    e.cachedSum -= v;
  };
  const cacheSet = (e: EngineState, t: Traj, v: number) => {
    cacheDel(e, t);
    e.cached.set(t, v);
    e.cachedSum += v;
  };
  const residentSet = (e: EngineState, t: Traj, v: number) => {
    e.residentSum += v - (e.resident.get(t) ?? 0);
    e.resident.set(t, v);
  };
  const residentDel = (e: EngineState, t: Traj) => {
    e.residentSum -= e.resident.get(t) ?? 0;
    e.resident.delete(t);
  };
  const used = (e: EngineState) => e.residentSum + e.cachedSum;
  const evictOne = (e: EngineState, keep?: Traj): boolean => {
    for (const c of e.cached.keys()) {
      if (c === keep) continue;
      cacheDel(e, c);
      e.evictions++;
      if (policy === 'kv-predict' && members[c.engine].has(c)) over.pressure();
      return true;
    }
    return false;
  };

  const submit = (t: Traj) => {
    const e = engines[t.engine];
    t.left = t.turns[t.turn].gen;
    e.waiting.push(t);
    if (!e.stepping) step(t.engine);
  };

  const place = (t: Traj, i: number) => {
    t.engine = i;
    submit(t);
  };

  const admitController = () => {
    if (policy === 'kv-predict') {
      for (;;) {
        // predicted-longest group first (its in-flight siblings' progress is evidence); ties: the group
        // with fewest started, so every prompt gets a probe early
        let best: Traj[] | undefined;
        let bestLen = -1;
        for (const [g, q] of groups) {
          if (q.length === 0) continue;
          const run = ORDER === 'evidence' ? [...(started.get(g) ?? [])].map((x) => x.ctx - x.prompt) : [];
          const p = model.predict(g, 0, run) - (ORDER === 'evidence' ? run.length * 1e-6 : 0);
          if (p > bestLen) [best, bestLen] = [q, p];
        }
        if (ORDER.startsWith('oracle')) {
          // diagnostic: each sample's true length, which no scheduler has, longest first
          let longest: Traj | undefined;
          for (const q of groups.values())
            for (const x of q) if (!longest || respLen(x) > respLen(longest)) [longest, best] = [x, q];
          if (best && longest) best.unshift(...best.splice(best.indexOf(longest), 1));
        }
        if (!best) return;
        const t = best[0];
        let i = -1;
        let free = Number.NEGATIVE_INFINITY;
        for (let k = 0; k < N; k++) {
          const f =
            ORDER === 'oracle-peak'
              ? 0.98 * C - truePeak([...members[k], t])
              : C * (1 + over.value) - placed(k);
          if (f > free) [free, i] = [f, k];
        }
        if (free < (ORDER === 'oracle-peak' ? 0 : charge(t)) && members[i].size > 0) return;
        best.shift();
        members[i].add(t);
        started.get(t.group)?.add(t) ?? started.set(t.group, new Set([t]));
        place(t, i);
      }
    }
    while (fifo < trajs.length) {
      const t = trajs[fifo];
      let i: number | null;
      if (policy === 'kv-budget') i = ledger.choose('kv-budget', t.prompt + budget);
      else if (policy === 'least-requests') i = ledger.choose('least-requests', 0);
      else i = t.id % N; // static split: trajectory i → engine i mod N, all up front
      if (i === null) return;
      ledger.take(i, policy === 'kv-budget' ? t.prompt + budget : 0);
      fifo++;
      place(t, i);
    }
  };

  const finish = (t: Traj) => {
    ledger.give(t.engine, policy === 'kv-budget' ? t.prompt + budget : 0);
    if (policy === 'kv-predict') {
      members[t.engine].delete(t);
      started.get(t.group)?.delete(t);
      model.record(t.group, t.ctx - t.prompt);
      over.clean();
    }
    done++;
    finishes.push(now);
    admitController();
  };

  const step = (i: number) => {
    const e = engines[i];
    let prefill = 0;
    while (e.waiting.length > 0) {
      const t = e.waiting[0];
      const have = Math.min(t.ctx, e.cached.get(t) ?? 0);
      const need = t.ctx - have + 1;
      let future = 0;
      for (const r of e.running) future += e.ratio * Math.min(CLIP_ESTIMATE, budget - (r.ctx - r.prompt));
      const estimate = C - e.residentSum - future;
      const mine = e.ratio * Math.min(CLIP_ESTIMATE, budget - (t.ctx - t.prompt));
      if (estimate < need + mine && e.running.length > 0) break;
      while (C - used(e) < need && evictOne(e, t)) {}
      if (C - used(e) < need) break;
      e.waiting.shift();
      cacheDel(e, t);
      residentSet(e, t, t.ctx);
      prefill += t.ctx - have;
      e.reprefilled += Math.max(0, Math.min(t.ctx, t.computed) - have);
      t.computed = Math.max(t.computed, t.ctx);

      e.running.push(t);
    }
    if (e.running.length === 0) {
      e.stepping = false;
      return;
    }
    e.stepping = true;
    e.ratio = Math.max(RATIO_MIN, e.ratio - RATIO_DECAY);
    const prefillMs = prefill > 0 ? R.prefillBaseMs + R.prefillMsPerToken * prefill : 0;
    const ms =
      R.stepBaseMs + R.commMs + R.kvMsPerToken * e.residentSum + R.seqMs * e.running.length + prefillMs;
    e.busyMs += ms;
    e.kvMs += e.residentSum * ms;
    e.batchMs += e.running.length * ms;
    e.prefillMs += prefillMs;
    ev.push(now + ms, () => {
      const still: Traj[] = [];
      for (const t of e.running) {
        t.ctx++;
        t.computed = Math.max(t.computed, t.ctx);
        t.left--;
        residentSet(e, t, t.ctx);
        if (t.left > 0) {
          still.push(t);
          continue;
        }
        residentDel(e, t);
        const turn = t.turns[t.turn];
        if (t.turn === t.turns.length - 1) {
          finish(t);
          continue;
        }
        cacheSet(e, t, t.ctx); // the context stays in the radix cache while the tool runs
        if (policy === 'static-sync') {
          barrier[i].push(t);
          continue;
        }
        ev.push(now + turn.toolMs, () => {
          t.turn++;
          t.ctx += turn.toolTokens;
          t.turnStart = t.ctx;
          submit(t);
        });
      }
      e.running = still;
      if (policy === 'static-sync' && still.length === 0 && e.waiting.length === 0 && barrier[i].length > 0) {
        // lock-step turns: the engine's whole batch runs its tools together, then the next turn
        const group = barrier[i];
        barrier[i] = [];
        const wait = Math.max(...group.map((t) => t.turns[t.turn].toolMs));
        ev.push(now + wait, () => {
          for (const t of group) {
            t.ctx += t.turns[t.turn].toolTokens;
            t.turn++;
            t.turnStart = t.ctx;
            submit(t);
          }
        });
      }
      // decode overflow: evict cached prefixes, then retract the newest running request; only this
      // turn's generated tail is freed, its prefix stays cached
      while (used(e) > C) {
        if (evictOne(e)) continue;
        const v = e.running.pop() as Traj;
        residentDel(e, v);
        if (v.turnStart > 0) cacheSet(e, v, Math.min(v.turnStart, v.ctx));

        e.retractions++;
        if (policy === 'kv-predict') over.pressure();
        e.ratio = RATIO_INIT;
        e.waiting.unshift(v);
      }
      step(i);
    });
  };

  admitController();
  for (let x = ev.pop(); x; x = ev.pop()) {
    now = x[0];
    x[1]();
  }
  if (done !== trajs.length) throw new Error(`${policy}: only ${done}/${trajs.length} trajectories finished`);
  finishes.sort((a, b) => a - b);
  const p90 = finishes[Math.floor(finishes.length * 0.9) - 1] ?? 0;
  return {
    policy,
    makespan: now / 1000,
    tail: (now - p90) / 1000,
    idle: engines.reduce((a, e) => a + (1 - e.busyMs / now), 0) / N,
    fill: engines.reduce((a, e) => a + e.kvMs / e.busyMs / C, 0) / N,
    batch: engines.reduce((a, e) => a + e.batchMs / e.busyMs, 0) / N,
    prefillS: engines.reduce((a, e) => a + e.prefillMs, 0) / 1000,
    retractions: engines.reduce((a, e) => a + e.retractions, 0),
    evictions: engines.reduce((a, e) => a + e.evictions, 0),
    reprefilled: engines.reduce((a, e) => a + e.reprefilled, 0),
  };
}

const regimeNames = args.regime ? [args.regime] : Object.keys(REGIMES);
for (const n of regimeNames)
  if (!REGIMES[n]) throw new Error(`unknown --regime ${n} (${Object.keys(REGIMES).join(', ')})`);
const replay = args.replay ? await readReplay(args.replay) : undefined;
const longest = replay ? Math.max(...replay.groups.flat().map((x) => respLen(x as Traj))) : 0;
const budgets = args.budget ? [Number(args.budget)] : replay ? [longest] : [8192, 12288];
const seeds = (args.seeds as string).split(',').map(Number);
for (const [k, xs] of Object.entries({ budget: budgets, seeds }))
  if (!xs.every((x) => Number.isInteger(x) && x > 0))
    throw new Error(`--${k}: positive integers, got ${args[k as 'budget']}`);
const samplesFile = args.calibrate;
const calibrated = samplesFile
  ? (() => {
      const { steps, prefills } = parseSamples(readFileSync(samplesFile, 'utf8'));
      return fitEngineModel(steps, prefills);
    })()
  : undefined;

const commMs = args['comm-ms'] === undefined ? undefined : Number(args['comm-ms']);
if (commMs !== undefined && !(commMs >= 0))
  throw new Error(`--comm-ms: a number ≥ 0, not ${args['comm-ms']}`);

const range = (xs: number[], d = 2) => {
  const lo = Math.min(...xs);
  const hi = Math.max(...xs);
  return lo.toFixed(d) === hi.toFixed(d) ? lo.toFixed(d) : `${lo.toFixed(d)}–${hi.toFixed(d)}`;
};
const kilo = (x: number) =>
  x >= 1e6 ? `${(x / 1e6).toFixed(2)}M` : x >= 1e3 ? `${(x / 1e3).toFixed(0)}K` : String(x);
const kiloRange = (xs: number[]) => {
  const lo = kilo(Math.min(...xs));
  const hi = kilo(Math.max(...xs));
  return lo === hi ? lo : `${lo}–${hi}`;
};

const lengths = replay
  ? `lengths replayed from ${replay.groups.flat().length} trajectories of ${replay.groups.length} prompts in ` +
    `${replay.files.length} file(s)${replay.skipped ? ` (${replay.skipped} with an engine error left out)` : ''}, ` +
    'whole groups drawn with replacement'
  : `groups of ${GROUP} samples per prompt, response length lognormal median budget/4 σ ${LEN_SIGMA} ` +
    `(prompt share ${PROMPT_SHARE}), 1–5 turns, tool latency lognormal 200 ms σ 0.8 (≤ 4 s)`;
console.log(
  `scheduler-sim: seeds ${seeds.join(',')}; ${lengths}; ` +
    'engine = SGLang-like (FCFS, new_token_ratio admission with min(max_new, 4096), radix LRU, ' +
    'tail-only retraction); static = round-robin, all up front; kv-predict learns lengths from the previous ' +
    'step (seed + 100), never this one',
);
if (calibrated) console.log(`calibrated from ${samplesFile}: ${JSON.stringify(calibrated)}`);
for (const name of regimeNames) {
  const R = { ...REGIMES[name], ...calibrated, ...(commMs === undefined ? {} : { commMs }) };
  for (const budget of budgets) {
    const measured: number[] = []; // the prompt share as a training run's metrics would report it
    const runs = seeds.map((seed) => {
      const draw = (k: number) =>
        replay
          ? drawReplay(replay.groups, k, R.trajectories, budget)
          : makeTrajectories(k, R.trajectories, budget);
      const trajs = draw(seed);
      const prior = draw(seed + 100).map(respLen);
      const lm = new LengthModel(budget);
      for (const t of trajs) lm.record(t.group, respLen(t));
      measured.push(lm.promptShare() ?? Number.NaN);
      return POLS.map((p) => simulate(p, trajs, R, budget, prior));
    });
    console.log(
      `\n${name}${calibrated ? ' (calibrated)' : ''}: ${R.engines} engines × ${R.trajectories / R.engines} trajectories, ` +
        `${kilo(R.capacity)} KV tokens each, step ${R.stepBaseMs.toFixed(2)} ms + ${R.commMs} ms all-reduce + ${(R.kvMsPerToken * 1e6).toFixed(2)} ns/KV token + ` +
        `${(R.seqMs * 1000).toFixed(0)} µs/seq (weights and all-reduce ÷ full KV ${((R.stepBaseMs + R.commMs) / (R.kvMsPerToken * R.capacity)).toFixed(2)}), budget ${budget}; ` +
        `prompt share as a run's rollout.prompt_share would read it ${range(measured)}`,
    );
    console.log(
      'policy          makespan_s       ×static      tail_s       idle        retract      evict        re-prefilled' +
        '    kv fill      batch     prefill_s',
    );
    for (const [k, p] of POLS.entries()) {
      const rs = runs.map((r) => r[k]);
      const speed = runs.map((r) => r[0].makespan / r[k].makespan);
      console.log(
        `${p.padEnd(15)} ${range(
          rs.map((r) => r.makespan),
          1,
        ).padStart(12)}  ${range(speed).padStart(11)}  ` +
          `${range(
            rs.map((r) => r.tail),
            1,
          ).padStart(11)}  ${range(
            rs.map((r) => r.idle),
            3,
          ).padStart(11)}  ` +
          `${range(
            rs.map((r) => r.retractions),
            0,
          ).padStart(11)}  ${range(
            rs.map((r) => r.evictions),
            0,
          ).padStart(11)}  ` +
          `${kiloRange(rs.map((r) => r.reprefilled)).padStart(14)}  ${range(
            rs.map((r) => r.fill),
            2,
          ).padStart(9)}  ${range(
            rs.map((r) => r.batch),
            0,
          ).padStart(9)}  ${range(
            rs.map((r) => r.prefillS),
            1,
          ).padStart(12)}`,
      );
    }
    const pi = POLS.indexOf('kv-predict');
    const si = POLS.indexOf('static-sync');
    const vsStatic = runs.map((r) => r[0].makespan / r[pi].makespan);
    const vsSync = runs.map((r) => r[si].makespan / r[pi].makespan);
    const fewer = runs.map((r) => 1 - r[pi].reprefilled / Math.max(1, r[0].reprefilled));
    // the live default ('auto') as the Scheduler would resolve it for these engines
    const auto = R.capacity >= AUTO_PREDICT_MIN_KV ? 'kv-predict' : 'static';
    const autoVs = runs.map((r) => r[0].makespan / r[POLS.indexOf(auto)].makespan);
    console.log(`live default (auto → ${auto}): ${range(autoVs)}× static (target: never below 0.97)`);
    console.log(
      `kv-predict: ${range(vsStatic)}× static (target ≥ 1.15 where KV-bound), ${range(vsSync)}× static-sync ` +
        `(≥ 1.2), ${range(
          fewer.map((x) => x * 100),
          0,
        )} % fewer re-prefilled tokens than static (≥ 80)`,
    );
  }
}
