import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import { Redis } from 'ioredis';
import { failedResult } from './codejudge.js';
import { type CodeRunner, REDIS_PASSWORD_ENV, type RunRequest, type RunResult } from './types.js';

export { REDIS_PASSWORD_ENV };

// Distribution over Redis: the front door (RedisRunner, a CodeRunner) LPUSHes items onto one list;
// worker hosts (RedisWorker) BLMOVE each item into their own processing list, run it on their local
// isolated pool and push the result onto the front door's reply list. A worker proves it is alive
// with a short-TTL key; when that key lapses, a reaper (front door and every worker run one) moves
// the dead worker's unfinished items back to the queue once, and on a second death answers them with
// internal_error — an item is never silently lost. User code runs inside the pool's sandbox (no
// network, cleared env), so it can reach neither Redis nor the URL/password given to the worker.
//
// Item wire format: "<attempts>\t<reply list>\t<item id>\t<RunRequest JSON>" (tab-separated head
// so the Lua reaper can read it without a JSON library round-trip of the request).

export interface RedisOptions {
  /** Key prefix shared by front doors and workers. */
  prefix?: string;
  /** Worker liveness TTL; a worker silent this long is considered dead. */
  heartbeatTtlMs?: number;
  reapEveryMs?: number;
  /** Re-queues allowed after a worker death before the item is reported failed. */
  maxRequeues?: number;
  log?: (rec: Record<string, unknown>) => void;
}

export interface RedisRunnerOptions extends RedisOptions {
  /** Longest wait for a worker's result before answering queue_timeout (no worker at all). */
  maxWaitMs?: number;
  /** Redis unreachable this long: every waiting item is answered internal_error. */
  redisDownFailMs?: number;
}

interface Resolved extends Required<Omit<RedisOptions, 'log'>> {
  log: (rec: Record<string, unknown>) => void;
}

function resolve(o: RedisOptions): Resolved {
  return {
    prefix: 'rstar2:sbx',
    heartbeatTtlMs: 3000,
    reapEveryMs: 1000,
    maxRequeues: 1,
    log: (rec) => process.stderr.write(`${JSON.stringify({ time: new Date().toISOString(), ...rec })}\n`),
    ...o,
  };
}

const keys = (p: string) => ({
  queue: `${p}:queue`,
  proc: (wid: string) => `${p}:proc:${wid}`,
  alive: (wid: string) => `${p}:alive:${wid}`,
  reply: (fid: string) => `${p}:reply:${fid}`,
});

// KEYS: processing list, queue, alive key. ARGV: maxRequeues, reply-list prefix.
// Atomic, so concurrent reapers cannot requeue the same item twice.
const REAP_LUA = `
if redis.call('EXISTS', KEYS[3]) == 1 then return {0, 0} end
local items = redis.call('LRANGE', KEYS[1], 0, -1)
local requeued, failed = 0, 0
for i = #items, 1, -1 do
  local raw = items[i]
  local a, reply, id, rest = string.match(raw, '^(%d+)\\t([^\\t]*)\\t([^\\t]*)\\t(.*)$')
  if a then
    local attempts = tonumber(a)
    if attempts < tonumber(ARGV[1]) then
      redis.call('RPUSH', KEYS[2], (attempts + 1) .. '\\t' .. reply .. '\\t' .. id .. '\\t' .. rest)
      requeued = requeued + 1
    else
      local msg = 'worker died while running this item ' .. (attempts + 1) .. ' times; not retried again'
      local res = '{"id":' .. cjson.encode(id) .. ',"result":{"status":"internal_error","exitCode":null,' ..
        '"signal":null,"stdout":"","stderr":"","truncated":false,"timedOut":false,"oom":false,"wallMs":0,' ..
        '"cpuMs":0,"peakMemoryKb":0,"error":' .. cjson.encode(msg) .. '}}'
      redis.call('LPUSH', ARGV[2] .. reply, res)
      failed = failed + 1
    end
  end
end
redis.call('DEL', KEYS[1])
return {requeued, failed}
`;

