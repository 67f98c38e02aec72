import { LengthModel, Overcommit } from './predict.js';
import type { Engine, GenerateResult, SamplingParams } from './types.js';

// Routes trajectories to engines; a trajectory stays on its engine for every turn (its prefix stays in
// that engine's cache) unless the engine stops answering. 'round-robin' is verl's static split: every
// trajectory placed at once, each engine's own queue admitting. 'kv-predict' charges each trajectory its
// predicted final length (predict.ts) and admits predicted-longest first from one global queue while the
// charges fit the engine's KV plus an over-commit that shrinks when prefixes get evicted; until a rollout
// has finished it has no lengths and places like round-robin. 'kv-budget' is rStar2's removed design
// (worst-case prompt + budget reserved, never over-subscribed). 'auto', the default, is kv-predict where
// it beats the static split in bench/scheduler-sim.ts (large KV pools) and round-robin elsewhere.

export type RoutingPolicy = 'auto' | 'round-robin' | 'least-requests' | 'kv-budget' | 'kv-predict';
export const ROUTING_POLICIES: RoutingPolicy[] = [
  'auto',
  'round-robin',
  'least-requests',
  'kv-budget',
  'kv-predict',
];
/** 'auto' picks kv-predict when every engine holds at least this many KV tokens: in the simulation it beats
 *  the static split in every seed of the 790K (MI300X) and 1.2M (TP4) regimes and loses in the 128K one. */
export const AUTO_PREDICT_MIN_KV = 500_000;

/** Synchronous bookkeeping shared by the live Scheduler and the simulation benchmark. */
export class KvLedger {
  readonly reserved: number[];
  readonly active: number[];
  readonly observed: number[]; // live usage reported by the engine (0 = unknown)
  readonly foreign: boolean[]; // the engine reports requests running or queued
  readonly peakReserved: number[];
  private rr = 0;

  constructor(
    readonly capacity: number[],
    readonly budgetCoef = 1,
  ) {
    if (capacity.length === 0) throw new Error('scheduler needs at least one engine');
    for (const c of capacity) {
      if (!(c > 0)) throw new Error(`engine KV capacity must be a positive token count, got ${c}`);
    }
    this.reserved = capacity.map(() => 0);
    this.active = capacity.map(() => 0);
    this.observed = capacity.map(() => 0);
    this.foreign = capacity.map(() => false);
    this.peakReserved = capacity.map(() => 0);
  }

  /** Credit left on engine i. Live usage only ever lowers it (foreign load, a full cache), and is ignored
   *  on an engine that runs nothing, so stale cached prefixes can't stall admission. */
  free(i: number): number {
    const busy = this.active[i] > 0 || this.foreign[i];
    const used = busy ? Math.max(this.reserved[i], this.observed[i]) : this.reserved[i];
    return this.capacity[i] / this.budgetCoef - used;
  }

  /** The engine to place a new trajectory on, or null if kv-budget admission must wait. */
  choose(policy: RoutingPolicy, budget: number, blocked?: (i: number) => boolean): number | null {
    const n = this.capacity.length;
    if (policy === 'round-robin') {
      for (let k = 0; k < n; k++) {
        const i = this.rr++ % n;
        if (!blocked?.(i)) return i;
      }
      return null;
    }
    let best = -1;
    for (let i = 0; i < n; i++) {
      if (blocked?.(i)) continue;
      const better =
        policy === 'least-requests' ? this.active[i] < this.active[best] : this.free(i) > this.free(best);
      if (best < 0 || better) best = i;
    }
    if (best < 0) return null;
    return policy !== 'kv-budget' || this.free(best) >= budget ? best : null;
  }

  maxBudget(): number {
    return Math.max(...this.capacity) / this.budgetCoef;
  }

  take(i: number, budget: number): void {
    this.reserved[i] += budget;
    this.active[i]++;
    this.peakReserved[i] = Math.max(this.peakReserved[i], this.reserved[i]);
  }

  give(i: number, budget: number): void {
    this.reserved[i] -= budget;
    this.active[i]--;
  }
}

