// Rollout scheduling simulation: 4 engines × 512 trajectories, comparing a static equal split,
// least-requests routing and rStar2's KV-budget admission. Virtual time, deterministic (seeded).
// Every modelling assumption is printed in the output header and listed in docs/DECISIONS.md.
//
// Engine model (SGLang-like): a KV pool of C tokens; a waiting queue admitted FCFS with SGLang's
// new_token_ratio estimate (0.7 → 0.098 over 600 steps, reset on retraction) of running requests'
// remaining max_new_tokens clipped at 4096 (SGLang srt/environ.py defaults); admission may evict tool-waiting prefixes from the radix cache (LRU); a
// decode step that overflows evicts cached prefixes, then retracts the newest running requests to
// the waiting queue (KV freed, re-prefilled later). Every eviction/retraction is counted as
// over-subscription and its re-prefill as recomputed tokens. Decode step time is a roofline:
// max(weights + running-batch KV read, batch × per-token FLOPs), plus any prefill in that step.
// Cached (tool-waiting) prefixes are not read by decode. Tool latency: lognormal, mean ≈ 0.3 s
// (the paper's figure, notes rollout-anchors §4.1), capped at the 4 s sandbox timeout.
//
// Policies: 'static' = verl's split: trajectory i goes to engine i mod N up front and every engine
// runs all its trajectories concurrently (each its own async task), its own queue deciding admission;
// 'static-sync' = the same split with lock-step turns per engine (the paper's "tool calls synchronise
// trajectories" baseline, not the released verl loop); 'least-requests' = fewest active
// trajectories, at most LR_CAP_PER_ENGINE each (a slime-style controller semaphore; the cap is an
// assumption); 'kv-budget' = rStar2's worst-case reservation (prompt + response budget) via the real
// KvLedger; 'kv-incremental' = reservation grown in CHUNK steps (sim-only, preempts when growth
// deadlocks); 'kv-expected' = sticky placement on the engine with most free KV where each placed
// trajectory is charged max(live context, prompt + E[final length | length so far]), E learned
// from the previous RL step's batch (seed + 1); engine retraction is the backstop, reported.
//
// Run: flock /tmp/bench.lock npx tsx bench/scheduler-sim.ts [--seed N] [--trajectories 512]
//        [--engines 4] [--capacity TOKENS (default: sweep 64K/128K/256K)] [--median 2000] [--sigma 0.75]
//        [--group 16] [--prompt-share 0.5] [--split chunk|mod]
import { KvLedger } from '../src/engines/scheduler.js';
import { Rng } from '../src/util/rng.js';

const arg = (name: string, def: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? Number(process.argv[i + 1]) : def;
};
const SEED = arg('seed', 1);
const N_TRAJ = arg('trajectories', 512);
const N_ENG = arg('engines', 4);
// KV capacities to sweep (tokens per engine). Qwen3-14B (the paper's base model, notes §5.3): 40 layers ×
// 8 KV heads × 128 dims × K,V × bf16 = 160 KiB per token; an 80 GB GPU at the reference's
// gpu_memory_utilization 0.8 minus 29.6 GB of weights leaves ≈ 190K tokens. 64K/128K/256K bracket it.
const CAPACITIES = process.argv.includes('--capacity')
  ? [arg('capacity', 131_072)]
  : [65_536, 131_072, 262_144];
const BUDGET = 8192; // max response tokens incl. tool tokens (stage-1 recipe, notes §5.1)
const MAX_TURNS = 5; // max_assistant_turns (notes §5.2)
// Response length (all turns, tool tokens included): lognormal, capped at the budget. The notes give no
// length distribution; median 2000 / sigma 0.75 is an assumption (≈2.5% truncated at 8K). The
// reference's scheduler docstring targets the regime where the average approaches the maximum:
// try --median 5000 for it.
const LEN_MEDIAN = arg('median', 2000);
const LEN_SIGMA = arg('sigma', 0.75);
// GRPO rollouts come in groups: G samples of one prompt, adjacent in the batch (verl repeats each prompt
// with interleave=True). A prompt's difficulty moves all of its samples' lengths together; PROMPT_SHARE is
// the share of the log-length variance that belongs to the prompt (assumption: no figure in the notes;
// --prompt-share 0 gives i.i.d. lengths, --group 1 no groups).
const GROUP = arg('group', 16);
const PROMPT_SHARE = arg('prompt-share', 0.5);
// How the static baseline splits the batch: 'chunk' = verl AgentLoopManager's equal contiguous chunks
// (notes §4.2), 'mod' = trajectory i to engine i mod N (the most even static split there is).
const SPLIT = process.argv.includes('--split') ? process.argv[process.argv.indexOf('--split') + 1] : 'chunk';
if (SPLIT !== 'chunk' && SPLIT !== 'mod') throw new Error(`--split must be chunk or mod, got ${SPLIT}`);
const staticEngine = (id: number) =>
  SPLIT === 'mod' ? id % N_ENG : Math.floor(id / Math.ceil(N_TRAJ / N_ENG));