/** ioredis reconnects by itself; log its errors (at most one line per 5 s) instead of crashing.
 * The URL goes to ioredis as given: redis://:password@host:port/db, redis://user:password@host,
 * rediss://… for TLS. A URL without a password takes $RSTAR2_REDIS_PASSWORD, which keeps it out of `ps`.
 * A first connection that fails throws Redis's reason (WRONGPASS, NOAUTH), where ioredis's own
 * rejection says only "Connection is closed". */
async function connectRedis(url: string, o: Resolved, role: string): Promise<Redis> {
  const envPassword = process.env[REDIS_PASSWORD_ENV];
  const r = new Redis(url, { lazyConnect: true, ...(envPassword ? { password: envPassword } : {}) });
  let cause: Error | undefined;
  r.on('error', (e: Error) => (cause ??= e));
  watchErrors(r, o, role);
  try {
    await r.connect();
  } catch (e) {
    r.disconnect(); // else it keeps retrying
    throw new Error(`${role}: cannot use redis at ${redactUrl(url)}: ${(cause ?? (e as Error)).message}`);
  }
  return r;
}

/** The URL with its password starred, for messages. */
function redactUrl(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = '***';
    return u.toString();
  } catch {
    return '(unparseable url)';
  }
}

function watchErrors(r: Redis, o: Resolved, role: string): Redis {
  let last = 0;
  r.on('error', (e: Error) => {
    if (Date.now() - last < 5000) return;
    last = Date.now();
    o.log({ level: 'warn', msg: 'redis connection error', role, error: e.message });
  });
  return r;
}

/** Finds processing lists of dead workers and requeues/reports their items. */
async function reapDead(redis: Redis, o: Resolved): Promise<void> {
  const k = keys(o.prefix);
  const procPrefix = k.proc('');
  let cursor = '0';
  do {
    const [next, found] = await redis.scan(cursor, 'MATCH', `${procPrefix}*`, 'COUNT', 200);
    cursor = next;
    for (const key of found) {
      const wid = key.slice(procPrefix.length);
      const [requeued, failed] = (await redis.eval(
        REAP_LUA,
        3,
        key,
        k.queue,
        k.alive(wid),
        String(o.maxRequeues),
        k.reply(''),
      )) as [number, number];
      if (requeued || failed)
        o.log({ level: 'warn', msg: 'reaped dead worker', worker: wid, requeued, failed });
    }
  } while (cursor !== '0');
}

/** The front door's CodeRunner: enqueue on Redis, await each item's result. */
export class RedisRunner implements CodeRunner {
  private readonly o: Resolved & { maxWaitMs: number; redisDownFailMs: number };
  private readonly k: ReturnType<typeof keys>;
  readonly id = `${hostname()}-${process.pid}-${randomUUID().slice(0, 8)}`;
  private readonly pending = new Map<
    string,
    { resolve: (r: RunResult) => void; timer: NodeJS.Timeout; queueTimer?: NodeJS.Timeout; payload: string }
  >();
  private runId = '';
  private downSince = 0;
  private readonly downCheck: NodeJS.Timeout;
  private nextId = 0;
  private closed = false;
  private readonly replyLoop: Promise<void>;
  private readonly reaper: NodeJS.Timeout;

