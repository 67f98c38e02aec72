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
  choose(policy: Policy, budget: number): number | null {
    const n = this.capacity.length;
    if (policy === 'round-robin') return this.rr++ % n;
    if (policy === 'least-requests') {
      let best = 0;
      for (let i = 1; i < n; i++) if (this.active[i] < this.active[best]) best = i;
      return best;
    }
    let best = 0;
    for (let i = 1; i < n; i++) if (this.free(i) > this.free(best)) best = i;
    return this.free(best) >= budget ? best : null;
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

  give(i: number, budget: number): void {
    this.reserved[i] -= budget;
    this.active[i]--;
  }
}

export interface SchedulerOptions {
  policy?: Policy; // default 'kv-budget'
  budgetCoef?: number; // >1 reserves more conservatively (reference `server_budget_coef`); default 1
  pollMs?: number; // live load polling interval; 0 = off; default 1000
}

export interface Lease {
  readonly engine: Engine;
  readonly index: number;
  generate(inputIds: number[], sampling: SamplingParams, signal?: AbortSignal): Promise<GenerateResult>;
  release(): void; // idempotent
}

interface Waiter {
  budget: number;
  resolve: (i: number) => void;
  reject: (e: Error) => void;
}

export class Scheduler {
  readonly ledger: KvLedger;
  readonly policy: Policy;
  private readonly waiters: Waiter[] = [];
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

  /** Places a trajectory that needs at most `budget` KV tokens; waits (FIFO) while none fits. */
  acquire(budget: number, signal?: AbortSignal): Promise<Lease> {
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
      const w: Waiter = { budget, resolve, reject };
      signal?.addEventListener(
        'abort',
        () => {
          const k = this.waiters.indexOf(w);
          if (k >= 0) {
            this.waiters.splice(k, 1);
            reject(new Error('aborted while waiting for KV capacity'));
          }
        },
        { once: true },
      );
      this.waiters.push(w);
      this.pump();
    }).then((i) => this.lease(i, budget));
  }

  private pump(): void {
    while (this.waiters.length > 0) {
      const w = this.waiters[0];
      const i = this.ledger.choose(this.policy, w.budget);
      if (i === null) return; // FIFO: the head waits for a release, nobody overtakes it
      this.waiters.shift();
      this.ledger.take(i, w.budget);
      w.resolve(i);
    }
  }

  private lease(index: number, budget: number): Lease {
    const engine = this.engines[index];
    let released = false;
    return {
      engine,
      index,
      generate: (ids, s, signal) => engine.generate(ids, s, signal),
      release: () => {
        if (released) return;
        released = true;
        this.ledger.give(index, budget);
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
  }
}