// Decode step (roofline): memory time = weights read once + the KV of the *running* batch read once;
// compute time = batch × 2·14.8e9 FLOP at ≈ 470 TFLOP/s effective (H100 bf16 989 peak, ~48% MFU).
// Step = max(memory, compute). Hardware figures are assumptions (H100 SXM 3.35 TB/s, ~80% achieved),
// not from the notes. Tool-waiting (cached) prefixes are not read by decode.
const STEP_BASE_MS = 10; // 29.6 GB of weights / ~2.7 TB/s ≈ 11 ms
const KV_MS_PER_TOKEN = 61e-6; // 160 KiB / 2.7 TB/s ≈ 61 ns per running-context token
const PREFILL_TOK_PER_S = 16_000; // compute-bound: 470e12 / 29.6e9 FLOP per token
const DECODE_MS_PER_SEQ = 1000 / PREFILL_TOK_PER_S; // same FLOPs per token as prefill
const LR_CAP_PER_ENGINE = 32; // least-requests: concurrent trajectories per engine the controller allows
const RATIO_INIT = 0.7; // SGLang init_new_token_ratio
const RATIO_MIN = RATIO_INIT * 0.14; // SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR (sglang srt/environ.py)
const CLIP_ESTIMATE = 4096; // SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION: per-request cap in the admission estimate
const remainingEstimate = (t: Traj) => Math.min(CLIP_ESTIMATE, BUDGET - (t.ctx - t.prompt));
const RATIO_DECAY = (RATIO_INIT - RATIO_MIN) / 600; // per decode step
const CHUNK = 1024; // kv-incremental: reservation grows in steps of this many tokens
const HEADROOM = CHUNK; // kv-incremental: admit a new trajectory only if this much credit stays free (as live)

interface Turn {
  gen: number;
  toolMs: number;
  toolTokens: number;
}
interface Traj {
  id: number;
  prompt: number;
  turns: Turn[];
  turn: number;
  ctx: number; // tokens of context so far
  left: number; // tokens still to generate this turn
  engine: number;
}

function lognormal(rng: Rng, median: number, sigma: number): number {
  const u = Math.max(rng.next(), 1e-12);
  const z = Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * rng.next());
  return median * Math.exp(sigma * z);
}

function makeTrajectories(seed: number): Traj[] {
  const rng = new Rng(seed);
  const sigmaPrompt = LEN_SIGMA * Math.sqrt(PROMPT_SHARE);
  const sigmaSample = LEN_SIGMA * Math.sqrt(1 - PROMPT_SHARE);
  let prompt = 0;
  let median = LEN_MEDIAN;
  return Array.from({ length: N_TRAJ }, (_, id) => {
    if (id % GROUP === 0) {
      // a new prompt: its G samples share the prompt tokens and the prompt's difficulty
      prompt = rng.int(300, 700);
      median = lognormal(rng, LEN_MEDIAN, sigmaPrompt);
    }
    const r = rng.next();
    const nTurns = r < 0.2 ? 1 : r < 0.5 ? 2 : r < 0.75 ? 3 : r < 0.9 ? 4 : 5;
    const toolTokens = Array.from({ length: nTurns - 1 }, () => rng.int(40, 120));
    const toolSum = toolTokens.reduce((a, b) => a + b, 0);
    const total = Math.max(
      nTurns * 20,
      Math.min(BUDGET - toolSum, Math.round(lognormal(rng, median, sigmaSample))),
    );
    const w = Array.from({ length: nTurns }, () => 0.2 + rng.next());
    const ws = w.reduce((a, b) => a + b, 0);
    const turns = w.map((x, i) => ({
      gen: Math.max(10, Math.round((total * x) / ws)),
      toolMs: Math.min(4000, lognormal(rng, 200, 0.8)),
      toolTokens: toolTokens[i] ?? 0,
    }));
    return { id, prompt, turns, turn: 0, ctx: prompt, left: 0, engine: -1 };
  });
}

