import type { Engine, GenerateResult, SamplingParams } from './types.js';

// Routes trajectories to engines. 'kv-budget' is rStar2's removed design: a trajectory reserves its
// worst-case KV footprint (prompt + response budget) on the engine with the most free capacity,
// stays there for every turn (prefix-cache reuse) and gives the reservation back when it ends, so
// an engine's KV cache is never over-subscribed. 'least-requests' and 'round-robin' are the
// comparison policies (no admission wait; the engine queues internally).

export type Policy = 'kv-budget' | 'least-requests' | 'round-robin';
export const POLICIES: Policy[] = ['kv-budget', 'least-requests', 'round-robin'];

/** Synchronous bookkeeping shared by the live Scheduler and the simulation benchmark. */
export class KvLedger {
  readonly reserved: number[];
  readonly active: number[];
  readonly observed: number[]; // live usage reported by the engine (0 = unknown)
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
    this.peakReserved = capacity.map(() => 0);
  }

  /** Credit left on engine i. Live usage only ever lowers it (foreign load, pinned cache), and is
   *  ignored on an engine we have nothing on, so stale cached prefixes can't stall admission. */
  free(i: number): number {
    const used = this.active[i] > 0 ? Math.max(this.reserved[i], this.observed[i]) : this.reserved[i];
    return this.capacity[i] / this.budgetCoef - used;
  }

  /** The engine to place a new trajectory on, or null if kv-budget admission must wait. */
  choose(policy: Policy, budget: number, blocked?: (i: number) => boolean): number | null {
    const n = this.capacity.length;
    if (policy === 'round-robin') return this.rr++ % n;
    if (policy === 'least-requests') {
      let best = 0;
      for (let i = 1; i < n; i++) if (this.active[i] < this.active[best]) best = i;
      return best;
    }
    let best = -1;
    for (let i = 0; i < n; i++) {
      if (blocked?.(i)) continue;
      if (best < 0 || this.free(i) > this.free(best)) best = i;
    }
    return best >= 0 && this.free(best) >= budget ? best : null;
  }

  maxBudget(): number {
    return Math.max(...this.capacity) / this.budgetCoef;
  }

  take(i: number, budget: number): void {
    this.reserved[i] += budget;
    this.active[i]++;
    this.peakReserved[i] = Math.max(this.peakReserved[i], this.reserved[i]);
  }

  /** Adds to a placed trajectory's reservation (incremental reservation). */
  grow(i: number, tokens: number): void {
    this.reserved[i] += tokens;
    this.peakReserved[i] = Math.max(this.peakReserved[i], this.reserved[i]);
  }

  shrink(i: number, tokens: number): void {
    this.reserved[i] -= tokens;
  }

  give(i: number, budget: number): void {
    this.reserved[i] -= budget;
    this.active[i]--;
  }
}

/**
 * 'worst-case': reserve prompt + response budget up front (rStar2's design; never waits mid-run).
 * 'incremental': reserve prompt + one chunk, generate in chunks, grow by a chunk as needed; growth
 *   of running trajectories goes before new admissions, and when every trajectory on an engine waits
 *   to grow, the newest gives its reservation back until the others finish (counted in `preemptions`).
 */
export type Reservation = 'worst-case' | 'incremental';

export interface SchedulerOptions {
  policy?: Policy; // default 'kv-budget'
  reservation?: Reservation; // kv-budget only; default 'worst-case'
  chunkTokens?: number; // incremental: max new tokens per engine call and growth step; default 1024
  budgetCoef?: number; // >1 reserves more conservatively (reference `server_budget_coef`); default 1
  pollMs?: number; // live load polling interval; 0 = off; default 1000
}

export interface Lease {
  readonly engine: Engine;
  readonly index: number;
  /** Incremental reservation: cap on maxNewTokens per call; undefined = no cap. */
  readonly chunk?: number;
  generate(inputIds: number[], sampling: SamplingParams, signal?: AbortSignal): Promise<GenerateResult>;
  /** Waits until the reservation covers `total` tokens of context (no-op for worst-case). */
  ensure(total: number, signal?: AbortSignal): Promise<void>;
  release(): void; // idempotent
}

interface Grower {
  state: { held: number };
  grow: number;
  resolve: () => void;
  reject: (e: Error) => void;
}

interface Waiter {
  budget: number;
  initial: number;
  resolve: (i: number) => void;
  reject: (e: Error) => void;
}

export class Scheduler {
  readonly ledger: KvLedger;
  readonly policy: Policy;
  readonly reservation: Reservation;
  readonly chunkTokens: number;
  preemptions = 0;
  private readonly waiters: Waiter[] = [];
  private readonly growers: Grower[][];
  private timer?: NodeJS.Timeout;
  private closed = false;