export interface SchedulerOptions {
  policy?: RoutingPolicy; // default 'auto'
  budgetCoef?: number; // >1 reserves more conservatively (reference `server_budget_coef`); default 1
  pollMs?: number; // live load polling interval; 0 = off; default 1000
  /** Where an engine that stops answering, and one that answers again, is reported (default stderr). */
  log?: (line: string) => void;
}

export interface Lease {
  /** The engine this trajectory runs on now (it changes only when an engine stops answering). */
  readonly engine: Engine;
  readonly index: number;
  generate(inputIds: number[], sampling: SamplingParams, signal?: AbortSignal): Promise<GenerateResult>;
  release(): void; // idempotent
}

/** What one rollout (one streamRollouts call) cost, for a training step's metrics. */
export interface RolloutStats {
  makespan_s: number;
  tail_s: number; // from the 90th-percentile trajectory's finish to the last one's
  reprefilled_tokens: number; // context computed before and computed again (engines that report cached tokens)
  prefix_misses: number; // returning turns whose cached prefix was gone
  retractions: number; // where the engine reports them
  moved: number; // trajectories moved off an engine that stopped answering
  idle_frac: number; // mean share of the makespan an engine had no generation of ours in flight
  /** between-prompt share of the log-length variance (LengthModel.promptShare); null without groups */
  prompt_share: number | null;
}

interface Placed {
  index: number;
  budget: number; // prompt + response budget
  held: number; // ledger tokens reserved (kv-budget)
  prompt: number;
  ctx: number; // context tokens after the last generation
  computed: number; // context tokens the engine has held (0 before the first call)
  group?: string;
}

interface Waiter {
  budget: number;
  placed: Placed;
  resolve: (i: number) => void;
  reject: (e: Error) => void;
}

export class Scheduler {
  readonly ledger: KvLedger;
  readonly policy: Exclude<RoutingPolicy, 'auto'>;
  readonly down: boolean[];
  readonly lengths: LengthModel;
  readonly overcommit = new Overcommit();
  private readonly members: Set<Placed>[];
  private readonly groupsOn: Map<string, number>[]; // per engine: placed samples of each prompt, for cost()
  private readonly waiters: Waiter[] = [];
  private readonly inFlight: number[];
  private readonly busySince: number[];
  private readonly busyMs: number[];
  private counters = {
    start: 0,
    finishes: [] as number[],
    reprefilled: 0,
    misses: 0,
    retractions: 0,
    moved: 0,
  };
  private timer?: NodeJS.Timeout;
  private closed = false;
  private readonly log: (line: string) => void;

  private constructor(
    readonly engines: Engine[],
    capacities: number[],
    private readonly blocks: number[], // each engine's KV block: it caches whole blocks only
    opts: SchedulerOptions,
  ) {
    const policy = opts.policy ?? 'auto';
    if (!ROUTING_POLICIES.includes(policy))
      throw new Error(`unknown scheduler policy '${policy}' (${ROUTING_POLICIES.join(', ')})`);
    this.policy =
      policy !== 'auto'
        ? policy
        : Math.min(...capacities) >= AUTO_PREDICT_MIN_KV
          ? 'kv-predict'
          : 'round-robin';
    this.ledger = new KvLedger(capacities, opts.budgetCoef ?? 1);
    this.lengths = new LengthModel(Number.POSITIVE_INFINITY); // charge() clamps to each trajectory's budget
    this.down = engines.map(() => false);
    this.log = opts.log ?? ((l) => console.error(l));
    this.members = engines.map(() => new Set());
    this.groupsOn = engines.map(() => new Map());
    this.inFlight = engines.map(() => 0);
    this.busySince = engines.map(() => 0);
    this.busyMs = engines.map(() => 0);
    const pollMs = opts.pollMs ?? 1000;
    if (pollMs > 0) {
      this.timer = setInterval(() => void this.poll(), pollMs);
      this.timer.unref();
    }
  }

