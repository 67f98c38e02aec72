import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { z } from 'zod';
import {
  BatchSubmissionSchema,
  type CodeJudgeOptions,
  failedResult,
  type Submission,
  SubmissionSchema,
  toJudgeResult,
  toRunRequest,
  toSubmissionResult,
} from './codejudge.js';
import { ServiceMetrics } from './metrics.js';
import type { CodeRunner, RunRequest, RunResult } from './types.js';

// The sandbox HTTP service: code-judge-compatible routes (so the reference's client works unchanged)
// plus a native API returning full RunResults. Every admitted item gets exactly one result: it runs,
// or it is answered `queue_timeout` the moment its queue deadline passes, or `internal_error` on
// shutdown. Admission is bounded (busy → 503 + JSON) and the queue is round-robin across clients so
// one trainer's 45K-call burst cannot starve another's.

export interface SandboxServerOptions {
  runner: CodeRunner;
  port?: number; // 0 = any free port
  host?: string; // default 127.0.0.1
  /** Items handed to the runner at once (its slot count; more only queues inside the runner). */
  concurrency?: number;
  /** Items allowed to wait; a request that would exceed it is refused whole with 503. */
  maxQueue?: number;
  /** Queue deadline for /run, /judge and the short batches (code-judge MAX_QUEUE_WORK_LIFE_TIME). */
  shortQueueWaitMs?: number;
  /** Queue deadline for long batches and the native API. */
  longQueueWaitMs?: number;
  maxBodyBytes?: number;
  maxCodeBytes?: number;
  /** Wall limit applied to code-judge submissions (its MAX_EXECUTION_TIME; rStar2 uses 4 s). */
  timeoutMs?: number;
  memoryMb?: number;
  codeJudge?: CodeJudgeOptions;
  /** num_workers for GET /status; default: concurrency. */
  numWorkers?: () => number | Promise<number>;
  /** Items waiting beyond this server (e.g. on Redis), added to /status `queue`. */
  backlog?: () => number | Promise<number>;
  /** Structured log sink; default JSON lines on stderr. */
  log?: (rec: Record<string, unknown>) => void;
  logRequests?: boolean;
}

interface Item {
  req: RunRequest;
  admittedAt: number;
  client: string;
  timer?: NodeJS.Timeout;
  done: (r: RunResult) => void;
}

/** Per-client FIFO queues served round-robin, feeding at most `concurrency` items to the runner. */
export class FairScheduler {
  private readonly queues = new Map<string, Item[]>();
  private ring: string[] = [];
  private next = 0;
  depth = 0;
  inFlight = 0;
  private closed = false;

  constructor(
    private readonly runner: CodeRunner,
    private readonly concurrency: number,
    private readonly maxQueue: number,
    private readonly onDone: (r: RunResult, latencyMs: number) => void = () => {},
  ) {}

  get clientsWaiting(): number {
    return this.ring.length;
  }

  /** Whether `n` more items fit; callers check before submitting a whole request. */
  canAdmit(n: number): boolean {
    const free = Math.max(0, this.concurrency - this.inFlight - this.depth);
    return !this.closed && this.depth + n <= this.maxQueue + free;
  }

  submit(client: string, req: RunRequest, queueWaitMs: number): Promise<RunResult> {
    return new Promise((resolve) => {
      const item: Item = {
        req,
        client,
        admittedAt: Date.now(),
        done: (r) => {
          this.onDone(r, Date.now() - item.admittedAt);
          resolve(r);
        },
      };
      if (this.closed) return item.done(failedResult('internal_error', 'service is shutting down'));
      let q = this.queues.get(client);
      if (!q) {
        q = [];
        this.queues.set(client, q);
        this.ring.push(client);
      }
      q.push(item);
      this.depth++;
      if (Number.isFinite(queueWaitMs)) {
        item.timer = setTimeout(() => this.expire(item), queueWaitMs);
        item.timer.unref();
      }
      this.pump();
    });
  }

  private expire(item: Item): void {
    if (!this.remove(item)) return;
    item.done(
      failedResult(
        'queue_timeout',
        'could not start before the queue deadline',
        Date.now() - item.admittedAt,
      ),
    );
  }

  private remove(item: Item): boolean {
    const q = this.queues.get(item.client);
    const i = q ? q.indexOf(item) : -1;
    if (!q || i < 0) return false;
    q.splice(i, 1);
    this.depth--;
    if (q.length === 0) this.dropClient(item.client);
    return true;
  }

