// One sandbox over every core. A SandboxPool is one broker and one zygote, and the zygote forks every call's
// child in turn: on a 16-core Xeon one pool ran ~2,150 calls/s at ~2 ms of CPU each, ~4.3 cores, whatever the
// cores (issue 42). A ShardedPool runs several pools (shards), each its own broker and zygote with its own slots,
// uid range and sessions: a stateless call goes to the shard with the fewest calls outstanding, a session's
// calls to the shard that opened it.
import { availableParallelism } from 'node:os';
import { type PoolStats, SandboxPool, type SandboxPoolOptions } from './pool.js';
import type { CodeRunner, RunRequest, RunResult } from './types.js';

/** Where a shard count may come from besides the option (and `--shards`). */
export const SHARDS_ENV = 'RSTAR2_SANDBOX_SHARDS';

/** A pool keeps about 4 cores busy at full load (its broker, its zygote's forks and the children), so one shard per
 * 4 cores, rounded, at least 1: 1 up to 5 cores, 4 on 16. */
export function defaultShards(cores = availableParallelism()): number {
  return Math.max(1, Math.round(cores / 4));
}

/** The shard count asked for (option, else $RSTAR2_SANDBOX_SHARDS), else defaultShards(). */
export function resolveShards(asked?: number): number {
  const env = process.env[SHARDS_ENV];
  const n = asked ?? (env === undefined || env === '' ? defaultShards() : Number(env));
  if (!Number.isInteger(n) || n < 1 || n > 64)
    throw new Error(
      `sandbox shards must be an integer in [1, 64], got ${asked ?? JSON.stringify(env)}` +
        (asked === undefined ? ` (from $${SHARDS_ENV})` : ''),
    );
  return n;
}

export interface ShardedPoolOptions extends SandboxPoolOptions {
  /** broker+zygote pairs; default $RSTAR2_SANDBOX_SHARDS, else defaultShards(). `slots` and `maxSessions` are
   * totals, split evenly between them. */
  shards?: number;
}

/** How long a session's shard is remembered after its last call: the pool answers a lost or expired session's id
 * for max(TTL, 1 h), and the id must keep reaching that shard, not open a fresh session on another. */
const PIN_KEEP_MS = 3_600_000;

export class ShardedPool implements CodeRunner {
  /** calls sent to each shard and not yet answered */
  private readonly outstanding: number[];
  /** session id -> its shard and last use */
  private readonly pins = new Map<string, { shard: number; at: number }>();
  private next = 0;
  private readonly sweep: NodeJS.Timeout;

  private constructor(readonly shards: SandboxPool[]) {
    this.outstanding = shards.map(() => 0);
    const keep = Math.max(shards[0].options.sessionTtlMs, PIN_KEEP_MS) + shards[0].options.sessionTtlMs;
    this.sweep = setInterval(() => {
      const before = Date.now() - keep;
      for (const [id, p] of this.pins) if (p.at < before) this.pins.delete(id);
    }, 60_000);
    this.sweep.unref();
  }

  static async start(o: ShardedPoolOptions = {}): Promise<ShardedPool> {
    const { shards: asked, ...pool } = o;
    const n = Math.min(resolveShards(asked), o.slots ?? Number.POSITIVE_INFINITY);
    if (n === 1) return new ShardedPool([await SandboxPool.start(pool)]);
    const split = (total: number) => Math.ceil(total / n);
    const slots = split(o.slots ?? Math.max(1, Math.min(512, availableParallelism() * 4)));
    const maxSessions = split(o.maxSessions ?? 16);
    const started = await Promise.allSettled(
      Array.from({ length: n }, (_, i) =>
        SandboxPool.start({
          ...pool,
          slots,
          maxSessions,
          log: o.log
            ? (l) => o.log?.(`[shard ${i}] ${l}`)
            : (l) => process.stderr.write(`[sandbox ${i}] ${l}\n`),
        }),
      ),
    );
    const up = started.flatMap((s) => (s.status === 'fulfilled' ? [s.value] : []));
    const failed = started.find((s) => s.status === 'rejected');
    if (failed) {
      await Promise.all(up.map((p) => p.close()));
      throw failed.reason;
    }
    return new ShardedPool(up);
  }

  /** Executor slots over all shards. */
  get slots(): number {
    return this.shards.reduce((a, p) => a + p.options.slots, 0);
  }

  run(req: RunRequest): Promise<RunResult> {
    if (this.shards.length === 1) return this.shards[0].run(req);
    const i = req.session === undefined ? this.leastLoaded() : this.shardOf(req.session);
    this.outstanding[i]++;
    return this.shards[i].run(req).then((r) => {
      this.outstanding[i]--;
      // a pool answers a session busy only when it cannot open it: the next try may find room on another shard
      if (req.session !== undefined && r.status === 'busy') this.pins.delete(req.session);
      return r;
    });
  }

  runBatch(reqs: RunRequest[]): Promise<RunResult[]> {
    return Promise.all(reqs.map((r) => this.run(r)));
  }

  /** The shard with the fewest calls outstanding; ties go round, so an idle sandbox uses every shard's spares. */
  private leastLoaded(): number {
    const n = this.shards.length;
    let best = this.next;
    for (let k = 1; k < n; k++) {
      const i = (this.next + k) % n;
      if (this.outstanding[i] < this.outstanding[best]) best = i;
    }
    this.next = (best + 1) % n;
    return best;
  }

  /** A session's shard: the one that opened it, or for a new id the one with the fewest live sessions. */
  private shardOf(session: string): number {
    const now = Date.now();
    const pin = this.pins.get(session);
    if (pin) {
      pin.at = now;
      return pin.shard;
    }
    let best = 0;
    let bestLive = Number.POSITIVE_INFINITY;
    this.shards.forEach((p, i) => {
      const live = p.stats().sessions;
      if (live < bestLive || (live === bestLive && this.outstanding[i] < this.outstanding[best])) {
        best = i;
        bestLive = live;
      }
    });
    this.pins.set(session, { shard: best, at: now });
    return best;
  }

  closeSession(session: string): boolean {
    const pin = this.pins.get(session);
    if (this.shards.length === 1) return this.shards[0].closeSession(session);
    if (!pin) return false;
    this.pins.delete(session);
    return this.shards[pin.shard].closeSession(session);
  }

  /** The shards' counts added up. */
  stats(): PoolStats {
    const all = this.shardStats();
    const sum = (k: keyof PoolStats) => all.reduce((a, s) => a + s[k], 0);
    return {
      queued: sum('queued'),
      inFlight: sum('inFlight'),
      completed: sum('completed'),
      restarts: sum('restarts'),
      retried: sum('retried'),
      sessions: sum('sessions'),
      kernelLimits: sum('kernelLimits'),
    };
  }

  /** Each shard's counts, in shard order (the `shard` label on /metrics). */
  shardStats(): PoolStats[] {
    return this.shards.map((p) => p.stats());
  }

  /** pids of the shards' outer sandbox processes, for benchmarks and fault tests. */
  get sandboxPids(): number[] {
    return this.shards.flatMap((p) => (p.sandboxPid === undefined ? [] : [p.sandboxPid]));
  }

  async close(): Promise<void> {
    clearInterval(this.sweep);
    await Promise.all(this.shards.map((p) => p.close()));
  }
}