  /** Reads each engine's capacity once (server info / metrics / configured). */
  static async create(engines: Engine[], opts: SchedulerOptions = {}): Promise<Scheduler> {
    const loads = await Promise.all(
      engines.map((e) =>
        e.load().catch((err: Error) => {
          throw new Error(`cannot read KV capacity of ${e.name}: ${err.message}`);
        }),
      ),
    );
    return new Scheduler(
      engines,
      loads.map((l) => l.capacityTokens),
      loads.map((l) => Math.max(1, l.blockTokens ?? 1)),
      opts,
    );
  }

  /** One load read per engine: live usage, foreign load, and whether it answers at all. */
  async poll(): Promise<void> {
    await Promise.all(this.engines.map((_, i) => this.check(i)));
    this.pump();
  }

  private async check(i: number): Promise<boolean> {
    const was = this.down[i];
    try {
      const l = await this.engines[i].load();
      this.ledger.observed[i] = l.usedTokens ?? 0;
      this.ledger.foreign[i] = (l.running ?? 0) + (l.queued ?? 0) > this.inFlight[i];
      this.down[i] = false;
      if (was) this.log(`${this.engines[i].name} answers again: it takes trajectories again`);
    } catch (e) {
      this.down[i] = true;
      if (!was)
        this.log(
          `warning: ${this.engines[i].name} stopped answering (${(e as Error).message}); its trajectories ` +
            'move to the other engines',
        );
    }
    return !this.down[i];
  }

  /** Places a trajectory that needs at most `budget` KV tokens, `promptTokens` of them known now;
   *  `group` names its prompt (GRPO siblings share a length). Waits while the policy says none fits. */
  acquire(budget: number, signal?: AbortSignal, promptTokens = budget, group?: string): Promise<Lease> {
    if (this.closed) return Promise.reject(new Error('scheduler is closed'));
    if (this.policy === 'kv-budget' && budget > this.ledger.maxBudget()) {
      return Promise.reject(
        new Error(
          `trajectory budget ${budget} tokens exceeds the largest engine KV capacity ${this.ledger.maxBudget()}; ` +
            'lower the response budget or budgetCoef',
        ),
      );
    }
    if (this.ledger.active.every((a) => a === 0) && this.waiters.length === 0) {
      this.counters = {
        start: Date.now(),
        finishes: [],
        reprefilled: 0,
        misses: 0,
        retractions: 0,
        moved: 0,
      };
      this.busyMs.fill(0);
    }
    const placed: Placed = {
      index: -1,
      budget,
      held: 0,
      prompt: promptTokens,
      ctx: promptTokens,
      computed: 0,
      group,
    };
    return new Promise<number>((resolve, reject) => {
      const onAbort = () => {
        const k = this.waiters.indexOf(w);
        if (k >= 0) {
          this.waiters.splice(k, 1);
          reject(new Error('aborted while waiting for KV capacity'));
        }
      };
      const w: Waiter = { budget, placed, resolve: untilServed(signal, onAbort, resolve), reject };
      this.waiters.push(w);
      this.pump();
    }).then(() => this.lease(placed, budget));
  }

  private get predicting(): boolean {
    return this.policy === 'kv-predict' && this.lengths.trained;
  }

  private charge(p: Placed): number {
    return Math.min(p.budget, Math.max(p.ctx, p.prompt + this.lengths.predict(p.group, p.ctx - p.prompt)));
  }

  /** The prompt tokens a sibling already on engine k holds for p: whole blocks, which the engine's prefix cache
   *  shares between samples of one prompt. */
  private shared(p: Placed, k: number): number {
    return p.prompt - (p.prompt % this.blocks[k]);
  }

  /** What placing p on engine k adds to the KV it holds: p's charge, less a prompt its siblings there share. */
  private cost(p: Placed, k: number): number {
    const siblings = p.group === undefined ? 0 : (this.groupsOn[k].get(p.group) ?? 0);
    return this.charge(p) - (siblings > 0 ? this.shared(p, k) : 0);
  }