  private constructor(
    private readonly cmd: Redis,
    private readonly blk: Redis,
    opts: RedisRunnerOptions,
  ) {
    this.o = {
      ...resolve(opts),
      maxWaitMs: opts.maxWaitMs ?? 3_600_000,
      redisDownFailMs: opts.redisDownFailMs ?? 15_000,
    };
    this.k = keys(this.o.prefix);
    // A Redis restart (new run_id) loses the queue: resubmit what we still wait for. A long outage
    // fails the waiting items rather than leaving callers hanging.
    cmd.on('close', () => {
      if (!this.closed && !this.downSince) this.downSince = Date.now();
    });
    cmd.on('ready', () => {
      if (!this.downSince || this.closed) return;
      this.downSince = 0;
      this.afterReconnect().catch((e: Error) =>
        this.o.log({ level: 'warn', msg: 'resubmit after reconnect failed', error: e.message }),
      );
    });
    this.downCheck = setInterval(() => {
      if (!this.downSince || Date.now() - this.downSince < this.o.redisDownFailMs) return;
      for (const id of [...this.pending.keys()])
        this.settle(
          id,
          failedResult(
            'internal_error',
            `redis unreachable for ${Date.now() - this.downSince} ms; result lost`,
          ),
        );
    }, 250);
    this.downCheck.unref();
    this.replyLoop = this.readReplies();
    this.reaper = setInterval(() => {
      reapDead(this.cmd, this.o).catch((e: Error) =>
        this.o.log({ level: 'warn', msg: 'reaper failed', error: e.message }),
      );
    }, this.o.reapEveryMs);
    this.reaper.unref();
  }

  static async connect(url: string, opts: RedisRunnerOptions = {}): Promise<RedisRunner> {
    const o = resolve(opts);
    const cmd = await connectRedis(url, o, 'front door');
    const runner = new RedisRunner(cmd, watchErrors(cmd.duplicate(), o, 'front door replies'), opts);
    runner.runId = await runner.redisRunId();
    return runner;
  }

  private async redisRunId(): Promise<string> {
    const info = await this.cmd.info('server');
    return /run_id:(\w+)/.exec(info)?.[1] ?? '';
  }

  private async afterReconnect(): Promise<void> {
    const runId = await this.redisRunId();
    if (runId === this.runId) return;
    this.runId = runId;
    const payloads = [...this.pending.values()].map((p) => p.payload);
    this.o.log({ level: 'warn', msg: 'redis restarted; resubmitting waiting items', items: payloads.length });
    if (payloads.length) await this.cmd.lpush(this.k.queue, ...payloads);
  }

  run(req: RunRequest): Promise<RunResult> {
    return this.runBatch([req]).then((r) => r[0]);
  }

  runBatch(reqs: RunRequest[]): Promise<RunResult[]> {
    if (reqs.length === 0) return Promise.resolve([]);
    if (this.closed)
      return Promise.resolve(reqs.map(() => failedResult('internal_error', 'redis front door is closed')));
    const ids = reqs.map(() => `${this.nextId++}`);
    const payloads = reqs.map((r, i) => `0\t${this.id}\t${ids[i]}\t${JSON.stringify(r)}`);
    const results = ids.map(
      (id, i) =>
        new Promise<RunResult>((resolveItem) => {
          const timer = setTimeout(() => {
            this.pending.delete(id);
            resolveItem(
              failedResult('queue_timeout', `no worker returned a result within ${this.o.maxWaitMs} ms`),
            );
          }, this.o.maxWaitMs);
          timer.unref();
          const qt = reqs[i].queueTimeoutMs ?? 0;
          const queueTimer =
            qt > 0 && qt < this.o.maxWaitMs ? setTimeout(() => this.unqueue(id, qt), qt) : undefined;
          queueTimer?.unref();
          this.pending.set(id, { resolve: resolveItem, timer, queueTimer, payload: payloads[i] });
        }),
    );
    // Not awaited: an item answered meanwhile (timeout, outage) must not wait for the push to settle.
    this.cmd.lpush(this.k.queue, ...payloads).catch((e: Error) => {
      for (const id of ids)
        this.settle(id, failedResult('internal_error', `cannot enqueue on redis: ${e.message}`));
    });
    return Promise.all(results);
  }

  private settle(id: string, r: RunResult): void {
    const p = this.pending.get(id);
    if (!p) return; // already answered (timeout) or a duplicate after a requeue
    this.pending.delete(id);
    clearTimeout(p.timer);
    clearTimeout(p.queueTimer);
    p.resolve(r);
  }

