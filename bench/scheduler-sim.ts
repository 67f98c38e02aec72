// Rollout scheduling simulation: 4 engines × 512 trajectories, comparing a static equal split,
// least-requests routing and rStar2's KV-budget admission. Virtual time, deterministic (seeded).
//
// Model (figures from docs/reference notes; see the constants): each engine has a KV capacity in
// tokens and a decode step whose time grows with the KV it reads; prefill (new prompts, tool turns,
// recomputation after eviction) costs time at a fixed rate. Trajectories have a long-tailed total
// length capped by the 8K response budget, 1-5 assistant turns, and tool calls with the
// sandbox's ~0.3 s mean latency (long tail up to the 4 s timeout). Engines behave like SGLang:
// admit while KV fits, evict cached prefixes of tool-waiting trajectories, then retract running
// requests when decode growth overflows — both force recomputation and count as over-subscription.
//
// Policies: 'static' = equal split up front, each trajectory runs its turns asynchronously;
// 'static-sync' = equal split with lock-step turns per engine (each turn's tools run as one batch);
// 'least-requests' = fewest active trajectories, at most LR_CAP_PER_ENGINE each; 'kv-budget' =
// rStar2's worst-case reservation (prompt + response budget) via the real KvLedger; 'kv-incremental'
// = reservation grown in CHUNK steps (sim-only experiment, preempts when growth deadlocks).
//
// Run: flock /tmp/bench.lock npx tsx bench/scheduler-sim.ts [--seed N] [--trajectories 512] [--engines 4]
import { KvLedger } from '../src/engines/scheduler.js';
import { Rng } from '../src/util/rng.js';

const arg = (name: string, def: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? Number(process.argv[i + 1]) : def;
};
const SEED = arg('seed', 1);
const N_TRAJ = arg('trajectories', 512);
const N_ENG = arg('engines', 4);
const CAPACITY = arg('capacity', 131_072); // KV tokens per engine (≈ a 14B model's cache on one 80 GB GPU)
const BUDGET = 8192; // max response tokens (stage-1 recipe)
const MAX_TURNS = 5;
const STEP_BASE_MS = 10; // weight read per decode step
const STEP_KV_MS = 8; // extra per step when the whole KV capacity is read
const PREFILL_TOK_PER_S = 16_000;
const LR_CAP_PER_ENGINE = 32; // least-requests: concurrent trajectories per engine the controller allows
const RATIO_INIT = 0.7; // SGLang init_new_token_ratio
const RATIO_MIN = 0.1;
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
  return Array.from({ length: N_TRAJ }, (_, id) => {
    const prompt = rng.int(300, 700);
    const r = rng.next();
    const nTurns = r < 0.2 ? 1 : r < 0.5 ? 2 : r < 0.75 ? 3 : r < 0.9 ? 4 : 5;
    const toolTokens = Array.from({ length: nTurns - 1 }, () => rng.int(40, 120));
    const toolSum = toolTokens.reduce((a, b) => a + b, 0);
    const total = Math.max(nTurns * 20, Math.min(BUDGET - toolSum, Math.round(lognormal(rng, 2000, 0.75))));
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

type Policy = 'static-sync' | 'static' | 'least-requests' | 'kv-budget' | 'kv-incremental';

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
}

function simulate(policy: Policy, trajs: Traj[]) {
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
  }));
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
      if (policy === 'static' || policy === 'static-sync') i = t.id % N_ENG;
      else if (policy === 'least-requests') {
        const inflight = ledger.active.reduce((a, b) => a + b, 0);
        i = inflight < LR_CAP_PER_ENGINE * N_ENG ? ledger.choose('least-requests', budget) : null;
      } else if (policy === 'kv-budget') i = ledger.choose('kv-budget', budget);
      else {
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
      } else ledger.take(i, budget);
      queueHead++;
      t.engine = i;
      submit(t);
    }
  };

  const finish = (t: Traj) => {
    ledger.give(t.engine, policy === 'kv-incremental' ? (res.get(t) as number) : t.prompt + BUDGET);
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
      const future = e.running.reduce((a, r) => a + e.ratio * (BUDGET - (r.ctx - r.prompt)), 0);
      // evictable cached prefixes count as available, as in SGLang's PrefillAdder
      const estimate = CAPACITY - sum(e.resident) - future + have;
      if (estimate < need + e.ratio * (BUDGET - (t.ctx - t.prompt)) && e.running.length > 0) break;
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
    const ms = STEP_BASE_MS + (STEP_KV_MS * u) / CAPACITY + (prefill / PREFILL_TOK_PER_S) * 1000;
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
  };
}

function sum(m: Map<unknown, number>): number {
  let s = 0;
  for (const v of m.values()) s += v;
  return s;
}

const trajs = makeTrajectories(SEED);
const lens = trajs.map((t) => t.turns.reduce((a, x) => a + x.gen + x.toolTokens, 0)).sort((a, b) => a - b);
console.log(
  `scheduler-sim: ${N_ENG} engines × ${CAPACITY} KV tokens, ${N_TRAJ} trajectories (seed ${SEED}); ` +
    `response tokens p50 ${lens[lens.length >> 1]} p90 ${lens[Math.floor(lens.length * 0.9)]} max ${lens.at(-1)}`,
);
const rows = (['static', 'static-sync', 'least-requests', 'kv-budget', 'kv-incremental'] as Policy[]).map(
  (p) => simulate(p, trajs),
);
const base = rows[0].makespan;
console.log(
  'policy          makespan_s  speedup  idle_frac  retractions  evictions  recomputed_tok  peak_kv_used  peak_reserved  preemptions',
);
for (const r of rows) {
  console.log(
    `${r.policy.padEnd(15)} ${r.makespan.toFixed(1).padStart(10)}  ${(base / r.makespan).toFixed(2).padStart(6)}x  ` +
      `${r.idle.toFixed(3).padStart(9)}  ${String(r.retractions).padStart(11)}  ${String(r.evictions).padStart(9)}  ` +
      `${String(r.recomputed).padStart(14)}  ${r.peakUsedFrac.toFixed(2).padStart(12)}  ${r.peakReservedFrac.toFixed(2).padStart(13)}  ${String(r.preemptions).padStart(11)}`,
  );
}
const kv = rows.find((r) => r.policy === 'kv-budget');
const sync = rows.find((r) => r.policy === 'static-sync');
if (kv && sync) {
  const over = kv.evictions + kv.retractions > 0 || kv.peakReservedFrac > 1;
  console.log(
    `kv-budget: ${over ? 'OVER-SUBSCRIBED' : 'zero KV over-subscription'}; speedup vs static (async) ` +
      `${(base / kv.makespan).toFixed(2)}x, vs static lock-step ${(sync.makespan / kv.makespan).toFixed(2)}x (target ≥ 1.30x)`,
  );
}