  private pump(): void {
    const blocked = (k: number) => this.down[k];
    // kv-predict: each placed trajectory is charged its predicted final length; how far a prompt's placed
    // samples have got is evidence for its samples still waiting
    const progress = new Map<string | undefined, number[]>();
    if (this.predicting) {
      for (let k = 0; k < this.engines.length; k++) {
        let c = 0;
        const groups = new Set<string>();
        for (const p of this.members[k]) {
          c += this.charge(p) - (p.group !== undefined && groups.has(p.group) ? this.shared(p, k) : 0);
          if (p.group !== undefined) groups.add(p.group);
          const g = progress.get(p.group);
          if (g) g.push(p.ctx - p.prompt);
          else progress.set(p.group, [p.ctx - p.prompt]);
        }
        this.ledger.reserved[k] = c;
      }
    }
    // predicted-longest first; among equals the prompt with fewest placed, so every prompt is probed early.
    // Waiting samples of one prompt rank alike, so a rank is computed once per prompt and pump.
    const ranks = new Map<string | undefined, number>();
    const rank = (x: Waiter) => {
      const g = x.placed.group;
      let r = ranks.get(g);
      if (r === undefined) {
        const seen = progress.get(g) ?? [];
        r = this.lengths.predict(g, 0, seen) - seen.length * 1e-6;
        ranks.set(g, r);
      }
      return r;
    };
    while (this.waiters.length > 0) {
      let w = this.waiters[0];
      let i: number | null;
      if (this.predicting) {
        let best = rank(w);
        for (const x of this.waiters) {
          const r = rank(x);
          if (r > best) [w, best] = [x, r];
        }
        // the engine with the most room after its charge (less the prompt its siblings there already hold),
        // where it waits until that fits the engine's KV plus the over-commit
        i = null;
        let room = Number.NEGATIVE_INFINITY;
        for (let k = 0; k < this.engines.length; k++) {
          if (blocked(k)) continue;
          const r = this.ledger.free(k) - this.cost(w.placed, k);
          if (r > room) [i, room] = [k, r];
        }
        if (
          i !== null &&
          room + this.ledger.capacity[i] * this.overcommit.value < 0 &&
          this.ledger.active[i] > 0
        )
          i = null;
      } else {
        const policy = this.policy === 'kv-predict' ? 'round-robin' : this.policy;
        i = this.ledger.choose(policy, w.budget, blocked);
      }
      if (i === null) return; // the head waits for a release, nobody overtakes it
      this.waiters.splice(this.waiters.indexOf(w), 1);
      this.place(
        w.placed,
        i,
        this.policy === 'kv-budget' ? w.budget : this.predicting ? this.cost(w.placed, i) : 0,
      );
      const g = progress.get(w.placed.group);
      if (g) g.push(0);
      else progress.set(w.placed.group, [0]);
      ranks.delete(w.placed.group);
      w.resolve(i);
    }
  }

  private place(p: Placed, i: number, held: number): void {
    p.index = i;
    p.held = held;
    this.ledger.take(i, held);
    this.members[i].add(p);
    if (p.group !== undefined) this.groupsOn[i].set(p.group, (this.groupsOn[i].get(p.group) ?? 0) + 1);
  }

  private unplace(p: Placed): void {
    this.ledger.give(p.index, p.held);
    this.members[p.index].delete(p);
    if (p.group !== undefined) {
      const on = this.groupsOn[p.index];
      const left = (on.get(p.group) ?? 1) - 1;
      if (left > 0) on.set(p.group, left);
      else on.delete(p.group);
    }
  }

  /** Moves a trajectory off an engine that stopped answering; false when no engine is left. */
  private move(p: Placed): boolean {
    const from = p.index;
    const to = this.ledger.choose('least-requests', 0, (k) => k === from || this.down[k]);
    if (to === null) return false;
    this.unplace(p);
    this.place(p, to, p.held);
    p.computed = 0; // its KV stayed behind
    this.counters.moved++;
    return true;
  }

  private busy(i: number, delta: 1 | -1): void {
    if (delta === 1 && this.inFlight[i]++ === 0) this.busySince[i] = Date.now();
    if (delta === -1 && --this.inFlight[i] === 0) this.busyMs[i] += Date.now() - this.busySince[i];
  }