  private dropClient(client: string): void {
    this.queues.delete(client);
    const i = this.ring.indexOf(client);
    this.ring.splice(i, 1);
    if (i < this.next) this.next--;
    if (this.next >= this.ring.length) this.next = 0;
  }

  private take(): Item | undefined {
    if (this.ring.length === 0) return undefined;
    const client = this.ring[this.next];
    const q = this.queues.get(client) as Item[];
    const item = q.shift() as Item;
    this.depth--;
    if (q.length === 0) this.dropClient(client);
    else this.next = (this.next + 1) % this.ring.length;
    return item;
  }

  private pump(): void {
    while (this.inFlight < this.concurrency) {
      const item = this.take();
      if (!item) return;
      if (item.timer) clearTimeout(item.timer);
      this.inFlight++;
      this.runner
        .run(item.req)
        .catch((e: unknown) => failedResult('internal_error', `runner failed: ${(e as Error).message}`))
        .then((r) => {
          this.inFlight--;
          item.done(r);
          this.pump();
        });
    }
  }

  /** Answers every queued item (never silently dropped); running items finish normally. */
  close(): void {
    this.closed = true;
    for (const q of this.queues.values())
      for (const item of q) {
        if (item.timer) clearTimeout(item.timer);
        item.done(failedResult('internal_error', 'service is shutting down before this item started'));
      }
    this.queues.clear();
    this.ring = [];
    this.depth = 0;
  }
}

const RunRequestSchema = z.object({
  code: z.string(),
  stdin: z.string().optional(),
  timeoutMs: z.number().int().positive().max(3_600_000).optional(),
  memoryMb: z.number().int().positive().optional(),
  files: z.record(z.string(), z.string()).optional(),
  fetchFiles: z.array(z.string()).optional(),
  session: z.string().optional(),
  queueTimeoutMs: z.number().int().nonnegative().optional(),
});
const NativeBatchSchema = z.object({ requests: z.array(RunRequestSchema).min(1) });

class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly detail?: unknown,
  ) {
    super(message);
  }
}

function bounded(v: number | Promise<number>, fallback: number, ms = 2000): Promise<number> {
  return Promise.race([
    Promise.resolve(v).catch(() => fallback),
    new Promise<number>((r) => setTimeout(() => r(fallback), ms).unref()),
  ]);
}

function describeZod(e: z.ZodError): string {
  return e.issues.map((i) => `${i.path.length ? i.path.join('.') : '(body)'}: ${i.message}`).join('; ');
}

export class SandboxServer {
  readonly scheduler: FairScheduler;
  readonly metrics: ServiceMetrics;
  private readonly http: Server;
  private readonly o: Required<
    Omit<SandboxServerOptions, 'numWorkers' | 'backlog' | 'log' | 'memoryMb' | 'codeJudge'>
  > &
    SandboxServerOptions;
  private readonly log: (rec: Record<string, unknown>) => void;
  private responding = 0;

  constructor(opts: SandboxServerOptions) {
    this.o = {
      port: 8088,
      host: '127.0.0.1',
      concurrency: 64,
      maxQueue: 100_000,
      shortQueueWaitMs: 4000,
      longQueueWaitMs: 3_600_000,
      maxBodyBytes: 64 << 20,
      maxCodeBytes: 1 << 20,
      timeoutMs: 4000,
      logRequests: true,
      ...opts,
    };
    this.log =
      opts.log ??
      ((rec) => process.stderr.write(`${JSON.stringify({ time: new Date().toISOString(), ...rec })}\n`));
    this.metrics = new ServiceMetrics(() => ({
      queueDepth: this.scheduler.depth,
      inFlight: this.scheduler.inFlight,
      clients: this.scheduler.clientsWaiting,
    }));
    this.scheduler = new FairScheduler(this.o.runner, this.o.concurrency, this.o.maxQueue, (r, ms) =>
      this.metrics.item(r.status, ms),
    );
    this.http = createServer((req, res) => {
      this.handle(req, res).catch((e: unknown) => {
        this.log({ level: 'error', msg: 'unhandled', error: String((e as Error)?.stack ?? e) });
        if (!res.headersSent) this.send(res, 500, { error: 'internal_error', message: (e as Error).message });
      });
    });
    this.http.keepAliveTimeout = 65_000;
  }