  private constructor(
    readonly engines: Engine[],
    capacities: number[],
    opts: SchedulerOptions,
  ) {
    this.policy = opts.policy ?? 'kv-budget';
    if (!POLICIES.includes(this.policy))
      throw new Error(`unknown scheduler policy '${this.policy}' (${POLICIES.join(', ')})`);
    this.ledger = new KvLedger(capacities, opts.budgetCoef ?? 1);
    this.reservation = opts.reservation ?? 'worst-case';
    if (this.reservation !== 'worst-case' && this.reservation !== 'incremental') {
      throw new Error(`unknown reservation '${this.reservation}' (worst-case, incremental)`);
    }
    this.chunkTokens = opts.chunkTokens ?? 1024;
    if (!(this.chunkTokens >= 1)) throw new Error(`chunkTokens must be ≥ 1, got ${this.chunkTokens}`);
    this.growers = engines.map(() => []);
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
      opts,
    );
  }

  async poll(): Promise<void> {
    await Promise.all(
      this.engines.map(async (e, i) => {
        try {
          const l = await e.load();
          this.ledger.observed[i] = l.usedTokens ?? 0;
        } catch {
          // a failed poll keeps the last reading; generation errors surface per request
        }
      }),
    );
    this.pump();
  }

  private get incremental(): boolean {
    return this.policy === 'kv-budget' && this.reservation === 'incremental';
  }

  /** Places a trajectory that needs at most `budget` KV tokens (`promptTokens` of them known now);
   *  waits (FIFO) while none fits. */
  acquire(budget: number, signal?: AbortSignal, promptTokens = budget): Promise<Lease> {
    if (this.closed) return Promise.reject(new Error('scheduler is closed'));
    if (this.policy === 'kv-budget' && budget > this.ledger.maxBudget()) {
      return Promise.reject(
        new Error(
          `trajectory budget ${budget} tokens exceeds the largest engine KV capacity ${this.ledger.maxBudget()}; ` +
            'lower the response budget or budgetCoef',
        ),
      );
    }
    return new Promise<number>((resolve, reject) => {
      const initial = this.incremental ? Math.min(budget, promptTokens + this.chunkTokens) : budget;
      const onAbort = () => {
        const k = this.waiters.indexOf(w);
        if (k >= 0) {
          this.waiters.splice(k, 1);
          reject(new Error('aborted while waiting for KV capacity'));
        }
      };
      const w: Waiter = { budget, initial, resolve: untilServed(signal, onAbort, resolve), reject };
      this.waiters.push(w);
      this.pump();
    }).then((i) =>
      this.lease(i, budget, this.incremental ? Math.min(budget, promptTokens + this.chunkTokens) : budget),
    );
  }

  private pump(): void {
    if (this.incremental) this.serveGrowth();
    while (this.waiters.length > 0) {
      const w = this.waiters[0];
      const i = this.incremental
        ? // admit only where growth is not pending, the whole budget could fit alone, and a chunk of headroom stays
          this.ledger.choose(
            this.policy,
            // (a budget within a chunk of the largest capacity is admitted onto an empty engine)
            Math.min(w.initial + this.chunkTokens, this.ledger.maxBudget()),
            (k) => this.growers[k].length > 0 || this.ledger.capacity[k] / this.ledger.budgetCoef < w.budget,
          )
        : this.ledger.choose(this.policy, w.budget);
      if (i === null) return; // FIFO: the head waits for a release, nobody overtakes it
      this.waiters.shift();
      this.ledger.take(i, w.initial);
      w.resolve(i);
    }
  }

  private serveGrowth(): void {
    for (let i = 0; i < this.growers.length; i++) {
      const q = this.growers[i];
      for (;;) {
        for (let k = 0; k < q.length; ) {
          const g = q[k];
          if (this.ledger.free(i) < g.grow) {
            k++;
            continue;
          }
          q.splice(k, 1);
          this.ledger.grow(i, g.grow);
          g.state.held += g.grow;
          g.resolve();
        }
        // every trajectory here waits to grow and none fits: the newest holder gives its
        // reservation back (its KV may be recomputed later) so the others can finish
        if (q.length === 0 || q.length < this.ledger.active[i]) break;
        const v = q.findLast((g) => g.state.held > 0);
        if (!v) {
          // nothing of ours is reserved here, so only stale live usage blocks: serve the oldest
          const g = q.shift() as Grower;
          this.ledger.grow(i, g.grow);
          g.state.held += g.grow;
          g.resolve();
          continue;
        }
        this.ledger.shrink(i, v.state.held);
        v.grow += v.state.held;
        v.state.held = 0;
        this.preemptions++;
      }
    }
  }

  private lease(index: number, budget: number, initial: number): Lease {
    const engine = this.engines[index];
    const state = { held: initial };
    let released = false;
    return {
      engine,
      index,
      ...(this.incremental ? { chunk: this.chunkTokens } : {}),
      generate: (ids, s, signal) => engine.generate(ids, s, signal),
      ensure: (total, signal) => {
        if (total <= state.held) return Promise.resolve();
        if (total > budget)
          return Promise.reject(new Error(`context ${total} exceeds the trajectory budget ${budget}`));
        const grow = Math.min(budget - state.held, Math.max(total - state.held, this.chunkTokens));
        return new Promise<void>((resolve, reject) => {
          const onAbort = () => {
            const q = this.growers[index];
            const k = q.indexOf(g);
            if (k >= 0) {
              q.splice(k, 1);
              reject(new Error('aborted while waiting for KV capacity'));
              this.pump();
            }
          };
          const g: Grower = { state, grow, resolve: untilServed(signal, onAbort, resolve), reject };
          this.growers[index].push(g);
          this.pump();
        });
      },
      release: () => {
        if (released) return;
        released = true;
        this.ledger.give(index, state.held);
        this.pump();
      },
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
    for (const q of this.growers)
      for (const g of q.splice(0)) g.reject(new Error('scheduler closed while waiting for KV capacity'));
  }
}

/** Listens for the caller's abort until the returned resolver runs. One caller signal usually spans a whole
 *  rollout, so a served waiter must not leave its listener on it. */
function untilServed<T>(signal: AbortSignal | undefined, onAbort: () => void, resolve: (v: T) => void) {
  signal?.addEventListener('abort', onAbort, { once: true });
  return (v: T) => {
    signal?.removeEventListener('abort', onAbort);
    resolve(v);
  };
}
