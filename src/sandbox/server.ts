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
import type { PoolStats } from './pool.js';
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
  /** Bytes of request bodies received and not yet parsed, all requests together. Charged as bytes arrive; when a
   * chunk does not fit, the body holding the most is refused with 503 (its connection's share is spent). */
  maxBodyBytesInFlight?: number;
  /** Time allowed to receive a whole request, headers and body (Node's requestTimeout). */
  requestTimeoutMs?: number;
  /** A body that sends nothing for this long is cut with 408 (default 10 s, at most requestTimeoutMs). */
  bodyIdleTimeoutMs?: number;
  /** Items in one request at most (413 past it, as soon as the body has shown that many). */
  maxBatchItems?: number;
  /** JSON structure one body may hold: its brackets, commas and colons, counted as it arrives (413 past it). Parsing
   * costs by that count, not by bytes: a million empty items blocked the event loop for seconds. */
  maxBodyTokens?: number;
  /** Output (stdout, stderr, fetched files; as the answer's JSON) one answer carries: the items that finish after
   * it is full are answered without their output, flagged `truncated` and saying why. */
  maxBatchOutputBytes?: number;
  /** Output held by all answers still being assembled or sent; past it the answer holding the most gives up its
   * items' output first (default 4 x maxBatchOutputBytes). */
  maxOutputBytesHeld?: number;
  /** Live stateful sessions one client may hold, whatever session keys it sends; a client is the peer address of
   * its connection (see clientOf); 0 = no limit of its own. */
  maxSessionsPerClient?: number;
  /** How long an idle session counts against its client (the runner's session TTL). */
  sessionTtlMs?: number;
  maxCodeBytes?: number;
  /** Wall limit applied to code-judge submissions (its MAX_EXECUTION_TIME; rStar2 uses 4 s). */
  timeoutMs?: number;
  memoryMb?: number;
  codeJudge?: CodeJudgeOptions;
  /** num_workers for GET /status; default: concurrency. */
  numWorkers?: () => number | Promise<number>;
  /** Items waiting beyond this server (e.g. on Redis), added to /status `queue`. */
  backlog?: () => number | Promise<number>;
  /** Each sandbox shard's pool counts, for /metrics (ShardedPool.shardStats). */
  shardStats?: () => PoolStats[];
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
export class FairQueue {
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

/** Something holding bytes of a shared budget: a body being received, an answer being assembled. */
interface Holder {
  bytes: number;
}
interface BodyHold extends Holder {
  refuse: (e: Error) => void;
}

/** Makes room for `n` more bytes of `self` under `cap`, evicting the other holder that holds the most while it
 * holds more than `self` would; false when `self` would hold the most (its own bytes are the ones to refuse). */
function makeRoom<H extends Holder>(
  holders: Iterable<H>,
  self: H,
  n: number,
  used: () => number,
  cap: number,
  evict: (h: H) => void,
): boolean {
  while (used() + n > cap) {
    let largest: H | undefined;
    for (const h of holders) if (h !== self && (!largest || h.bytes > largest.bytes)) largest = h;
    if (!largest || largest.bytes <= self.bytes + n) return false;
    evict(largest);
  }
  return true;
}

/** The output held by every answer being assembled or sent. */
class OutputHeld {
  total = 0;
  readonly answers = new Set<Answer<unknown>>();
  constructor(readonly cap: number) {}
}

/** Items' outputs under this size are not worth taking back from an answer that must give up its output. */
const SHED_MIN = 4096;

/** What `v` adds to its answer's JSON: exact where it holds real output, else a bound (each character of its
 * strings escaped as \u00XX, 6 bytes, plus its fields), cheaper than serialising every trivial result twice. */
function jsonSize(v: unknown): number {
  let chars = 0;
  for (const x of Object.values(v as object)) {
    if (typeof x === 'string') chars += x.length;
    else if (typeof x === 'object' && x !== null) return JSON.stringify(v).length;
  }
  return chars < 1024 ? 6 * chars + 512 : JSON.stringify(v).length;
}

/** A result without its output, saying why: what an item is answered with when its answer has no room left. */
function withoutOutput(r: RunResult, why: string): RunResult {
  const { files: _files, ...rest } = r;
  const note = `output dropped: ${why}`;
  return {
    ...rest,
    stdout: '',
    stderr: note,
    truncated: true,
    error: r.error ? `${r.error}; ${note}` : note,
  };
}

/** One request's answer, assembled as its items finish: each result is shaped for the route at once (code-judge
 * cuts it to 1000 characters), so a batch never holds its items' full outputs, and what it keeps is counted
 * against the answer's own limit and against the output all answers together may hold. */
class Answer<T> {
  bytes = 0;
  readonly results: T[];
  /** items holding output that could be given back: index -> the result without it, and the size it holds */
  private readonly shedable = new Map<number, { bare: RunResult; size: number }>();