type Policy = 'static-sync' | 'static' | 'least-requests' | 'kv-budget' | 'kv-incremental' | 'kv-expected';

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
  cached: Map<Traj, number>; // tool-waiting trajectories' KV (evictable, insertion = LRU order)
  resident: Map<Traj, number>; // KV tokens currently held by running trajectories
  stepping: boolean;
  paused: Traj[]; // kv-incremental: waiting for reservation growth (KV kept)
  ratio: number; // SGLang new_token_ratio
  busyMs: number;
  retractions: number;
  evictions: number;
  recomputed: number;
  peakUsed: number;
  steps: number;
  batchSum: number;
  queueSum: number;
}

/** kv-expected: E[final response length | already ≥ g], from the previous RL step's batch. */
function conditionalMean(prev: number[]): (g: number) => number {
  const sorted = [...prev].sort((a, b) => a - b);
  const suffix = new Array<number>(sorted.length + 1).fill(0);
  for (let k = sorted.length - 1; k >= 0; k--) suffix[k] = suffix[k + 1] + sorted[k];
  return (g) => {
    let lo = 0;
    let hi = sorted.length;
    while (lo < hi) {
      const m = (lo + hi) >> 1;
      if (sorted[m] < g) lo = m + 1;
      else hi = m;
    }
    return lo === sorted.length ? BUDGET : Math.min(BUDGET, Math.max(g, suffix[lo] / (sorted.length - lo)));
  };
}