  /** RunRequest.queueTimeoutMs passed: an item no worker has taken yet is pulled off the queue, so a
   * worker arriving later never runs it, and answered queue_timeout. One a worker holds has started
   * and runs to the end, as in the pool. */
  private async unqueue(id: string, qt: number): Promise<void> {
    const p = this.pending.get(id);
    if (!p) return;
    // Redis unreachable: answer on time anyway; should the item still run later, its result is ignored.
    const removed = await this.cmd.lrem(this.k.queue, 1, p.payload).catch(() => 1);
    if (removed > 0) this.settle(id, failedResult('queue_timeout', `no worker took it within ${qt} ms`));
  }

  private async readReplies(): Promise<void> {
    const key = this.k.reply(this.id);
    while (!this.closed) {
      try {
        const got = await this.blk.brpop(key, 1);
        if (!got) continue;
        const msg = JSON.parse(got[1]) as { id: string; result: RunResult };
        this.settle(msg.id, msg.result);
      } catch (e) {
        if (this.closed) return;
        this.o.log({ level: 'warn', msg: 'reply loop error', error: (e as Error).message });
        await new Promise((r) => setTimeout(r, 200));
      }
    }
  }

  /** Live workers (for /status num_workers). */
  async numWorkers(): Promise<number> {
    let n = 0;
    let cursor = '0';
    do {
      const [next, found] = await this.cmd.scan(cursor, 'MATCH', `${this.k.alive('')}*`, 'COUNT', 200);
      cursor = next;
      n += found.length;
    } while (cursor !== '0');
    return n;
  }

  async queueDepth(): Promise<number> {
    return this.cmd.llen(this.k.queue);
  }

  async close(): Promise<void> {
    this.closed = true;
    clearInterval(this.reaper);
    clearInterval(this.downCheck);
    for (const id of [...this.pending.keys()])
      this.settle(id, failedResult('internal_error', 'redis front door closed before a result arrived'));
    this.blk.disconnect();
    // A blocked BRPOP on a dead connection may never reject; do not wait on it for long.
    await Promise.race([this.replyLoop, new Promise((r) => setTimeout(r, 1000).unref())]);
    this.cmd.disconnect();
  }
}

export interface RedisWorkerOptions extends RedisOptions {
  /** Items run at once (normally the local pool's slot count). */
  concurrency?: number;
  id?: string;
}

/** A worker host: pulls items from Redis and runs them on a local CodeRunner (the isolated pool). */
export class RedisWorker {
  readonly id: string;
  private readonly o: Resolved & { concurrency: number };
  private readonly k: ReturnType<typeof keys>;
  private stopped = false;
  private readonly loops: Promise<void>[] = [];
  private readonly blocking: Redis[] = [];
  private heartbeat?: NodeJS.Timeout;
  private reaper?: NodeJS.Timeout;
  completed = 0;

  private constructor(
    private readonly cmd: Redis,
    private readonly runner: CodeRunner,
    opts: RedisWorkerOptions,
  ) {
    this.o = { ...resolve(opts), concurrency: opts.concurrency ?? 4 };
    this.k = keys(this.o.prefix);
    this.id = opts.id ?? `${hostname()}-${process.pid}-${randomUUID().slice(0, 8)}`;
  }

  static async start(url: string, runner: CodeRunner, opts: RedisWorkerOptions = {}): Promise<RedisWorker> {
    const o = resolve(opts);
    const cmd = await connectRedis(url, o, 'worker');
    const w = new RedisWorker(cmd, runner, opts);
    await w.beat();
    w.heartbeat = setInterval(
      () =>
        w.beat().catch((e: Error) => w.o.log({ level: 'warn', msg: 'heartbeat failed', error: e.message })),
      Math.max(100, Math.floor(w.o.heartbeatTtlMs / 3)),
    );
    w.reaper = setInterval(() => {
      reapDead(cmd, w.o).catch((e: Error) =>
        w.o.log({ level: 'warn', msg: 'reaper failed', error: e.message }),
      );
    }, w.o.reapEveryMs);
    for (let i = 0; i < w.o.concurrency; i++) {
      const blk = watchErrors(cmd.duplicate(), w.o, 'worker pop');
      w.blocking.push(blk);
      w.loops.push(w.loop(blk));
    }
    w.o.log({ level: 'info', msg: 'redis worker started', worker: w.id, concurrency: w.o.concurrency });
    return w;
  }