  constructor(
    private readonly shape: (r: RunResult, i: number) => T,
    n: number,
    private readonly limit: number,
    private readonly held: OutputHeld,
  ) {
    this.results = new Array<T>(n);
    held.answers.add(this as Answer<unknown>);
  }

  put(i: number, r: RunResult): void {
    let v = this.shape(r, i);
    let size = jsonSize(v);
    let why = '';
    if (this.bytes + size > this.limit)
      why = `this request's answer already holds ${this.bytes} bytes of output, its limit (maxBatchOutputBytes ${this.limit}); send fewer items per request`;
    else if (!this.roomFor(size))
      why = `the service holds ${this.held.total} bytes of output for answers being assembled or sent, its limit (maxOutputBytesHeld ${this.held.cap}), and this answer holds the most`;
    if (why) {
      v = this.shape(withoutOutput(r, why), i);
      size = jsonSize(v);
    } else if (size > SHED_MIN) {
      const { files: _files, ...bare } = r; // kept without its output, which the answer already holds
      this.shedable.set(i, { bare: { ...bare, stdout: '', stderr: '' }, size });
    }
    this.results[i] = v;
    this.bytes += size;
    this.held.total += size;
  }

  private roomFor(n: number): boolean {
    const held = this.held;
    return makeRoom(
      held.answers,
      this as Answer<unknown>,
      n,
      () => held.total,
      held.cap,
      (a) => a.shed(),
    );
  }

  /** Gives back the output of every item that holds some, for another answer's sake. */
  shed(): void {
    const why = `the service needed room for other answers (maxOutputBytesHeld ${this.held.cap}) and this answer held the most output`;
    for (const [i, { bare, size }] of this.shedable) {
      const v = this.shape(withoutOutput(bare, why), i);
      const now = jsonSize(v);
      this.results[i] = v;
      this.bytes += now - size;
      this.held.total += now - size;
    }
    this.shedable.clear();
  }