  async listen(): Promise<{ port: number; url: string }> {
    await new Promise<void>((resolve, reject) => {
      this.http.once('error', reject);
      this.http.listen(this.o.port, this.o.host, () => resolve());
    });
    const port = (this.http.address() as AddressInfo).port;
    this.log({ level: 'info', msg: 'listening', host: this.o.host, port });
    return { port, url: `http://${this.o.host}:${port}` };
  }

  /** Stops accepting, answers queued items, lets running ones finish (up to graceMs), then closes. */
  async close(graceMs = 10_000): Promise<void> {
    const closed = new Promise<void>((resolve) => this.http.close(() => resolve()));
    this.scheduler.close();
    this.http.closeIdleConnections?.();
    const t0 = Date.now();
    while ((this.scheduler.inFlight > 0 || this.responding > 0) && Date.now() - t0 < graceMs)
      await new Promise((r) => setTimeout(r, 20));
    this.http.closeAllConnections?.();
    await closed;
  }

  private send(
    res: ServerResponse,
    status: number,
    body: unknown,
    headers: Record<string, string> = {},
  ): void {
    const text = typeof body === 'string' && headers['content-type'] ? body : JSON.stringify(body);
    res.writeHead(status, { 'content-type': 'application/json', ...headers });
    res.end(text);
  }

  private readBody(req: IncomingMessage): Promise<unknown> {
    return new Promise((resolve, reject) => {
      const chunks: Buffer[] = [];
      let size = 0;
      let over = false;
      req.on('data', (c: Buffer) => {
        size += c.length;
        if (size > this.o.maxBodyBytes) over = true;
        else chunks.push(c);
      });
      req.on('error', reject);
      req.on('end', () => {
        if (over)
          return reject(
            new HttpError(400, `request body is ${size} bytes, over the ${this.o.maxBodyBytes}-byte limit`),
          );
        const text = Buffer.concat(chunks).toString('utf8');
        try {
          resolve(JSON.parse(text));
        } catch (e) {
          reject(new HttpError(400, `malformed JSON body: ${(e as Error).message}`));
        }
      });
    });
  }

  parse<T>(schema: z.ZodType<T>, body: unknown): T {
    const r = schema.safeParse(body);
    if (!r.success) throw new HttpError(400, `invalid request: ${describeZod(r.error)}`, r.error.issues);
    return r.data;
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const t0 = Date.now();
    this.responding++;
    res.on('close', () => this.responding--);
    const url = (req.url ?? '/').split('?')[0];
    const client = String(req.headers['x-rstar2-client'] ?? req.socket.remoteAddress ?? 'unknown');
    let status = 200;
    let items = 0;
    try {
      if (req.method === 'GET') {
        this.metrics.request(url);
        if (url === '/ping') return this.send(res, 200, 'pong');
        if (url === '/status') {
          // Remote counts (Redis) must not hang the health check when the backend is down: -1 = unknown.
          const numWorkers = this.o.numWorkers ? await bounded(this.o.numWorkers(), -1) : this.o.concurrency;
          const backlog = this.o.backlog ? Math.max(0, await bounded(this.o.backlog(), 0)) : 0;
          return this.send(res, 200, {
            queue: this.scheduler.depth + backlog,
            num_workers: numWorkers,
            in_flight: this.scheduler.inFlight,
          });
        }
        if (url === '/metrics')
          return this.send(res, 200, this.metrics.render(), { 'content-type': 'text/plain; version=0.0.4' });
        throw new HttpError(404, `no route GET ${url}`);
      }
      if (req.method !== 'POST') throw new HttpError(405, `method ${req.method} not allowed`);
      const route = ROUTES[url];
      if (!route) throw new HttpError(404, `no route POST ${url}`);
      this.metrics.request(url);
      const body = await this.readBody(req);
      const out = await route(this, client, body);
      items = out.items;
      if (out.busy) {
        status = 503;
        this.metrics.rejectedBusy++;
        return this.send(res, 503, out.body, { 'retry-after': '1' });
      }
      return this.send(res, 200, out.body);
    } catch (e) {
      if (!(e instanceof HttpError)) throw e;
      status = e.status;
      this.send(res, e.status, { error: e.message, detail: e.detail });
    } finally {
      if (this.o.logRequests || status >= 400)
        this.log({
          level: status >= 500 ? 'warn' : 'info',
          msg: 'request',
          method: req.method,
          route: url,
          status,
          items,
          ms: Date.now() - t0,
          client,
        });
    }
  }