  private async beat(): Promise<void> {
    await this.cmd.set(this.k.alive(this.id), '1', 'PX', this.o.heartbeatTtlMs);
  }

  private async loop(blk: Redis): Promise<void> {
    const proc = this.k.proc(this.id);
    while (!this.stopped) {
      let raw: string | null;
      try {
        raw = await blk.blmove(this.k.queue, proc, 'RIGHT', 'LEFT', 1);
      } catch (e) {
        if (this.stopped) return;
        this.o.log({ level: 'warn', msg: 'redis pop failed', error: (e as Error).message });
        await new Promise((r) => setTimeout(r, 200));
        continue;
      }
      if (raw === null) continue;
      const m = /^(\d+)\t([^\t]*)\t([^\t]*)\t/.exec(raw);
      if (!m) {
        this.o.log({ level: 'error', msg: 'dropping unparseable queue item', head: raw.slice(0, 80) });
        await this.cmd.lrem(proc, 1, raw).catch(() => {});
        continue;
      }
      const [, , reply, id] = m;
      this.busy++;
      try {
        await this.runAndPublish(raw, proc, m[0].length, reply, id);
      } finally {
        this.busy--;
      }
    }
  }

  private async runAndPublish(
    raw: string,
    proc: string,
    head: number,
    reply: string,
    id: string,
  ): Promise<void> {
    let result: RunResult;
    try {
      result = await this.runner.run(JSON.parse(raw.slice(head)) as RunRequest);
    } catch (e) {
      result = failedResult(
        'internal_error',
        `worker ${this.id} failed to run the item: ${(e as Error).message}`,
      );
    }
    if (this.abandoned) return;
    const replyKey = this.k.reply(reply);
    try {
      await this.cmd
        .multi()
        .lpush(replyKey, JSON.stringify({ id, result }))
        .pexpire(replyKey, 3_600_000)
        .lrem(proc, 1, raw)
        .exec();
      this.completed++;
    } catch (e) {
      // Left in the processing list: the reaper requeues it once this worker is gone.
      this.o.log({ level: 'error', msg: 'could not publish result', id, error: (e as Error).message });
    }
  }

  private abandoned = false;
  private busy = 0;

  /** Finishes the items in hand, then stops taking work and deregisters. */
  async stop(): Promise<void> {
    this.stopped = true;
    // Items in hand finish and publish; idle loops sit in BLMOVE (1 s) and may hang on a dead link.
    while (this.busy > 0) await new Promise((r) => setTimeout(r, 50));
    await Promise.race([Promise.all(this.loops), new Promise((r) => setTimeout(r, 1500).unref())]);
    this.shutdownTimers();
    // Deregister so the front door's num_workers drops at once (bounded wait if Redis is gone).
    await Promise.race([
      this.cmd.del(this.k.alive(this.id)).catch(() => {}),
      new Promise((r) => setTimeout(r, 1000)),
    ]);
    for (const b of this.blocking) b.disconnect();
    this.cmd.disconnect();
  }

  /** Test hook: behave like a killed host — no heartbeat, no results, items left in processing. */
  crash(): void {
    this.stopped = true;
    this.abandoned = true;
    this.shutdownTimers();
    for (const b of this.blocking) b.disconnect();
    this.cmd.disconnect();
  }

  private shutdownTimers(): void {
    if (this.heartbeat) clearInterval(this.heartbeat);
    if (this.reaper) clearInterval(this.reaper);
  }
}