  /** Once the answer is sent (or its client gone). */
  release(): void {
    this.held.total -= this.bytes;
    this.bytes = 0;
    this.shedable.clear();
    this.held.answers.delete(this as Answer<unknown>);
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
  readonly queue: FairQueue;
  readonly metrics: ServiceMetrics;
  private readonly http: Server;
  private readonly o: Required<
    Omit<
      SandboxServerOptions,
      | 'numWorkers'
      | 'backlog'
      | 'log'
      | 'memoryMb'
      | 'codeJudge'
      | 'token'
      | 'podName'
      | 'bodyIdleTimeoutMs'
      | 'maxOutputBytesHeld'
      | 'shardStats'
    >
  > &
    SandboxServerOptions;
  private readonly log: (rec: Record<string, unknown>) => void;
  private responding = 0;
  private bodyBytesInFlight = 0;
  /** bodies being received, each with the bytes it holds and how to refuse it */
  private readonly bodies = new Set<BodyHold>();
  private readonly bodyIdleMs: number;
  private readonly held: OutputHeld;
  /** live sessions per client (peer address): runner-side name -> last used (ms) */
  private readonly sessionsByClient = new Map<string, Map<string, number>>();
  private readonly sessionSweep: NodeJS.Timeout;
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
      maxBatchItems: 4096,
      maxBodyTokens: 1 << 18,
      maxBatchOutputBytes: 64 << 20,
      maxSessionsPerClient: 4,
      sessionTtlMs: 300_000,
      maxCodeBytes: 1 << 20,
      timeoutMs: 4000,
      logRequests: true,
      ...opts,
    };
    checkBind(this.o.host, this.o.token, 'sandbox service');
    if (this.o.maxBodyBytesInFlight < this.o.maxBodyBytes)
      throw new Error('maxBodyBytesInFlight must be at least maxBodyBytes, or the largest bodies never fit');
    for (const k of ['maxBatchItems', 'maxBatchOutputBytes', 'maxBodyTokens'] as const)
      if (!Number.isInteger(this.o[k]) || this.o[k] <= 0) throw new Error(`${k} must be a positive integer`);
    this.bodyIdleMs = Math.min(opts.bodyIdleTimeoutMs ?? 10_000, this.o.requestTimeoutMs);
    const heldCap = opts.maxOutputBytesHeld ?? 4 * this.o.maxBatchOutputBytes;
    if (heldCap < this.o.maxBatchOutputBytes)
      throw new Error('maxOutputBytesHeld must be at least maxBatchOutputBytes');
    this.held = new OutputHeld(heldCap);
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
        queueDepth: this.queue.depth,
        inFlight: this.queue.inFlight,
        clients: this.queue.clientsWaiting,
      }),
      new Set([...GET_ROUTES, ...Object.keys(ROUTES)]),
      opts.shardStats,
    );
    this.queue = new FairQueue(this.o.runner, this.o.concurrency, this.o.maxQueue, (r, ms) =>
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
    // keys that never come back would keep their expired sessions' names
    this.sessionSweep = setInterval(() => {
      for (const [peer, live] of this.sessionsByClient) {
        this.expireSessions(live);
        if (live.size === 0) this.sessionsByClient.delete(peer);
      }
    }, 60_000);
    this.sessionSweep.unref();
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
    clearInterval(this.sessionSweep);
    this.queue.close();
    this.http.closeIdleConnections?.();
    const t0 = Date.now();
    while ((this.queue.inFlight > 0 || this.responding > 0) && Date.now() - t0 < graceMs)
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

  /** Reads a JSON body within the per-request and all-requests byte limits. A body is charged for the bytes it
   * has sent, not those it declares, so a client that declares much and sends nothing holds nothing. When a
   * chunk does not fit, the body holding the most is refused (503): each connection keeps its share, and one
   * that takes more than the others loses it first. A body that stalls for bodyIdleTimeoutMs is cut (408).
   * A refused body is drained unread, so the client still gets the answer. Its items (batch routes) and its JSON
   * structure are counted as it arrives (JsonCount), so a body past maxBatchItems or maxBodyTokens is refused
   * before any of it is parsed. */
  private readBody(req: IncomingMessage, res: ServerResponse, batch: boolean): Promise<unknown> {
    const max = this.o.maxBodyBytes;
    const tooBig = (n: number) =>
      new HttpError(413, `request body is ${n} bytes, over the ${max}-byte limit per request`);
    const declared = Number(req.headers['content-length']);
    if (declared > max) return Promise.reject(tooBig(declared));
    return new Promise((resolve, reject) => {
      const chunks: Buffer[] = [];
      const count = new JsonCount();
      let size = 0;
      let idle: NodeJS.Timeout | undefined;
      const hold: BodyHold = { bytes: 0, refuse: (e) => fail(e) };
      this.bodies.add(hold);
      const release = () => {
        this.bodyBytesInFlight -= hold.bytes;
        hold.bytes = 0;
        this.bodies.delete(hold);
        clearTimeout(idle);
      };
      let failed = false;
      const fail = (e: Error) => {
        if (failed) return;
        failed = true;
        chunks.length = 0;
        release();
        reject(e);
      };
      const stalled = () => {
        // the rest of this body will not be read: the connection closes once the answer is out
        res.setHeader('connection', 'close');
        fail(new HttpError(408, `request body stalled: nothing received for ${this.bodyIdleMs} ms`));
      };
      const watch = () => {
        clearTimeout(idle);
        idle = setTimeout(stalled, this.bodyIdleMs);
      };
      watch();
      req.on('data', (c: Buffer) => {
        if (failed) return;
        watch();
        size += c.length;
        if (size > max) return fail(tooBig(size));
        if (!this.charge(hold, c.length)) return fail(this.bodiesBusy());
        count.add(c);
        if (batch && count.items > this.o.maxBatchItems)
          return fail(this.tooManyItems(`at least ${count.items}`));
        if (count.tokens > this.o.maxBodyTokens)
          return fail(
            new HttpError(
              413,
              `request body holds over ${this.o.maxBodyTokens} JSON brackets, commas and colons (maxBodyTokens); send fewer or smaller items per request`,
            ),
          );
        chunks.push(c);
      });
      req.on('error', (e) => fail(e));
      req.on('close', release);
      req.on('end', () => {
        if (failed) return;
        const text = Buffer.concat(chunks).toString('utf8');
        chunks.length = 0;
        release();
        try {
          resolve(JSON.parse(text));
        } catch (e) {
          reject(new HttpError(400, `malformed JSON body: ${(e as Error).message}`));
        }
      });
    });
  }

  private bodiesBusy(): HttpError {
    return new HttpError(
      503,
      `busy: ${this.bodyBytesInFlight} bytes of request bodies are being received, limit ${this.o.maxBodyBytesInFlight}, and this one holds the most; retry later`,
    );
  }

  /** Charges `n` more bytes to `hold`, refusing larger holders while they stand in the way; false when `hold`
   * would itself hold the most (it is the one to refuse). */
  private charge(hold: BodyHold, n: number): boolean {
    const cap = this.o.maxBodyBytesInFlight;
    const used = () => this.bodyBytesInFlight;
    if (!makeRoom(this.bodies, hold, n, used, cap, (b) => b.refuse(this.bodiesBusy()))) return false;
    hold.bytes += n;
    this.bodyBytesInFlight += n;
    return true;
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
          // Remote counts (Redis) must not hang the health check when Redis is down: -1 = unknown.
          const numWorkers = this.o.numWorkers ? await bounded(this.o.numWorkers(), -1) : this.o.concurrency;
          const backlog = this.o.backlog ? Math.max(0, await bounded(this.o.backlog(), 0)) : 0;
          // exactly code-judge's fields: its client builds ServerStatus(**json), which refuses any other key
          // (items running now are on /metrics: rstar2_sandbox_in_flight)
          return this.send(res, 200, { queue: this.queue.depth + backlog, num_workers: numWorkers });
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
      const body = await this.readBody(req, res, BATCH_ROUTES.has(url));
      const sessionKey = req.headers['x-rstar2-session-key'];
      const answers: Answer<unknown>[] = [];
      res.on('close', () => {
        for (const a of answers) a.release();
      });
      const out = await route(
        this,
        {
          client,
          peer: clientOf(req),
          sessionKey: typeof sessionKey === 'string' ? sessionKey : undefined,
          answers,
        },
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

  /** Runs items through the fair queue, each result shaped for the route as it arrives and held within the
   * answer's output limits (see Answer); null when admission refuses the whole request. */
  async runItems<T>(
    ctx: Ctx,
    reqs: (RunRequest | RunResult)[],
    queueWaitMs: number,
    shape: (r: RunResult, i: number) => T,
  ): Promise<T[] | null> {
    if (reqs.length > this.o.maxBatchItems) throw this.tooManyItems(String(reqs.length));
    const runnable = reqs.filter((r) => 'code' in r).length;
    if (!this.queue.canAdmit(runnable)) return null;
    const answer = new Answer(shape, reqs.length, this.o.maxBatchOutputBytes, this.held);
    ctx.answers.push(answer as Answer<unknown>);
    await Promise.all(
      reqs.map((r, i) =>
        ('code' in r ? this.queue.submit(ctx.client, r, queueWaitMs) : Promise.resolve(r)).then((res) =>
          answer.put(i, res),
        ),
      ),
    );
    return answer.results;
  }

  tooManyItems(n: string): HttpError {
    return new HttpError(
      413,
      `request has ${n} items, over the limit of ${this.o.maxBatchItems} per request (maxBatchItems, --max-batch-items); split it`,
    );
  }

  /** Counts a session against its client; the result to answer instead when the client holds its limit already. */
  openSession(peer: string, name: string): RunResult | null {
    const limit = this.o.maxSessionsPerClient;
    if (limit === 0) return null;
    const live = this.sessionsByClient.get(peer) ?? new Map<string, number>();
    this.sessionsByClient.set(peer, live);
    this.expireSessions(live);
    if (!live.has(name) && live.size >= limit)
      return failedResult(
        'busy',
        `session limit per client reached: this client (${peer}) holds ${live.size} live sessions, whatever its session keys (limit ${limit}, --max-sessions-per-client); close one or let it expire`,
      );
    live.set(name, Date.now());
    return null;
  }

  /** After a session call: a session the runner lost or never opened no longer counts against its client. */
  sessionAnswered(peer: string, name: string, r: RunResult): void {
    const live = this.sessionsByClient.get(peer);
    if (!live?.has(name)) return;
    if (r.status === 'busy' || /^session \S+ (lost|was closed)/.test(r.error ?? ''))
      this.closedSession(peer, name);
    else live.set(name, Date.now());
  }

  closedSession(peer: string, name: string): void {
    const live = this.sessionsByClient.get(peer);
    live?.delete(name);
    if (live?.size === 0) this.sessionsByClient.delete(peer);
  }

  private expireSessions(live: Map<string, number>): void {
    const before = Date.now() - this.o.sessionTtlMs;
    for (const [name, at] of live) if (at < before) live.delete(name);
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
      message: `queue full: ${this.queue.depth} waiting, limit ${this.o.maxQueue}, request has ${n} items; retry later`,
      queue: this.queue.depth,
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
/** client: the fair-queue key; peer: who holds the request's sessions (clientOf); sessionKey: the
 * x-rstar2-session-key header; answers: those the request assembles, released once its response is sent. */
type Ctx = { client: string; peer: string; sessionKey?: string; answers: Answer<unknown>[] };

/** The client a session quota counts against: the connection's peer address, which a client cannot choose the way
 * it chooses headers (x-rstar2-client, session keys: one client with 4 keys took all 16 sessions). The service's
 * token, where set, is one for every client, so it names none. Every process on one host is one client. */
function clientOf(req: IncomingMessage): string {
  const a = req.socket.remoteAddress ?? 'unknown';
  return a.startsWith('::ffff:') ? a.slice(7) : a;
}

/** Counts, as a JSON body arrives and before it is parsed, its structural characters outside strings ({ [ , :)
 * and the elements of the arrays directly inside its top-level object (a batch's items). */
class JsonCount {
  tokens = 0;
  items = 0;
  private depth = 0;
  private inString = false;
  private escaped = false;
  /** whether the container at depth 2 is an array that has shown an element */
  private inItems = false;
  private itemsOpen = false;

  add(c: Buffer): void {
    for (let i = 0; i < c.length; i++) {
      const b = c[i];
      if (this.inString) {
        if (this.escaped) this.escaped = false;
        else if (b === 0x5c) this.escaped = true;
        else if (b === 0x22) this.inString = false;
        continue;
      }
      if (b === 0x20 || b === 0x0a || b === 0x0d || b === 0x09) continue;
      if (this.itemsOpen && this.depth === 2) {
        // the first thing after `[` at depth 2 that is not `]` starts the first item
        this.itemsOpen = false;
        if (b !== 0x5d) this.items++;
      }
      if (b === 0x22) this.inString = true;
      else if (b === 0x7b || b === 0x5b) {
        this.tokens++;
        this.depth++;
        if (this.depth === 2) this.itemsOpen = this.inItems = b === 0x5b;
      } else if (b === 0x7d || b === 0x5d) this.depth--;
      else if (b === 0x2c || b === 0x3a) {
        this.tokens++;
        if (b === 0x2c && this.depth === 2 && this.inItems) this.items++;
      }
    }
  }
}
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

/** Runs native requests, each session id mapped to its private name and back in the results, and counted
 * against its client's session key. */
async function runNative(s: SandboxServer, ctx: Ctx, reqs: RunRequest[]): Promise<RunResult[] | null> {
  const items = reqs.map((r) => {
    if (r.session === undefined) return s.checkItem(r);
    if (!SESSION_ID.test(r.session))
      return failedResult('invalid_input', 'session must be 1-200 printable ASCII characters without spaces');
    const name = sessionName(ctx.sessionKey, r.session);
    return s.openSession(ctx.peer, name) ?? s.checkItem({ ...r, session: name });
  });
  return s.runItems(ctx, items, s.options.longQueueWaitMs, (r, i) => {
    const it = items[i];
    const id = reqs[i].session;
    if (!('code' in it) || it.session === undefined || id === undefined) return r;
    s.sessionAnswered(ctx.peer, it.session, r);
    return r.error === undefined ? r : { ...r, error: r.error.replaceAll(it.session, id) };
  });
}

function codeJudgeSingle(judge: boolean): Route {
  return async (s, ctx, body) => {
    const sub = s.parse(SubmissionSchema, body);
    const results = await s.runItems(ctx, [s.submissionItem(sub)], s.options.shortQueueWaitMs, (r) => {
      const out = toSubmissionResult(sub, r, s.options.codeJudge);
      return judge ? toJudgeResult(out) : out;
    });
    if (!results) return { body: s.busyBody(1), items: 1, busy: true };
    return { body: results[0], items: 1 };
  };
}

function codeJudgeBatch(judge: boolean, long: boolean): Route {
  return async (s, ctx, body) => {
    const batch = s.parse(BatchSubmissionSchema, body);
    const subs = batch.submissions;
    const wait = long ? s.options.longQueueWaitMs : s.options.shortQueueWaitMs;
    // each result is cut to code-judge's 1000 characters as it arrives, not once the whole batch is in
    const results = await s.runItems(
      ctx,
      subs.map((x) => s.submissionItem(x)),
      wait,
      (r, i) => {
        const out = toSubmissionResult(subs[i], r, s.options.codeJudge);
        return judge ? toJudgeResult(out) : out;
      },
    );
    if (!results) return { body: s.busyBody(subs.length), items: subs.length, busy: true };
    return { body: { sub_id: batch.sub_id ?? crypto.randomUUID(), results }, items: subs.length };
  };
}

const CloseSessionSchema = z.object({ session: z.string().min(1) });

/** Seconds of verl's client timeout (compile_timeout + run_timeout + API_TIMEOUT 10 s) kept for
 * queueing besides compile_timeout, which Python never uses; the rest is margin for the answer. */
const RUN_CODE_QUEUE_SLACK_S = 5;

/** SandboxFusion's POST /run_code (Python only); see sandboxfusion.ts and docs/DECISIONS.md. */
const runCode: Route = async (s, ctx, body) => {
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
  const results = await s.runItems(ctx, [item], wait, (r) => r);
  if (!results) {
    const busy = s.busyBody(1) as { message: string };
    return { body: sandboxError(`busy: ${busy.message}`, pod), items: 1, busy: true };
  }
  const r = results[0];
  const out: RunCodeResponse = toRunCodeResponse(r, pod);
  // A gateway's 504 is what verl retries (call_sandbox_api: up to 3 tries); the item never started.
  return { body: out, items: 1, status: r.status === 'queue_timeout' ? 504 : 200 };
};

/** Routes whose body is a list of items, counted as it arrives (JsonCount). */
const BATCH_ROUTES = new Set([
  '/run/batch',
  '/judge/batch',
  '/run/long-batch',
  '/judge/long-batch',
  '/v1/batch',
]);

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
    if (!s.options.runner.closeSession) throw new HttpError(501, 'this runner has no stateful sessions');
    const name = sessionName(ctx.sessionKey, session);
    const closed = await s.options.runner.closeSession(name);
    s.closedSession(ctx.peer, name);
    return { body: { session, closed }, items: 0 };
  },
  '/v1/batch': async (s, ctx, body) => {
    const { requests } = s.parse(NativeBatchSchema, body);
    const results = await runNative(s, ctx, requests);
    if (!results) return { body: s.busyBody(requests.length), items: requests.length, busy: true };
    return { body: { results }, items: requests.length };
  },
};
