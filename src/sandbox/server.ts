import { createHash } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { z } from 'zod';
import {
  baseUrl,
  checkBind,
  httpGuard,
  type Refusal,
  requestTarget,
  sendRefusal,
} from '../util/http-guard.js';
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
import {
  RUN_CODE_LANGUAGES,
  RunCodeRequestSchema,
  type RunCodeResponse,
  sandboxError,
  toRunCodeResponse,
  toRunRequestFromRunCode,
} from './sandboxfusion.js';
import type { CodeRunner, RunRequest, RunResult } from './types.js';

// The sandbox HTTP service: code-judge-compatible routes (so the reference's client works unchanged),
// SandboxFusion's `/run_code` (so verl's sandbox tool does too) and a native API returning full
// RunResults. Every admitted item gets exactly one result: it runs,
// or it is answered `queue_timeout` the moment its queue deadline passes, or `internal_error` on
// shutdown. Admission is bounded (busy → 503 + JSON) and the queue is round-robin across clients so
// one trainer's 45K-call burst cannot starve another's. Every request passes the shared guard
// (util/http-guard.ts: Host, Origin, optional token) first.

export interface SandboxServerOptions {
  runner: CodeRunner;
  port?: number; // 0 = any free port
  host?: string; // default 127.0.0.1; anything but loopback needs `token`
  /** Bearer token required on every route but /ping (at least 16 characters). */
  token?: string;
  /** Items handed to the runner at once (its slot count; more only queues inside the runner). */
  concurrency?: number;
  /** Items allowed to wait; a request that would exceed it is refused whole with 503. */
  maxQueue?: number;
  /** Queue deadline for /run, /judge and the short batches (code-judge MAX_QUEUE_WORK_LIFE_TIME). */
  shortQueueWaitMs?: number;
  /** Queue deadline for long batches and the native API. */
  longQueueWaitMs?: number;
  /** SandboxFusion `executor_pod_name` in /run_code answers; default $MY_POD_NAME (as SandboxFusion), else null. */
  podName?: string | null;
  /** One request body at most (413 past it). */
  maxBodyBytes?: number;
  /** Request bodies being received at once, all requests together (503 past it). */
  maxBodyBytesInFlight?: number;
  /** Time allowed to receive a whole request, headers and body (Node's requestTimeout). */
  requestTimeoutMs?: number;
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
  /** Queue deadline (epoch ms; Infinity = none). */
  deadline: number;
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
        deadline: Date.now() + queueWaitMs,
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
        .run(withDeadline(item))
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

/** A runner may queue too (Redis: until a worker takes the item), so the rest of the deadline goes
 * with the item; a tighter queueTimeoutMs the client asked for (native API) is kept. */
function withDeadline(item: Item): RunRequest {
  if (!Number.isFinite(item.deadline)) return item.req;
  const left = Math.max(1, item.deadline - Date.now());
  const asked = item.req.queueTimeoutMs || Number.POSITIVE_INFINITY;
  return { ...item.req, queueTimeoutMs: Math.min(left, asked) };
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

// /v1/ping: SandboxFusion's health probe (its server answers the JSON string "pong" there)
const GET_ROUTES = ['/ping', '/v1/ping', '/status', '/metrics'];

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
    Omit<
      SandboxServerOptions,
      'numWorkers' | 'backlog' | 'log' | 'memoryMb' | 'codeJudge' | 'token' | 'podName'
    >
  > &
    SandboxServerOptions;
  private readonly log: (rec: Record<string, unknown>) => void;
  private responding = 0;
  private bodyBytesInFlight = 0;
  private readonly guard: (req: IncomingMessage, url: URL) => Refusal | null;

  constructor(opts: SandboxServerOptions) {
    this.o = {
      port: 8088,
      host: '127.0.0.1',
      concurrency: 64,
      maxQueue: 100_000,
      shortQueueWaitMs: 4000,
      longQueueWaitMs: 3_600_000,
      maxBodyBytes: 64 << 20,
      maxBodyBytesInFlight: 128 << 20,
      requestTimeoutMs: 30_000,
      maxCodeBytes: 1 << 20,
      timeoutMs: 4000,
      logRequests: true,
      ...opts,
    };
    checkBind(this.o.host, this.o.token, 'sandbox service');
    if (this.o.maxBodyBytesInFlight < this.o.maxBodyBytes)
      throw new Error('maxBodyBytesInFlight must be at least maxBodyBytes, or the largest bodies never fit');
    // A liveness probe needs no secret, and "pong" tells nothing.
    this.guard = httpGuard({
      host: this.o.host,
      token: this.o.token,
      open: (p) => p === '/ping' || p === '/v1/ping',
    });
    this.log =
      opts.log ??
      ((rec) => process.stderr.write(`${JSON.stringify({ time: new Date().toISOString(), ...rec })}\n`));
    this.metrics = new ServiceMetrics(
      () => ({
        queueDepth: this.scheduler.depth,
        inFlight: this.scheduler.inFlight,
        clients: this.scheduler.clientsWaiting,
      }),
      new Set([...GET_ROUTES, ...Object.keys(ROUTES)]),
    );
    this.scheduler = new FairScheduler(this.o.runner, this.o.concurrency, this.o.maxQueue, (r, ms) =>
      this.metrics.item(r.status, ms),
    );
    const requestTimeout = this.o.requestTimeoutMs;
    const timeouts = {
      requestTimeout,
      headersTimeout: Math.min(requestTimeout, 10_000),
      // Node checks the deadlines at this interval (30 s by default, which would double a 30 s limit).
      connectionsCheckingInterval: Math.max(50, Math.min(1000, requestTimeout / 4)),
    };
    this.http = createServer(timeouts, (req, res) => {
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
    return { port, url: baseUrl(this.o.host, port) };
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

  /** Reads a JSON body within the per-request and all-requests byte limits. Bytes are reserved from
   * the in-flight budget before they arrive (content-length) or as they arrive (chunked) and given
   * back once parsed; a refused body is drained unread, so the client still gets the answer. */
  private readBody(req: IncomingMessage): Promise<unknown> {
    const max = this.o.maxBodyBytes;
    const cap = this.o.maxBodyBytesInFlight;
    const tooBig = (n: number) =>
      new HttpError(413, `request body is ${n} bytes, over the ${max}-byte limit per request`);
    const busy = () =>
      new HttpError(
        503,
        `busy: ${this.bodyBytesInFlight} bytes of request bodies are being received, limit ${cap}; retry later`,
      );
    const declared = Number(req.headers['content-length']);
    if (declared > max) return Promise.reject(tooBig(declared));
    let held = Number.isInteger(declared) ? declared : 0;
    if (this.bodyBytesInFlight + held > cap) return Promise.reject(busy());
    this.bodyBytesInFlight += held;
    const release = () => {
      this.bodyBytesInFlight -= held;
      held = 0;
    };
    return new Promise((resolve, reject) => {
      const chunks: Buffer[] = [];
      let size = 0;
      let failed = false;
      const fail = (e: Error) => {
        failed = true;
        chunks.length = 0;
        release();
        reject(e);
      };
      req.on('data', (c: Buffer) => {
        if (failed) return;
        size += c.length;
        if (size > max) return fail(tooBig(size));
        if (size > held) {
          if (this.bodyBytesInFlight + size - held > cap) return fail(busy());
          this.bodyBytesInFlight += size - held;
          held = size;
        }
        chunks.push(c);
      });
      req.on('error', (e) => fail(e));
      req.on('close', release);
      req.on('end', () => {
        if (failed) return;
        const text = Buffer.concat(chunks).toString('utf8');
        chunks.length = 0;
        try {
          resolve(JSON.parse(text));
        } catch (e) {
          reject(new HttpError(400, `malformed JSON body: ${(e as Error).message}`));
        } finally {
          release();
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
      const target = requestTarget(req.url ?? '/');
      if (!target) throw new HttpError(400, 'malformed request target');
      const refusal = this.guard(req, target);
      if (refusal) {
        status = refusal.status;
        return sendRefusal(res, refusal);
      }
      this.metrics.request(url);
      if (req.method === 'GET') {
        if (url === '/ping' || url === '/v1/ping') return this.send(res, 200, 'pong');
        if (url === '/status') {
          // Remote counts (Redis) must not hang the health check when the backend is down: -1 = unknown.
          const numWorkers = this.o.numWorkers ? await bounded(this.o.numWorkers(), -1) : this.o.concurrency;
          const backlog = this.o.backlog ? Math.max(0, await bounded(this.o.backlog(), 0)) : 0;
          // exactly code-judge's fields: its client builds ServerStatus(**json), which refuses any other key
          // (items running now are on /metrics: rstar2_sandbox_in_flight)
          return this.send(res, 200, { queue: this.scheduler.depth + backlog, num_workers: numWorkers });
        }
        if (url === '/metrics')
          return this.send(res, 200, await this.metrics.render(), {
            'content-type': this.metrics.contentType,
          });
        throw new HttpError(404, `no route GET ${url}`);
      }
      if (req.method !== 'POST') throw new HttpError(405, `method ${req.method} not allowed`);
      const route = ROUTES[url];
      if (!route) throw new HttpError(404, `no route POST ${url}`);
      const body = await this.readBody(req);
      const sessionKey = req.headers['x-rstar2-session-key'];
      const out = await route(
        this,
        { client, sessionKey: typeof sessionKey === 'string' ? sessionKey : undefined },
        body,
      );
      items = out.items;
      if (out.busy) {
        status = 503;
        this.metrics.rejectedBusy();
        return this.send(res, 503, out.body, { 'retry-after': '1' });
      }
      status = out.status ?? 200;
      return this.send(res, status, out.body, status === 504 ? { 'retry-after': '1' } : {});
    } catch (e) {
      if (!(e instanceof HttpError)) throw e;
      status = e.status;
      this.send(
        res,
        e.status,
        { error: e.message, detail: e.detail },
        e.status === 503 ? { 'retry-after': '1' } : {},
      );
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

  /** executor_pod_name for /run_code answers. */
  get podName(): string | null {
    return this.o.podName === undefined ? (process.env.MY_POD_NAME ?? null) : this.o.podName;
  }
}

/** busy: refused at admission (503); status: another HTTP status than 200 for the answer. */
type RouteResult = { body: unknown; items: number; busy?: boolean; status?: number };
/** client: the fair-queue key; sessionKey: the x-rstar2-session-key header. */
type Ctx = { client: string; sessionKey?: string };
type Route = (s: SandboxServer, ctx: Ctx, body: unknown) => Promise<RouteResult>;

const SESSION_ID = /^[\x21-\x7e]{1,200}$/;

/** The runner's name for a client's session. Session ids are chosen by clients and easy to guess,
 * so the runner sees a digest of (session key, id): only a holder of the same key reaches it. */
function sessionName(key: string | undefined, id: string): string {
  if (key === undefined || key.length < 16)
    throw new HttpError(
      400,
      'stateful sessions need an x-rstar2-session-key header of at least 16 characters: a secret of your own that keeps your sessions private (SandboxClient sends one)',
    );
  return createHash('sha256').update(key).update('\0').update(id).digest('base64url');
}

/** Runs native requests, each session id mapped to its private name and back in the results. */
async function runNative(s: SandboxServer, ctx: Ctx, reqs: RunRequest[]): Promise<RunResult[] | null> {
  const items = reqs.map((r) => {
    if (r.session === undefined) return s.checkItem(r);
    if (!SESSION_ID.test(r.session))
      return failedResult('invalid_input', 'session must be 1-200 printable ASCII characters without spaces');
    return s.checkItem({ ...r, session: sessionName(ctx.sessionKey, r.session) });
  });
  const results = await s.runItems(ctx.client, items, s.options.longQueueWaitMs);
  return (
    results?.map((r, i) => {
      const it = items[i];
      const id = reqs[i].session;
      if (!('code' in it) || it.session === undefined || id === undefined || r.error === undefined) return r;
      return { ...r, error: r.error.replaceAll(it.session, id) };
    }) ?? null
  );
}

function codeJudgeSingle(judge: boolean): Route {
  return async (s, { client }, body) => {
    const sub = s.parse(SubmissionSchema, body);
    const results = await s.runItems(client, [s.submissionItem(sub)], s.options.shortQueueWaitMs);
    if (!results) return { body: s.busyBody(1), items: 1, busy: true };
    const r = toSubmissionResult(sub, results[0], s.options.codeJudge);
    return { body: judge ? toJudgeResult(r) : r, items: 1 };
  };
}

function codeJudgeBatch(judge: boolean, long: boolean): Route {
  return async (s, { client }, body) => {
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

/** Seconds of verl's client timeout (compile_timeout + run_timeout + API_TIMEOUT 10 s) kept for
 * queueing besides compile_timeout, which Python never uses; the rest is margin for the answer. */
const RUN_CODE_QUEUE_SLACK_S = 5;

/** SandboxFusion's POST /run_code (Python only); see sandboxfusion.ts and docs/DECISIONS.md. */
const runCode: Route = async (s, { client }, body) => {
  const req = s.parse(RunCodeRequestSchema, body);
  const pod = s.podName;
  if (!RUN_CODE_LANGUAGES.has(req.language))
    return {
      body: sandboxError(
        `language '${req.language}' is not supported by this sandbox (it runs ${[...RUN_CODE_LANGUAGES].join(', ')} only)`,
        pod,
      ),
      items: 0,
    };
  const defaults: Partial<RunRequest> = {};
  if (s.options.memoryMb) defaults.memoryMb = s.options.memoryMb;
  const item = s.checkItem(toRunRequestFromRunCode(req, defaults));
  // Started in time for the answer to reach verl's client before its own request timeout.
  const wait = Math.min(s.options.longQueueWaitMs, (req.compile_timeout + RUN_CODE_QUEUE_SLACK_S) * 1000);
  const results = await s.runItems(client, [item], wait);
  if (!results) {
    const busy = s.busyBody(1) as { message: string };
    return { body: sandboxError(`busy: ${busy.message}`, pod), items: 1, busy: true };
  }
  const r = results[0];
  const out: RunCodeResponse = toRunCodeResponse(r, pod);
  // A gateway's 504 is what verl retries (call_sandbox_api: up to 3 tries); the item never started.
  return { body: out, items: 1, status: r.status === 'queue_timeout' ? 504 : 200 };
};

const ROUTES: Record<string, Route> = {
  '/run': codeJudgeSingle(false),
  '/judge': codeJudgeSingle(true),
  '/run/batch': codeJudgeBatch(false, false),
  '/judge/batch': codeJudgeBatch(true, false),
  '/run/long-batch': codeJudgeBatch(false, true),
  '/judge/long-batch': codeJudgeBatch(true, true),
  '/run_code': runCode,
  '/v1/run': async (s, ctx, body) => {
    const req = s.parse(RunRequestSchema, body);
    const results = await runNative(s, ctx, [req]);
    if (!results) return { body: s.busyBody(1), items: 1, busy: true };
    return { body: results[0], items: 1 };
  },
  '/v1/session/close': async (s, ctx, body) => {
    const { session } = s.parse(CloseSessionSchema, body);
    if (!s.options.runner.closeSession) throw new HttpError(501, 'this backend has no stateful sessions');
    const closed = await s.options.runner.closeSession(sessionName(ctx.sessionKey, session));
    return { body: { session, closed }, items: 0 };
  },
  '/v1/batch': async (s, ctx, body) => {
    const { requests } = s.parse(NativeBatchSchema, body);
    const results = await runNative(s, ctx, requests);
    if (!results) return { body: s.busyBody(requests.length), items: requests.length, busy: true };
    return { body: { results }, items: requests.length };
  },
};