function simulate(policy: Policy, trajs: Traj[], CAPACITY: number, expected: (g: number) => number) {
  const ev = new Heap<() => void>();
  const engines: EngineState[] = Array.from({ length: N_ENG }, () => ({
    running: [],
    waiting: [],
    cached: new Map(),
    resident: new Map(),
    stepping: false,
    paused: [],
    ratio: RATIO_INIT,
    busyMs: 0,
    retractions: 0,
    evictions: 0,
    recomputed: 0,
    peakUsed: 0,
    steps: 0,
    batchSum: 0,
    queueSum: 0,
  }));
  // kv-expected: trajectories placed on each engine; each is charged max(live context, prompt +
  // E[final length | length so far]) — live usage plus expected growth, tool-waiting prefixes included
  const members: Set<Traj>[] = engines.map(() => new Set());
  const charge = (t: Traj) => Math.max(t.ctx, t.prompt + expected(t.ctx - t.prompt));
  const expFree = (k: number) => {
    let c = 0;
    for (const t of members[k]) c += charge(t);
    return CAPACITY - c;
  };
  const ledger = new KvLedger(
    engines.map(() => CAPACITY),
    1,
  );
  const pending = trajs.map((t) => ({ ...t, turns: t.turns, turn: 0, ctx: t.prompt, engine: -1 }));
  let queueHead = 0;
  const res = new Map<Traj, number>(); // kv-incremental reservation per trajectory
  let preemptions = 0;
  let done = 0;
  const toolsOut = engines.map(() => 0);
  const barrier: Traj[][] = engines.map(() => []);
  const readmit: Traj[] = [];
  let now = 0;
  const used = (e: EngineState) => sum(e.resident) + sum(e.cached);

  const submit = (t: Traj) => {
    const e = engines[t.engine];
    t.left = t.turns[t.turn].gen;
    e.waiting.push(t);
    if (!e.stepping) step(t.engine);
  };

  const admitController = () => {
    while (readmit.length > 0) {
      const v = readmit[0];
      let i: number | null = null;
      for (let k = 0; k < N_ENG; k++) {
        if (ledger.free(k) >= (res.get(v) as number) && (i === null || ledger.free(k) > ledger.free(i)))
          i = k;
      }
      if (i === null) return;
      readmit.shift();
      ledger.active[v.engine]--;
      ledger.take(i, res.get(v) as number);
      v.engine = i;
      engines[i].waiting.push(v);
      if (!engines[i].stepping) step(i);
    }
    while (queueHead < pending.length) {
      const t = pending[queueHead];
      const budget = t.prompt + BUDGET;
      let i: number | null;
      if (policy === 'static' || policy === 'static-sync') i = staticEngine(t.id);
      else if (policy === 'least-requests') {
        const inflight = ledger.active.reduce((a, b) => a + b, 0);
        i = inflight < LR_CAP_PER_ENGINE * N_ENG ? ledger.choose('least-requests', budget) : null;
      } else if (policy === 'kv-budget') i = ledger.choose('kv-budget', budget);
      else if (policy === 'kv-expected') {
        i = null;
        let best = Number.NEGATIVE_INFINITY;
        for (let k = 0; k < N_ENG; k++) {
          const f = expFree(k);
          if (f > best) [best, i] = [f, k];
        }
        if (best < charge(t)) i = null; // FIFO: the head waits for a finish
      } else {
        // growth of admitted trajectories goes first: no new work on an engine with paused ones
        i = null;
        for (let k = 0; k < N_ENG; k++) {
          if (engines[k].paused.length > 0) continue;
          if (
            ledger.free(k) >= t.prompt + CHUNK + HEADROOM &&
            (i === null || ledger.free(k) > ledger.free(i))
          )
            i = k;
        }
      }
      if (i === null) return;
      if (policy === 'kv-incremental') {
        ledger.take(i, t.prompt + CHUNK);
        res.set(t, t.prompt + CHUNK);
      } else if (policy === 'kv-expected') {
        ledger.take(i, 0);
        members[i].add(t);
      } else ledger.take(i, budget);
      queueHead++;
      t.engine = i;
      submit(t);
    }
  };

  const finish = (t: Traj) => {
    const held =
      policy === 'kv-incremental' ? (res.get(t) as number) : policy === 'kv-expected' ? 0 : t.prompt + BUDGET;
    ledger.give(t.engine, held);
    members[t.engine].delete(t);
    done++;
    if (policy === 'kv-incremental') for (let k = 0; k < N_ENG; k++) if (!engines[k].stepping) step(k);
    admitController();
  };

  // kv-incremental: every sequence about to decode must hold a reservation covering its next token
  const ensure = (i: number, t: Traj): boolean => {
    const r = res.get(t) as number;
    if (t.ctx + 1 <= r) return true;
    const grow = Math.max(CHUNK, t.ctx + 1 - r);
    if (ledger.free(i) < grow) return false;
    ledger.grow(i, grow);
    res.set(t, r + grow);
    return true;
  };

  const step = (i: number) => {
    const e = engines[i];
    if (policy === 'kv-incremental') {
      const blocked = (t: Traj) => !ensure(i, t);
      const retry = e.paused;
      e.paused = [];
      for (const t of retry) (blocked(t) ? e.paused : e.waiting).push(t);
      e.running = e.running.filter((t) => !(blocked(t) && e.paused.push(t)));
      e.waiting = e.waiting.filter((t) => !(blocked(t) && e.paused.push(t)));
      if (e.running.length === 0 && e.waiting.length === 0 && e.paused.length > 0 && !toolsOut[i]) {
        // every sequence here waits for growth: preempt the newest (drop its KV, re-admit later)
        const v = e.paused.pop() as Traj;
        e.resident.delete(v);
        e.cached.delete(v);
        ledger.give(i, res.get(v) as number);
        preemptions++;
        e.recomputed += v.ctx - v.prompt;
        res.set(v, v.ctx + CHUNK);
        readmit.push(v);
        return step(i);
      }
    }
    // admission inside the engine: while the request's missing KV fits (evicting cached prefixes)
    let prefill = 0;
    while (e.waiting.length > 0) {
      const t = e.waiting[0];
      const have = e.cached.get(t) ?? e.resident.get(t) ?? 0;
      const need = t.ctx - have + 1;
      // SGLang-style admission: keep room for running requests' future tokens, estimated as
      // new_token_ratio × their remaining max_new_tokens (ratio decays, resets on retraction)
      const future = e.running.reduce((a, r) => a + e.ratio * remainingEstimate(r), 0);
      // evictable cached prefixes count as available, as in SGLang's PrefillAdder
      const estimate = CAPACITY - sum(e.resident) - future + have;
      if (estimate < need + e.ratio * remainingEstimate(t) && e.running.length > 0) break;
      // allocation: evict other cached prefixes (LRU) only if the KV is actually short
      for (const c of e.cached.keys()) {
        if (CAPACITY - used(e) + have >= need) break;
        if (c === t) continue;
        e.cached.delete(c);
        e.evictions++;
      }
      if (CAPACITY - used(e) + have < need) break;
      e.waiting.shift();
      e.cached.delete(t);
      e.resident.set(t, t.ctx);
      prefill += t.ctx - have;
      if (have === 0 && (t.turn > 0 || t.ctx > t.prompt)) e.recomputed += t.ctx - (t.turn > 0 ? 0 : t.prompt);
      e.running.push(t);
    }
    if (e.running.length === 0) {
      e.stepping = false;
      return;
    }
    e.stepping = true;
    e.ratio = Math.max(RATIO_MIN, e.ratio - RATIO_DECAY);
    const u = used(e);
    e.peakUsed = Math.max(e.peakUsed, u);
    e.steps++;
    e.batchSum += e.running.length;
    e.queueSum += e.waiting.length;
    const memMs = STEP_BASE_MS + KV_MS_PER_TOKEN * sum(e.resident);
    const ms = Math.max(memMs, e.running.length * DECODE_MS_PER_SEQ) + (prefill / PREFILL_TOK_PER_S) * 1000;
    e.busyMs += ms;
    ev.push(now + ms, () => {
      const still: Traj[] = [];
      for (const t of e.running) {
        t.ctx++;
        t.left--;
        e.resident.set(t, t.ctx);
        if (t.left > 0) {
          still.push(t);
          continue;
        }
        e.resident.delete(t);
        const turn = t.turns[t.turn];
        if (t.turn === t.turns.length - 1 || t.turn + 1 >= MAX_TURNS) {
          finish(t);
          continue;
        }
        e.cached.set(t, t.ctx); // prefix stays in the radix cache while the tool runs
        if (policy === 'static-sync') {
          barrier[i].push(t);
          continue;
        }
        toolsOut[i]++;
        ev.push(now + turn.toolMs, () => {
          toolsOut[i]--;
          t.turn++;
          t.ctx += turn.toolTokens;
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
            submit(t);
          }
        });
      }
      // decode growth overflowed: evict cached prefixes, then retract the newest running requests
      while (used(e) > CAPACITY) {
        const first = e.cached.keys().next();
        if (!first.done) {
          e.cached.delete(first.value);
          e.evictions++;
          continue;
        }
        const victim = e.running.pop() as Traj;
        e.resident.delete(victim);
        e.retractions++;
        e.ratio = RATIO_INIT;
        e.waiting.unshift(victim);
      }
      step(i);
    });
  };

  admitController();
  for (let x = ev.pop(); x; x = ev.pop()) {
    now = x[0];
    x[1]();
  }
  if (done !== N_TRAJ) throw new Error(`${policy}: only ${done}/${N_TRAJ} trajectories finished`);
  const makespan = now / 1000;
  const idle = engines.map((e) => 1 - e.busyMs / now);
  return {
    policy,
    makespan,
    idle: idle.reduce((a, b) => a + b, 0) / N_ENG,
    retractions: engines.reduce((a, e) => a + e.retractions, 0),
    evictions: engines.reduce((a, e) => a + e.evictions, 0),
    recomputed: engines.reduce((a, e) => a + e.recomputed, 0),
    peakUsedFrac: Math.max(...engines.map((e) => e.peakUsed)) / CAPACITY,
    peakReservedFrac: Math.max(...ledger.peakReserved) / CAPACITY,
    preemptions,
    meanBatch:
      engines.reduce((a, e) => a + e.batchSum, 0) /
      Math.max(
        1,
        engines.reduce((a, e) => a + e.steps, 0),
      ),
    meanQueue:
      engines.reduce((a, e) => a + e.queueSum, 0) /
      Math.max(
        1,
        engines.reduce((a, e) => a + e.steps, 0),
      ),
  };
}