  /** Runs items through the fair queue; null when admission refuses the whole request. */
  async runItems(
    client: string,
    reqs: (RunRequest | RunResult)[],
    queueWaitMs: number,
  ): Promise<RunResult[] | null> {
    const runnable = reqs.filter((r) => 'code' in r).length;
    if (!this.scheduler.canAdmit(runnable)) return null;
    return Promise.all(
      reqs.map((r) => ('code' in r ? this.scheduler.submit(client, r, queueWaitMs) : Promise.resolve(r))),
    );
  }

  /** A native request, or the result that replaces it when it cannot run. */
  checkItem(req: RunRequest): RunRequest | RunResult {
    const bytes = Buffer.byteLength(req.code, 'utf8');
    if (bytes > this.o.maxCodeBytes)
      return failedResult(
        'invalid_input',
        `code is ${bytes} bytes, over the ${this.o.maxCodeBytes}-byte limit`,
      );
    return req;
  }

  submissionItem(sub: Submission): RunRequest | RunResult {
    if (sub.type !== 'python')
      return failedResult('invalid_input', `submission type '${sub.type}' is not supported (only 'python')`);
    const defaults: Partial<RunRequest> = { timeoutMs: this.o.timeoutMs };
    if (this.o.memoryMb) defaults.memoryMb = this.o.memoryMb;
    return this.checkItem(toRunRequest(sub, defaults));
  }

  busyBody(n: number): unknown {
    return {
      error: 'busy',
      message: `queue full: ${this.scheduler.depth} waiting, limit ${this.o.maxQueue}, request has ${n} items; retry later`,
      queue: this.scheduler.depth,
      limit: this.o.maxQueue,
    };
  }

  get options() {
    return this.o;
  }
}

type RouteResult = { body: unknown; items: number; busy?: boolean };
type Route = (s: SandboxServer, client: string, body: unknown) => Promise<RouteResult>;

function codeJudgeSingle(judge: boolean): Route {
  return async (s, client, body) => {
    const sub = s.parse(SubmissionSchema, body);
    const results = await s.runItems(client, [s.submissionItem(sub)], s.options.shortQueueWaitMs);
    if (!results) return { body: s.busyBody(1), items: 1, busy: true };
    const r = toSubmissionResult(sub, results[0], s.options.codeJudge);
    return { body: judge ? toJudgeResult(r) : r, items: 1 };
  };
}

function codeJudgeBatch(judge: boolean, long: boolean): Route {
  return async (s, client, body) => {
    const batch = s.parse(BatchSubmissionSchema, body);
    const subs = batch.submissions;
    const wait = long ? s.options.longQueueWaitMs : s.options.shortQueueWaitMs;
    const results = await s.runItems(
      client,
      subs.map((x) => s.submissionItem(x)),
      wait,
    );
    if (!results) return { body: s.busyBody(subs.length), items: subs.length, busy: true };
    return {
      body: {
        sub_id: batch.sub_id ?? crypto.randomUUID(),
        results: subs.map((x, i) => {
          const r = toSubmissionResult(x, results[i], s.options.codeJudge);
          return judge ? toJudgeResult(r) : r;
        }),
      },
      items: subs.length,
    };
  };
}

const CloseSessionSchema = z.object({ session: z.string().min(1) });

const ROUTES: Record<string, Route> = {
  '/run': codeJudgeSingle(false),
  '/judge': codeJudgeSingle(true),
  '/run/batch': codeJudgeBatch(false, false),
  '/judge/batch': codeJudgeBatch(true, false),
  '/run/long-batch': codeJudgeBatch(false, true),
  '/judge/long-batch': codeJudgeBatch(true, true),
  '/v1/run': async (s, client, body) => {
    const req = s.parse(RunRequestSchema, body);
    const results = await s.runItems(client, [s.checkItem(req)], s.options.longQueueWaitMs);
    if (!results) return { body: s.busyBody(1), items: 1, busy: true };
    return { body: results[0], items: 1 };
  },
  '/v1/session/close': async (s, _client, body) => {
    const { session } = s.parse(CloseSessionSchema, body);
    if (!s.options.runner.closeSession) throw new HttpError(501, 'this backend has no stateful sessions');
    return { body: { session, closed: await s.options.runner.closeSession(session) }, items: 0 };
  },
  '/v1/batch': async (s, client, body) => {
    const { requests } = s.parse(NativeBatchSchema, body);
    const results = await s.runItems(
      client,
      requests.map((r) => s.checkItem(r)),
      s.options.longQueueWaitMs,
    );
    if (!results) return { body: s.busyBody(requests.length), items: requests.length, busy: true };
    return { body: { results }, items: requests.length };
  },
};