  private lease(p: Placed, budget: number): Lease {
    let released = false;
    const self = this;
    return {
      get engine() {
        return self.engines[p.index];
      },
      get index() {
        return p.index;
      },
      generate: async (ids, s, signal) => {
        for (;;) {
          const i = p.index;
          this.busy(i, 1);
          let r: GenerateResult;
          try {
            r = await this.engines[i].generate(ids, s, signal);
          } finally {
            this.busy(i, -1);
          }
          // an engine that fails a call and then its load check is down: the trajectory moves on
          if (r.finishReason === 'error' && !signal?.aborted && !(await this.check(i)) && this.move(p))
            continue;
          this.account(p, ids.length, r);
          return r;
        }
      },
      release: () => {
        if (released) return;
        released = true;
        this.unplace(p);
        if (p.computed > 0) {
          this.lengths.record(p.group, Math.min(budget, p.ctx - p.prompt));
          this.overcommit.clean();
        }
        this.counters.finishes.push(Date.now());
        this.pump();
      },
    };
  }

  private account(p: Placed, input: number, r: GenerateResult): void {
    if (r.cachedTokens !== undefined && p.computed > 0) {
      // The last sampled token was never fed back, so its KV was never computed, and an engine caches whole
      // blocks only: a prefix kept whole still reports up to a block less than that.
      const lost = Math.min(input, p.computed - 1) - r.cachedTokens;
      if (lost >= this.blocks[p.index]) {
        this.counters.reprefilled += lost;
        this.counters.misses++;
        if (this.predicting) this.overcommit.pressure();
      }
    }
    if (r.retractions) {
      this.counters.retractions += r.retractions;
      // only what its own placement caused: a rollout placed round-robin (no lengths yet) retracts on a small
      // pool, which drove the over-commit to its floor before kv-predict placed anything
      if (this.predicting) this.overcommit.pressure(r.retractions);
    }
    p.ctx = input + r.outputIds.length;
    p.computed = Math.max(p.computed, p.ctx);
    if (this.predicting) this.pump(); // predictions move as lengths grow and siblings finish
  }

  /** Ends a rollout: its stats, and its finished lengths become the next rollout's prior. */
  endRollout(): RolloutStats {
    const now = Date.now();
    const s = this.counters;
    const span = Math.max(1, now - s.start);
    const f = [...s.finishes].sort((a, b) => a - b);
    const last = f.at(-1) ?? now;
    const p90 = f[Math.max(0, Math.ceil(f.length * 0.9) - 1)] ?? last;
    const busy = this.busyMs.map((b, i) => b + (this.inFlight[i] > 0 ? now - this.busySince[i] : 0));
    const share = this.lengths.promptShare();
    this.lengths.nextStep();
    return {
      makespan_s: round((last - s.start) / 1000),
      tail_s: round((last - p90) / 1000),
      reprefilled_tokens: s.reprefilled,
      prefix_misses: s.misses,
      retractions: s.retractions,
      moved: s.moved,
      idle_frac: round(busy.reduce((a, b) => a + Math.max(0, 1 - b / span), 0) / busy.length),
      prompt_share: share === undefined ? null : round(share),
    };
  }

  stats(): { engine: string; capacity: number; reserved: number; peakReserved: number; active: number }[] {
    return this.engines.map((e, i) => ({
      engine: e.name,
      capacity: this.ledger.capacity[i],
      reserved: this.ledger.reserved[i],
      peakReserved: this.ledger.peakReserved[i],
      active: this.ledger.active[i],
    }));
  }

  waiting(): number {
    return this.waiters.length;
  }

  async close(): Promise<void> {
    this.closed = true;
    if (this.timer) clearInterval(this.timer);
    for (const w of this.waiters.splice(0))
      w.reject(new Error('scheduler closed while waiting for KV capacity'));
  }
}

const round = (x: number) => Math.round(x * 1000) / 1000;

/** Listens for the caller's abort until the returned resolver runs. One caller signal usually spans a whole
 *  rollout, so a served waiter must not leave its listener on it. */
function untilServed<T>(signal: AbortSignal | undefined, onAbort: () => void, resolve: (v: T) => void) {
  signal?.addEventListener('abort', onAbort, { once: true });
  return (v: T) => {
    signal?.removeEventListener('abort', onAbort);
    resolve(v);
  };
}