function sum(m: Map<unknown, number>): number {
  let s = 0;
  for (const v of m.values()) s += v;
  return s;
}

const trajs = makeTrajectories(SEED);
const respLen = (t: Traj) => t.turns.reduce((a, x) => a + x.gen + x.toolTokens, 0);
const lens = trajs.map(respLen).sort((a, b) => a - b);
// kv-expected learns lengths from the previous RL step (a different batch: seed + 1), never this one
const expected = conditionalMean(makeTrajectories(SEED + 1).map(respLen));
// lower bounds: the longest trajectory alone (batch of 1, its tools in series), and all decode
// tokens at the compute-bound throughput spread over every engine
const critical = Math.max(
  ...trajs.map((t) => {
    let ctx = t.prompt;
    let ms = (t.prompt / PREFILL_TOK_PER_S) * 1000;
    for (const [k, x] of t.turns.entries()) {
      ms += x.gen * (STEP_BASE_MS + KV_MS_PER_TOKEN * (ctx + x.gen / 2));
      ctx += x.gen;
      if (k < t.turns.length - 1) ms += x.toolMs + (x.toolTokens / PREFILL_TOK_PER_S) * 1000;
      ctx += x.toolTokens;
    }
    return ms / 1000;
  }),
);
const work = (lens.reduce((a, b) => a + b, 0) * DECODE_MS_PER_SEQ) / 1000 / N_ENG;
const tools = trajs.flatMap((t) => t.turns.slice(0, -1).map((x) => x.toolMs)).sort((a, b) => a - b);
console.log(
  `scheduler-sim: ${N_ENG} engines, ${N_TRAJ} trajectories (seed ${SEED}); response tokens (incl. tool, lognormal ` +
    `median ${LEN_MEDIAN} sigma ${LEN_SIGMA}, assumed; groups of ${GROUP} samples per prompt, prompt share of ` +
    `log-length variance ${PROMPT_SHARE}, assumed; static split '${SPLIT}') ` +
    `p50 ${lens[lens.length >> 1]} p90 ${lens[Math.floor(lens.length * 0.9)]} max ${lens.at(-1)} ` +
    `(${lens.filter((l) => l >= BUDGET - 150).length} at the ${BUDGET} budget); tool latency mean ` +
    `${(tools.reduce((a, b) => a + b, 0) / tools.length).toFixed(0)} ms p99 ${tools[Math.floor(tools.length * 0.99)].toFixed(0)} ms`,
);
console.log(
  `assumptions: Qwen3-14B bf16 on one H100-class GPU per engine; decode step = max(${STEP_BASE_MS} ms + ` +
    `${KV_MS_PER_TOKEN * 1e6} ns × running-batch KV tokens, batch × ${DECODE_MS_PER_SEQ} ms) + prefill at ` +
    `${PREFILL_TOK_PER_S} tok/s; engine = SGLang-like (new_token_ratio admission, radix-cache LRU eviction of ` +
    'tool-waiting prefixes, retraction of running requests on decode overflow, recompute on re-admission)',
);
console.log(
  `lower bounds: longest trajectory alone ${critical.toFixed(1)} s; compute-bound work ${work.toFixed(1)} s per engine`,
);
const POLS: Policy[] = [
  'static',
  'static-sync',
  'least-requests',
  'kv-budget',
  'kv-incremental',
  'kv-expected',
];
for (const cap of CAPACITIES) {
  const rows = POLS.map((p) => simulate(p, trajs, cap, expected));
  const base = rows[0].makespan;
  console.log(`\nKV capacity ${cap} tokens per engine`);
  console.log(
    'policy          makespan_s  speedup  idle_frac  mean_batch  eng_queue  overs_events  (retract/evict/preempt)  recomputed_tok  peak_kv_used',
  );
  for (const r of rows) {
    const overs = r.retractions + r.evictions + r.preemptions;
    console.log(
      `${r.policy.padEnd(15)} ${r.makespan.toFixed(1).padStart(10)}  ${(base / r.makespan).toFixed(2).padStart(6)}x  ` +
        `${r.idle.toFixed(3).padStart(9)}  ${r.meanBatch.toFixed(1).padStart(10)}  ${r.meanQueue.toFixed(1).padStart(9)}  ${String(overs).padStart(12)}  ` +
        `${`(${r.retractions}/${r.evictions}/${r.preemptions})`.padStart(23)}  ${String(r.recomputed).padStart(14)}  ` +
        `${r.peakUsedFrac.toFixed(2).padStart(12)}`,
    );
  }
  const verdict = rows
    .filter((r) => r.policy === 'kv-budget' || r.policy === 'kv-expected')
    .map((r) => {
      const clean = r.retractions + r.evictions + r.preemptions === 0;
      const met = base / r.makespan >= 1.3 && clean;
      return `${r.policy} ${(base / r.makespan).toFixed(2)}x${clean ? '' : ' OVER-SUBSCRIBED'} ${met ? 'MET' : 'not met'}`;
    });
  console.log(`target (≥ 1.30x static, zero over-subscription): ${verdict.join('; ')}`);
}
