// SandboxPool: a warm, isolated Python executor pool. One bubblewrap sandbox per pool runs a broker
// (talks to us over one pipe, binary frames, pipelined) and a clean zygote that forks a fresh child
// per call. See python/sandbox/zygote.py for the layers applied to each child.
import { type ChildProcess, spawn } from 'node:child_process';
import { closeSync } from 'node:fs';
import { availableParallelism, constants as osConstants } from 'node:os';
import { findPython } from '../util/python.js';
import {
  findBwrap,
  type IsolationMode,
  oomKillCount,
  openFilesHardLimit,
  pidsLimit,
  planLaunch,
} from './isolation.js';
import {
  type CodeRunner,
  failedResult as emptyResult,
  MODULE_NAME,
  type RunRequest,
  type RunResult,
  type RunStatus,
} from './types.js';

export interface SandboxPoolOptions {
  /** concurrent calls (one scratch dir and uid each); default 4 x cores, at most 512 */
  slots?: number;
  /** default wall-clock limit per call */
  timeoutMs?: number;
  /** largest timeoutMs a request may ask for */
  maxTimeoutMs?: number;
  /** default memory limit per call: RLIMIT_AS per process, and (as root) the resident memory of all of a
   * call's processes together; 0 = none */
  memoryMb?: number;
  /** largest memoryMb a request may ask for (requests cannot ask for none) */
  maxMemoryMb?: number;
  /** bytes kept per stream; more is counted and flagged `truncated` */
  maxOutputBytes?: number;
  /** a call whose stream passes this many bytes is killed with `output_limit` */
  killOutputBytes?: number;
  /** modules the zygote imports once, e.g. ['numpy', 'sympy'] */
  preload?: string[];
  /** 'bwrap' (default). 'none' runs without namespaces or seccomp and warns loudly. */
  isolation?: IsolationMode;
  /** an interpreter under /usr, which is all the sandbox mounts: default RSTAR2_SANDBOX_PYTHON, else
   *  /usr/bin/python3 (never RSTAR2_PYTHON, the worker's, which on GPU machines is a venv with torch) */
  python?: string;
  /** first per-slot uid (root only); slot s runs as uidBase + s */
  uidBase?: number;
  /** RLIMIT_NPROC per slot uid */
  nproc?: number;
  /** RLIMIT_FSIZE */
  fileSizeMb?: number;
  /** size of each slot's scratch tmpfs */
  scratchMb?: number;
  /** files and directories a call may hold in its scratch tmpfs at once (their inodes are kernel memory no
   * size limit counts); a call holding more is killed as `oom`. Checked with the memory, so it needs per-slot
   * uids. */
  scratchFiles?: number;
  /** each slot's share of /dev/shm (sized slots x this): a call holding more is killed as `oom` */
  shmMb?: number;
  /** a call still running after this many ms, whose processes have computed for a tenth of it, runs at nice 19
   * from then on (with autogroups, its session too), so short calls keep the CPU next to busy ones, and an honest
   * long call on a full sandbox waits; a call that only waited (asleep, or for a core on a loaded host) keeps its
   * priority; 0 = never. Needs per-slot uids. */
  demoteAfterMs?: number;
  landlock?: boolean;
  /** calls waiting beyond this many are answered `busy` at once */
  maxQueue?: number;
  /** default for RunRequest.queueTimeoutMs; 0 = wait as long as needed */
  queueTimeoutMs?: number;
  maxCodeBytes?: number;
  maxStdinBytes?: number;
  maxFilesBytes?: number;
  /** a call this long past its deadline, with nothing heard from the broker for as long, is taken for a wedged
   * sandbox, which is restarted (its calls retried); one 12 times as long past it, whatever was heard */
  watchdogGraceMs?: number;
  startTimeoutMs?: number;
  /** live stateful sessions at most (each has its own slot: scratch dir, uid, Landlock domain); 0 = off */
  maxSessions?: number;
  /** a session idle this long is closed; its id then answers "session lost" like a killed one */
  sessionTtlMs?: number;
  /** fork and confine a spare child for every idle slot, so a request only hands it the code; default on */
  prefork?: boolean;
  /** fork children with glibc's fork, skipping CPython's after-fork work (safe in the one-thread zygote;
   * known at-fork hooks are handled, any other keeps os.fork); default on */
  plainFork?: boolean;
  log?: (line: string) => void;
}

type Resolved = Required<Omit<SandboxPoolOptions, 'python' | 'uidBase' | 'log'>> & {
  python: string;
  uidBase?: number;
  log: (line: string) => void;
};

export interface PoolStats {
  queued: number;
  inFlight: number;
  completed: number;
  restarts: number;
  retried: number;
  sessions: number;
  /** 1 where the kernel holds the calls' memory and process limits (a cgroup per slot), 0 where they are polled */
  kernelLimits: number;
}

export interface PoolInfo {
  isolation: IsolationMode;
  slots: number;
  landlock: number;
  uidBase: number;
  /** resident anonymous memory of the zygote after preloading; every call pays for copying its page tables */
  zygoteMb: number;
  /** preload entries that did not import, each with its error */
  preloadFailed: string[];
  /** after how many ms a call is demoted here (0: never, e.g. without per-slot uids or CAP_SYS_NICE), and
   * whether its session's weight is lowered too (autogroups) */
  demoteAfterMs: number;
  demoteSession: boolean;
  /** how the calls' memory and process limits are held: 'cgroup v1' or 'cgroup v2' (by the kernel, a memory and a
   * pids group per slot), or 'polling' (the broker reads /proc every 100 ms; also beside a cgroup) */
  limits: string;
  notes: string[];
}

// Above this the pool says what the zygote's size costs (4.5 MiB bare, ~17 MiB with numpy).
const ZYGOTE_NOTE_MB = 64;

interface Session {
  key: string;
  /** broker-side handle; never reused, so a closed session's late messages cannot hit a new one */
  sid: number;
  busy: boolean;
  queue: Item[];
  lastUsed: number;
}

interface Item {
  session?: Session;
  req: RunRequest;
  frame: Buffer;
  timeoutMs: number;
  memoryMb: number;
  resolve: (r: RunResult) => void;
  attempts: number;
  sentAt: number;
  enqueuedAt: number;
  queueTimer?: NodeJS.Timeout;
}

const FLAG_FETCH = 0x80000000;
const FLAG_SESSION = 0x40000000;
const FLAG_CLOSE = 0x20000000;
const SESSION_ID = /^[\x21-\x7e]{1,200}$/;
const FILE_NAME = /^(?!\.{1,2}$)[A-Za-z0-9._-]{1,128}$/;
const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;
const SETUP_FAILED = '[rstar2-sandbox] setup failed: ';
const SIGNAL_NAMES: Record<number, string> = Object.fromEntries(
  Object.entries(osConstants.signals).map(([name, n]) => [n, name]),
);

export { emptyResult };

/** Where nothing asks for a mode: RSTAR2_SANDBOX_ISOLATION (bwrap or landlock: one setting for every command in
 * a container that refuses namespaces), else bwrap. */
function defaultIsolation(): IsolationMode {
  const v = process.env.RSTAR2_SANDBOX_ISOLATION;
  if (v === undefined || v === '') return 'bwrap';
  if (v !== 'bwrap' && v !== 'landlock') {
    throw new Error(`RSTAR2_SANDBOX_ISOLATION must be bwrap or landlock, got ${JSON.stringify(v)}`);
  }
  return v;
}

/** Open files the sandbox's broker may hold: a call's pipe ends (4) per slot, a socket more per session. */
const openFiles = (slots: number, sessions: number) => 4 * slots + 5 * sessions + 64;

function resolveOptions(o: SandboxPoolOptions): Resolved {
  const cores = availableParallelism();
  const isolation = o.isolation ?? defaultIsolation();
  const maxSessions = o.maxSessions ?? 16;
  const hard = openFilesHardLimit();
  // the default stays within this process's open-file limit (Node raised its soft limit to the hard one at start,
  // and the sandbox inherits both); slots asked for are checked against it below
  const fitting = hard === undefined ? 512 : Math.floor((hard - openFiles(0, maxSessions)) / 4);
  const r: Resolved = {
    slots: o.slots ?? Math.max(1, Math.min(512, cores * 4, fitting)),
    timeoutMs: o.timeoutMs ?? 4000,
    maxTimeoutMs: o.maxTimeoutMs ?? 600_000,
    memoryMb: o.memoryMb ?? 1024,
    maxMemoryMb: o.maxMemoryMb ?? 4096,
    maxOutputBytes: o.maxOutputBytes ?? 1 << 20,
    killOutputBytes: o.killOutputBytes ?? 16 << 20,
    preload: o.preload ?? [],
    isolation,
    python: findPython(o.python, 'RSTAR2_SANDBOX_PYTHON'),
    uidBase: o.uidBase,
    nproc: o.nproc ?? 32,
    fileSizeMb: o.fileSizeMb ?? 16,
    scratchMb: o.scratchMb ?? 64,
    // isolation landlock counts a scratch by listing it every 100 ms (no tmpfs of its own to ask): fewer entries
    scratchFiles: o.scratchFiles ?? (isolation === 'landlock' ? 10_000 : 100_000),
    shmMb: o.shmMb ?? 64,
    demoteAfterMs: o.demoteAfterMs ?? 50,
    landlock: o.landlock ?? true,
    prefork: o.prefork ?? true,
    plainFork: o.plainFork ?? true,
    maxQueue: o.maxQueue ?? 100_000,
    queueTimeoutMs: o.queueTimeoutMs ?? 0,
    maxCodeBytes: o.maxCodeBytes ?? 16 << 20,
    maxStdinBytes: o.maxStdinBytes ?? 16 << 20,
    maxFilesBytes: o.maxFilesBytes ?? 16 << 20,
    watchdogGraceMs: o.watchdogGraceMs ?? 5000,
    startTimeoutMs: o.startTimeoutMs ?? 30_000,
    maxSessions,
    sessionTtlMs: o.sessionTtlMs ?? 300_000,
    log: o.log ?? ((l) => process.stderr.write(`[sandbox] ${l}\n`)),
  };
  const positive = [
    'slots',
    'timeoutMs',
    'maxTimeoutMs',
    'maxMemoryMb',
    'maxOutputBytes',
    'killOutputBytes',
    'nproc',
    'scratchFiles',
  ] as const;
  for (const k of positive) {
    if (!Number.isInteger(r[k]) || r[k] <= 0)
      throw new Error(`SandboxPool option ${k} must be a positive integer`);
  }
  if (r.slots > 1000) throw new Error('SandboxPool option slots must be at most 1000');
  if (!Number.isInteger(r.maxSessions) || r.maxSessions < 0 || r.maxSessions > 500)
    throw new Error('SandboxPool option maxSessions must be an integer in [0, 500]');
  const files = openFiles(r.slots, r.maxSessions);
  if (hard !== undefined && hard < files) {
    throw new Error(
      `SandboxPool: ${r.slots} slots and ${r.maxSessions} sessions need up to ~${files} open files in the sandbox, ` +
        `but this process may open at most ${hard} (ulimit -Hn): raise that limit or use fewer slots`,
    );
  }
  if (!(r.sessionTtlMs > 0)) throw new Error('SandboxPool option sessionTtlMs must be positive');
  if (r.isolation !== 'bwrap' && r.isolation !== 'landlock' && r.isolation !== 'none') {
    throw new Error(
      `SandboxPool option isolation must be 'bwrap', 'landlock' or 'none', got ${String(r.isolation)}`,
    );
  }
  for (const m of r.preload) {
    if (!MODULE_NAME.test(m)) throw new Error(`preload entry is not a module name: ${m}`);
  }
  return r;
}

/** One running sandbox: the bwrap (or bare python) process and its frame stream. */
class Broker {
  readonly proc: ChildProcess;
  ready: Promise<Record<string, unknown>>;
  alive = true;
  isReady = false;
  /** when the broker last sent anything (checkWedged) */
  heardAt = Date.now();
  /** sent SIGKILL, its exit not seen yet: on a loaded host its processes take seconds to die */
  killed = false;
  /** control frames other than "ready" (e.g. a session that died while idle) */
  onControl: ((hdr: Record<string, unknown>) => void) | null = null;
  private buf: Buffer = Buffer.alloc(0);
  private stderrTail: string[] = [];
  private corked = false;

  constructor(
    command: string,
    args: string[],
    extraFds: number[],
    input: Buffer,
    private onResult: (
      id: number,
      hdr: Record<string, number>,
      out: string,
      err: string,
      fetched?: string,
    ) => void,
    onExit: (why: string) => void,
    log: (l: string) => void,
    startTimeoutMs: number,
  ) {
    // a session of its own: a terminal's Ctrl-C reaches its whole foreground group, and the trainer that got it
    // still finishes its step, tool calls included. Its life is its stdin: the broker exits when Node's end closes
    this.proc = spawn(command, args, { stdio: ['pipe', 'pipe', 'pipe', ...extraFds], detached: true });
    for (const fd of extraFds) closeSync(fd);
    this.proc.stdin?.write(input);
    let readyResolve!: (v: Record<string, unknown>) => void;
    let readyReject!: (e: Error) => void;
    this.ready = new Promise((res, rej) => {
      readyResolve = res;
      readyReject = rej;
    });
    this.ready.catch(() => {});
    const startTimer = setTimeout(() => {
      readyReject(new Error(`sandbox did not start within ${startTimeoutMs} ms`));
      this.kill();
    }, startTimeoutMs);
    let readySeen = false;
    this.proc.stdout?.on('data', (chunk: Buffer) => {
      if (!this.alive) return;
      this.heardAt = Date.now();
      try {
        this.onData(chunk, (info) => {
          readySeen = true;
          clearTimeout(startTimer);
          readyResolve(info);
        });
      } catch (e) {
        // a corrupt frame means the broker cannot be trusted: restart it (in-flight calls are retried)
        log(`sandbox protocol error: ${(e as Error).message}`);
        this.kill();
      }
    });
    this.proc.stderr?.setEncoding('utf8');
    this.proc.stderr?.on('data', (s: string) => {
      for (const line of s.split('\n')) {
        if (!line) continue;
        log(line);
        this.stderrTail.push(line);
        if (this.stderrTail.length > 20) this.stderrTail.shift();
      }
    });
    this.proc.stdin?.on('error', () => {}); // EPIPE after a crash; the exit handler reports it
    let exited = false;
    const exit = (why: string) => {
      if (exited) return;
      exited = true;
      this.alive = false;
      clearTimeout(startTimer);
      const tail = this.stderrTail.slice(-3).join(' | ');
      const msg = tail ? `${why}: ${tail}` : why;
      if (!readySeen) readyReject(new Error(`sandbox failed to start (${msg})${startAdvice(tail)}`));
      onExit(msg);
    };
    this.proc.on('error', (e) => exit(`sandbox process error: ${e.message}`));
    // 'close', not 'exit': results still in the pipe are read before in-flight calls are retried
    this.proc.on('close', (code, sig) => exit(`sandbox exited (code ${code}, signal ${sig})`));
  }

  send(frame: Buffer): void {
    const stdin = this.proc.stdin;
    if (!stdin || !this.alive) return;
    // cork so calls submitted in the same tick travel in one write
    if (!this.corked) {
      this.corked = true;
      stdin.cork();
      process.nextTick(() => {
        this.corked = false;
        stdin.uncork();
      });
    }
    stdin.write(frame);
  }

  kill(): void {
    this.killed = true;
    if (this.proc.exitCode === null && this.proc.signalCode === null) this.proc.kill('SIGKILL');
  }

  end(): void {
    this.proc.stdin?.end();
  }

  private onData(chunk: Buffer, onReady: (info: Record<string, unknown>) => void): void {
    let buf = this.buf.length ? Buffer.concat([this.buf, chunk]) : chunk;
    let pos = 0;
    while (buf.length - pos >= 12) {
      const n = buf.readUInt32LE(pos);
      if (buf.length - pos < 4 + n) break;
      const id = buf.readUInt32LE(pos + 4);
      const hl = buf.readUInt32LE(pos + 8);
      const hdr = JSON.parse(buf.toString('utf8', pos + 12, pos + 12 + hl));
      if (id === 0) {
        if (hdr.ready) onReady(hdr);
        else this.onControl?.(hdr);
      } else {
        const a = pos + 12 + hl;
        // toString('utf8') replaces invalid sequences with U+FFFD: binary output never breaks a result
        const out = buf.toString('utf8', a, a + hdr.o);
        const err = buf.toString('utf8', a + hdr.o, a + hdr.o + hdr.e);
        const f0 = a + hdr.o + hdr.e;
        const fetched = hdr.f === undefined ? undefined : buf.toString('utf8', f0, f0 + hdr.f);
        this.onResult(id, hdr, out, err, fetched);
      }
      pos += 4 + n;
    }
    if (pos === buf.length) buf = Buffer.alloc(0);
    else if (pos > 0) buf = buf.subarray(pos);
    this.buf = buf;
  }
}

export class SandboxPool implements CodeRunner {
  readonly options: Resolved;
  info: PoolInfo;
  private broker: Broker | null = null;
  private starting: Promise<void> | null = null;
  private queue: Item[] = [];
  private inflight = new Map<number, Item>();
  private nextId = 1;
  private closing = false;
  private failures = 0;
  private watchdog: NodeJS.Timeout;
  private ewmaMs = 5;
  /** the kernel's OOM kill count when last read, and the kills since that no SIGKILLed call was blamed for yet */
  private oomKills = { seen: oomKillCount(), unclaimed: 0, at: 0 };
  private stats_: PoolStats = {
    queued: 0,
    inFlight: 0,
    completed: 0,
    restarts: 0,
    retried: 0,
    sessions: 0,
    kernelLimits: 0,
  };
  /** stateless calls in flight (session calls use their own slots) */
  private statelessInflight = 0;
  private sessions = new Map<string, Session>();
  /** ids of sessions that died or expired: key -> why, answered until closeSession() (kept 1 h) */
  private lost = new Map<string, { why: string; at: number }>();
  private nextSid = 1;

  private constructor(opts: Resolved) {
    this.options = opts;
    this.info = {
      isolation: opts.isolation,
      slots: opts.slots,
      landlock: 0,
      uidBase: 0,
      zygoteMb: 0,
      preloadFailed: [],
      demoteAfterMs: 0,
      demoteSession: false,
      limits: 'polling',
      notes: [],
    };
    this.watchdog = setInterval(() => {
      this.checkWedged();
      if (this.sessions.size || this.lost.size) this.expireSessions();
    }, 250);
    this.watchdog.unref();
  }

  /** Start the sandbox and wait until the zygote has preloaded; throws if isolation is unavailable. */
  static async start(opts: SandboxPoolOptions = {}): Promise<SandboxPool> {
    const o = resolveOptions(opts);
    if (o.isolation === 'bwrap' && !findBwrap()) {
      throw new Error(
        'bubblewrap is not installed, so the sandbox cannot isolate code (apt-get install bubblewrap). ' +
          "Pass isolation: 'none' (CLI: --insecure-no-sandbox) only for local development.",
      );
    }
    if (o.isolation === 'none') {
      o.log(
        'WARNING: running Python with isolation none: no namespaces, no seccomp. Never use with untrusted code.',
      );
    }
    const pool = new SandboxPool(o);
    try {
      await pool.ensureBroker();
    } catch (e) {
      await pool.close();
      throw e;
    }
    return pool;
  }

  stats(): PoolStats {
    return {
      ...this.stats_,
      queued: this.queue.length,
      inFlight: this.inflight.size,
      sessions: this.sessions.size,
      kernelLimits: this.info.limits === 'polling' ? 0 : 1,
    };
  }

  /** pid of the sandbox's outer process (bwrap, or python with isolation none); for fault tests */
  get sandboxPid(): number | undefined {
    return this.broker?.alive ? this.broker.proc.pid : undefined;
  }

  run(req: RunRequest): Promise<RunResult> {
    return new Promise((resolve) => this.submit(req, resolve));
  }

  runBatch(reqs: RunRequest[]): Promise<RunResult[]> {
    return Promise.all(reqs.map((r) => this.run(r)));
  }

  async close(): Promise<void> {
    if (this.closing) return;
    this.closing = true;
    clearInterval(this.watchdog);
    for (const it of this.queue.splice(0))
      this.finish(it, emptyResult('internal_error', 'pool closed before the call started'));
    for (const s of this.sessions.values()) {
      for (const it of s.queue.splice(0))
        this.finish(it, emptyResult('internal_error', 'pool closed before the call started'));
    }
    if (this.inflight.size > 0) {
      await new Promise<void>((res) => {
        const t = setInterval(() => {
          if (this.inflight.size === 0 || !this.broker?.alive) {
            clearInterval(t);
            res();
          }
        }, 20);
      });
    }
    const b = this.broker;
    this.broker = null;
    if (b?.alive) {
      // 'close' follows the exit handler's cleanup (the slots' cgroups removed); a process the sandbox left holding
      // its pipes would hold 'close' back, so its exit and a moment suffice
      const gone = new Promise<void>((res) => {
        b.proc.once('close', () => res());
        b.proc.once('exit', () => setTimeout(res, 3000).unref());
      });
      b.end();
      const t = setTimeout(() => b.kill(), 2000);
      await gone;
      clearTimeout(t);
    }
    for (const it of this.inflight.values())
      this.finish(it, emptyResult('internal_error', 'pool closed during the call'));
    this.inflight.clear();
    this.sessions.clear();
  }

  /** Ends a stateful session: a call running in it is killed (its result says "session closed"),
   * queued ones are answered with an error. Also forgets a lost session's id. Returns whether a
   * live session was closed. */
  closeSession(key: string): boolean {
    this.lost.delete(key);
    const s = this.sessions.get(key);
    if (!s) return false;
    this.sessions.delete(key);
    for (const it of s.queue.splice(0)) this.finish(it, sessionError(`session ${key} was closed`));
    const b = this.broker;
    if (b?.alive && b.isReady) {
      const f = Buffer.alloc(20);
      f.writeUInt32LE(16, 0);
      f.writeUInt32LE(FLAG_CLOSE, 12);
      f.writeUInt32LE(s.sid, 16);
      b.send(f);
    }
    return true;
  }

  private markLost(s: Session, why: string): void {
    if (this.sessions.get(s.key) !== s) return;
    this.sessions.delete(s.key);
    this.lost.delete(s.key);
    this.lost.set(s.key, { why, at: Date.now() });
    if (this.lost.size > 10_000) this.lost.delete(this.lost.keys().next().value as string);
    for (const it of s.queue.splice(0)) this.finish(it, sessionError(`session ${s.key} lost: ${why}`));
  }

  private submitSession(item: Item, key: string): void {
    const gone = this.lost.get(key);
    if (gone) {
      item.resolve(
        sessionError(
          `session ${key} lost: ${gone.why}; its state is gone (closeSession() it to start a fresh one)`,
        ),
      );
      return;
    }
    let s = this.sessions.get(key);
    if (!s) {
      if (this.sessions.size >= this.options.maxSessions) {
        item.resolve(
          emptyResult('busy', `session limit reached (${this.options.maxSessions} live sessions)`),
        );
        return;
      }
      s = { key, sid: this.nextSid++, busy: false, queue: [], lastUsed: Date.now() };
      this.sessions.set(key, s);
    }
    item.session = s;
    s.queue.push(item);
    this.pumpSession(s);
  }

  private pumpSession(s: Session): void {
    const b = this.broker;
    if (s.busy || s.queue.length === 0 || this.sessions.get(s.key) !== s) return;
    if (!b?.alive || !b.isReady) {
      if (!this.closing) void this.ensureBroker().catch(() => {});
      return;
    }
    const item = s.queue.shift() as Item;
    s.busy = true;
    const id = this.nextId;
    this.nextId = this.nextId >= 0xfffffff0 ? 1 : this.nextId + 1;
    item.attempts++;
    item.sentAt = Date.now();
    item.frame.writeUInt32LE(id, 4);
    item.frame.writeUInt32LE(s.sid, 16);
    this.inflight.set(id, item);
    b.send(item.frame);
  }

  private expireSessions(): void {
    const now = Date.now();
    const ttl = this.options.sessionTtlMs;
    for (const s of [...this.sessions.values()]) {
      if (!s.busy && s.queue.length === 0 && now - s.lastUsed > ttl) {
        this.closeSession(s.key);
        this.lost.set(s.key, { why: `expired after ${Math.round(ttl / 1000)} s idle`, at: now });
      }
    }
    const keep = Math.max(ttl, 3_600_000);
    for (const [k, v] of this.lost) {
      if (now - v.at > keep) this.lost.delete(k);
      else break; // insertion order = age order
    }
  }

  private submit(req: RunRequest, resolve: (r: RunResult) => void): void {
    if (this.closing) {
      resolve(emptyResult('internal_error', 'pool is closed'));
      return;
    }
    const bad = this.validate(req);
    if (typeof bad === 'string') {
      resolve(emptyResult('invalid_input', bad));
      return;
    }
    const { timeoutMs, memoryMb, frame } = bad;
    if (req.session !== undefined) {
      const item: Item = {
        req,
        frame,
        timeoutMs,
        memoryMb,
        resolve,
        attempts: 0,
        sentAt: 0,
        enqueuedAt: Date.now(),
      };
      this.submitSession(item, req.session);
      return;
    }
    if (this.queue.length >= this.options.maxQueue) {
      resolve(emptyResult('busy', `queue full (${this.options.maxQueue} calls waiting)`));
      return;
    }
    const item: Item = {
      req,
      frame,
      timeoutMs,
      memoryMb,
      resolve,
      attempts: 0,
      sentAt: 0,
      enqueuedAt: Date.now(),
    };
    const qt = req.queueTimeoutMs ?? this.options.queueTimeoutMs;
    const waitAhead = this.queue.length + this.inflight.size - this.options.slots + 1;
    if (qt > 0 && waitAhead > 0) {
      // answer at once when the calls ahead cannot plausibly finish in time, not after a hidden wait
      const predicted = Math.ceil(waitAhead / this.options.slots) * this.ewmaMs;
      if (predicted > qt) {
        resolve(emptyResult('queue_timeout', `predicted wait ${Math.round(predicted)} ms exceeds ${qt} ms`));
        return;
      }
      item.queueTimer = setTimeout(() => {
        const i = this.queue.indexOf(item);
        if (i >= 0) {
          this.queue.splice(i, 1);
          this.finish(item, emptyResult('queue_timeout', `did not start within ${qt} ms`));
        }
      }, qt);
    }
    this.queue.push(item);
    this.pump();
  }

  private validate(req: RunRequest): string | { timeoutMs: number; memoryMb: number; frame: Buffer } {
    const o = this.options;
    if (req === null || typeof req !== 'object') return 'request must be an object';
    if (typeof req.code !== 'string') return 'code must be a string';
    if (req.stdin !== undefined && req.stdin !== null && typeof req.stdin !== 'string')
      return 'stdin must be a string';
    const timeoutMs = req.timeoutMs ?? o.timeoutMs;
    if (!Number.isFinite(timeoutMs) || timeoutMs <= 0 || timeoutMs > o.maxTimeoutMs) {
      return `timeoutMs must be in (0, ${o.maxTimeoutMs}], got ${req.timeoutMs}`;
    }
    const memoryMb = req.memoryMb ?? o.memoryMb;
    if (
      req.memoryMb !== undefined &&
      !(Number.isInteger(req.memoryMb) && req.memoryMb >= 1 && req.memoryMb <= o.maxMemoryMb)
    ) {
      return `memoryMb must be an integer in [1, ${o.maxMemoryMb}], got ${req.memoryMb}`;
    }
    if (req.session !== undefined) {
      if (o.maxSessions === 0) return 'stateful sessions are disabled in this pool (maxSessions 0)';
      if (typeof req.session !== 'string' || !SESSION_ID.test(req.session))
        return 'session must be 1-200 printable ASCII characters without spaces';
    }
    const sess = req.session !== undefined ? 4 : 0;
    const fetch = req.fetchFiles ?? [];
    if (!Array.isArray(fetch)) return 'fetchFiles must be an array of file names';
    for (const name of fetch) {
      if (typeof name !== 'string' || !FILE_NAME.test(name)) {
        return `fetchFiles name not allowed (plain names only): ${JSON.stringify(name)}`;
      }
    }
    const codeLen = Buffer.byteLength(req.code, 'utf8');
    if (codeLen > o.maxCodeBytes) return `code is ${codeLen} bytes, over the ${o.maxCodeBytes}-byte limit`;
    const stdin = req.stdin ?? '';
    const stdinLen = Buffer.byteLength(stdin, 'utf8');
    if (stdinLen > o.maxStdinBytes)
      return `stdin is ${stdinLen} bytes, over the ${o.maxStdinBytes}-byte limit`;
    let files = '';
    if (req.files !== undefined || fetch.length > 0) {
      if (req.files !== undefined && (req.files === null || typeof req.files !== 'object'))
        return 'files must be an object of name -> base64';
      for (const [name, b64] of Object.entries(req.files ?? {})) {
        if (!FILE_NAME.test(name)) return `file name not allowed (plain names only): ${JSON.stringify(name)}`;
        if (typeof b64 !== 'string' || !BASE64.test(b64)) return `file ${name} is not base64`;
      }
      files = JSON.stringify({ files: req.files ?? {}, fetch });
      if (files.length > o.maxFilesBytes) return `files total ${files.length} bytes, over ${o.maxFilesBytes}`;
    }
    const filesLen = Buffer.byteLength(files);
    const frame = Buffer.allocUnsafe(24 + sess + codeLen + filesLen + stdinLen);
    frame.writeUInt32LE(frame.length - 4, 0);
    // id (and session handle at 16) written at send time
    frame.writeUInt32LE(Math.ceil(timeoutMs), 8);
    // bit 31 asks the broker for a result pipe that carries the fetched files back; bit 30 marks
    // a session call, whose payload starts with the u32 session handle
    const flags = (fetch.length > 0 ? FLAG_FETCH : 0) | (sess ? FLAG_SESSION : 0);
    frame.writeUInt32LE((memoryMb | flags) >>> 0, 12);
    const p = 16 + sess;
    frame.writeUInt32LE(codeLen, p);
    frame.writeUInt32LE(filesLen, p + 4);
    frame.write(req.code, p + 8, 'utf8');
    if (filesLen) frame.write(files, p + 8 + codeLen, 'utf8');
    if (stdinLen) frame.write(stdin, p + 8 + codeLen + filesLen, 'utf8');
    return { timeoutMs: Math.ceil(timeoutMs), memoryMb, frame };
  }

  private pump(): void {
    const b = this.broker;
    if (!b?.alive || !b.isReady) {
      if (!this.closing && this.queue.length > 0) void this.ensureBroker().catch(() => {});
      return;
    }
    while (this.queue.length > 0 && this.statelessInflight < this.options.slots) {
      const item = this.queue.shift() as Item;
      if (item.queueTimer) clearTimeout(item.queueTimer);
      const id = this.nextId;
      this.nextId = this.nextId >= 0xfffffff0 ? 1 : this.nextId + 1;
      item.attempts++;
      item.sentAt = Date.now();
      item.frame.writeUInt32LE(id, 4);
      this.inflight.set(id, item);
      this.statelessInflight++;
      b.send(item.frame);
    }
    for (const s of this.sessions.values()) this.pumpSession(s);
  }

  private ensureBroker(): Promise<void> {
    if (this.broker?.alive) return Promise.resolve();
    if (this.starting) return this.starting;
    this.starting = this.launch().finally(() => {
      this.starting = null;
      this.pump();
    });
    return this.starting;
  }

  private async launch(): Promise<void> {
    const o = this.options;
    if (this.failures > 0) await new Promise((r) => setTimeout(r, Math.min(2000, 50 * 2 ** this.failures)));
    const plan = planLaunch({
      isolation: o.isolation,
      python: o.python,
      slots: o.slots + o.maxSessions,
      scratchMb: o.scratchMb,
      shmMb: o.shmMb,
      uidBase: o.uidBase,
      config: {
        slots: o.slots + o.maxSessions,
        sessionSlots: o.maxSessions,
        maxOutputBytes: o.maxOutputBytes,
        maxFetchBytes: o.maxFilesBytes,
        killOutputBytes: o.killOutputBytes,
        nproc: o.nproc,
        fileSizeMb: o.fileSizeMb,
        shmMb: o.shmMb,
        scratchFiles: o.scratchFiles,
        demoteAfterMs: o.demoteAfterMs,
        preload: o.preload,
        landlock: o.landlock,
        prefork: o.prefork,
        plainFork: o.plainFork,
      },
    });
    const broker = new Broker(
      plan.command,
      plan.args,
      plan.extraFds,
      plan.input,
      (id, hdr, out, err, fetched) => this.onResult(id, hdr, out, err, fetched),
      (why) => {
        plan.cleanup();
        this.onBrokerExit(broker, why);
      },
      o.log,
      o.startTimeoutMs,
    );
    broker.onControl = (hdr) => {
      if (typeof hdr.sessionGone !== 'number') return;
      for (const s of this.sessions.values()) {
        if (s.sid === hdr.sessionGone && !s.busy) this.markLost(s, String(hdr.why));
      }
    };
    this.broker = broker;
    try {
      const ready = await broker.ready;
      broker.isReady = true;
      this.failures = 0;
      const notes = [...plan.notes];
      const limits = typeof ready.limits === 'string' ? ready.limits : 'polling';
      notes.push(
        limits === 'polling'
          ? "memory and process limits: polled, every 100 ms (a call's processes may pass its limit between two checks)"
          : `memory and process limits: held by the kernel (${limits}, a memory and a pids group per slot)`,
      );
      if (ready.landlockReason) notes.push(`Landlock off: ${ready.landlockReason}`);
      const preloadFailed = (ready.preloadFailed as string[] | undefined) ?? [];
      if (preloadFailed.length) notes.push(`preload failed: ${preloadFailed.join('; ')}`);
      const zygoteMb = Math.round(Number(ready.anonKb ?? 0) / 1024);
      if (zygoteMb > ZYGOTE_NOTE_MB) {
        notes.push(
          `the zygote holds ${zygoteMb} MiB after preloading ${o.preload.join(', ')}: every call copies its page ` +
            'tables and unmaps them at exit, ~0.05 ms of CPU per MiB on a 2-core VM; preload only what most calls import',
        );
      }
      const pidsMax = pidsLimit();
      const mayHold = (o.slots + o.maxSessions) * o.nproc;
      if (pidsMax !== undefined && pidsMax < mayHold) {
        notes.push(
          `the process limit here (cgroup pids.max ${pidsMax}) is below what the slots may hold ` +
            `(${o.slots + o.maxSessions} x nproc ${o.nproc} = ${mayHold}): while it is full, new calls wait` +
            (ready.uidBase ? ', and the call holding the most processes is killed' : ''),
        );
      }
      const fresh = notes.filter((n) => !this.info.notes.includes(n));
      for (const n of fresh) o.log(n);
      this.info = {
        isolation: o.isolation,
        slots: o.slots,
        landlock: Number(ready.landlock ?? 0),
        uidBase: Number(ready.uidBase ?? 0),
        zygoteMb,
        preloadFailed,
        demoteAfterMs: Number(ready.demoteAfterMs ?? 0),
        demoteSession: Boolean(ready.demoteSession),
        limits,
        notes,
      };
    } catch (e) {
      this.failures++;
      broker.kill();
      if (this.failures >= 5) {
        for (const it of this.queue.splice(0)) {
          this.finish(it, emptyResult('internal_error', `sandbox cannot start: ${(e as Error).message}`));
        }
      }
      throw e;
    }
  }

  private onBrokerExit(broker: Broker, why: string): void {
    if (this.broker !== broker) return;
    if (!this.closing) {
      this.stats_.restarts++;
      this.options.log(`${why}; restarting`);
    }
    const retry: Item[] = [];
    for (const s of [...this.sessions.values()]) this.markLost(s, `the sandbox restarted (${why})`);
    this.statelessInflight = 0;
    for (const it of this.inflight.values()) {
      if (it.session) {
        it.session.busy = false;
        this.finish(it, sessionError(`session ${it.session.key} lost: the sandbox restarted (${why})`));
      } else if (it.attempts < 2 && !this.closing) retry.push(it);
      else this.finish(it, emptyResult('internal_error', `sandbox died during the call, twice (${why})`));
    }
    this.inflight.clear();
    this.stats_.retried += retry.length;
    this.queue.unshift(...retry);
    if (!this.closing && this.queue.length > 0) void this.ensureBroker().catch(() => {});
  }

  /** A call long past its deadline means a wedged sandbox only if the sandbox has gone quiet too: on a host loaded
   * by other work a killed fork bomb's forks took seconds to die (the call is answered once they are reaped), or
   * its slot's wipe kept the call waiting, while every other call was answered, and a restart lost every session
   * for nothing. A call lost by a broker that still answers others is caught by the longer bound. */
  private checkWedged(): void {
    const b = this.broker;
    if (!b?.alive || b.killed) return;
    const now = Date.now();
    const grace = this.options.watchdogGraceMs;
    const quiet = now - b.heardAt;
    for (const it of this.inflight.values()) {
      const late = now - it.sentAt - it.timeoutMs;
      if ((late > grace && quiet > grace) || late > 12 * grace) {
        this.options.log(
          `a call passed its deadline by ${late} ms and the sandbox has sent nothing for ${quiet} ms; killing it`,
        );
        b.kill();
        return;
      }
    }
  }

  /** Which bound a call killed with reason 4 crossed, from the broker's counts (mf, md, ms, mk, mq). */
  private limitError(h: Record<string, number>, memoryMb: number): string {
    const o = this.options;
    const mb = (kb = 0) => Math.round(kb / 1024);
    if (h.mf === -1) return 'file limit: the call nested directories more than 64 deep in its scratch';
    if (h.mf)
      return `file limit: the call held ${h.mf} files and directories in its scratch (limit ${o.scratchFiles})`;
    if (h.md) return `disk limit: the call held ${mb(h.md)} MB in its scratch (limit ${o.scratchMb} MB)`;
    if ((h.ms ?? 0) > o.shmMb * 1024)
      return `memory limit: the call held ${mb(h.ms)} MB in /dev/shm (its share: ${o.shmMb} MB)`;
    if (h.mc)
      return (
        `memory limit: the call's processes held ${h.mc} MB together (limit ${memoryMb} MB), ` +
        "where the kernel stopped them (the slot's memory cgroup)"
      );
    const sockets = h.mq ? `, ${mb(h.mq)} MB of it what its sockets can hold unread` : '';
    return `memory limit: the call's processes held ${mb(h.mk)} MB together${sockets} (limit ${memoryMb} MB)`;
  }

  private onResult(
    id: number,
    h: Record<string, number>,
    stdout: string,
    stderr: string,
    fetched?: string,
  ): void {
    const item = this.inflight.get(id);
    if (!item) return;
    this.inflight.delete(id);
    const s = item.session;
    if (s) {
      s.busy = false;
      s.lastUsed = Date.now();
    } else this.statelessInflight--;
    const exitCode = h.c ?? null;
    const sig = h.g ? (SIGNAL_NAMES[h.g] ?? `SIG${h.g}`) : null;
    const truncated = h.no > h.o || h.ne > h.e;
    const wallMs = h.w / 1000;
    let status: RunStatus;
    let oom = false;
    let error: string | undefined;
    if (h.r === 1) status = 'timeout';
    else if (h.r === 2) status = 'output_limit';
    else if (h.r === 4) {
      status = 'oom';
      oom = true;
      error = this.limitError(h, item.memoryMb);
    } else if (h.r === 5) {
      status = 'internal_error'; // no process could be forked for the call within its time limit
      error = String(h.x);
    } else if (h.r === 6) {
      status = 'killed';
      error = "killed: its processes filled the host's process limit while another call could not start";
    } else if (exitCode === 121 && stderr.startsWith(SETUP_FAILED)) {
      status = 'internal_error';
      error = stderr.slice(SETUP_FAILED.length).trim();
    } else {
      oom = looksLikeOom(stderr, sig, h.m, item.memoryMb);
      // with a cgroup per slot the sandbox knows (ko); without, a kill near a host-wide OOM kill is taken for one
      const hostOom = h.ko === undefined ? this.kernelOomKill() : h.ko === 1;
      if (!oom && sig === 'SIGKILL' && hostOom) {
        oom = true;
        error =
          "killed by the kernel's OOM killer: the machine's or container's memory ran out (sandboxed code goes first)";
      }
      status = oom ? 'oom' : sig ? 'killed' : exitCode === 0 ? 'ok' : 'error';
    }
    if (!s) this.ewmaMs = this.ewmaMs * 0.9 + Math.max(0.5, Date.now() - item.sentAt) * 0.1;
    this.stats_.completed++;
    const r: RunResult = {
      status,
      exitCode,
      signal: sig,
      stdout,
      stderr,
      truncated,
      timedOut: h.r === 1,
      oom,
      wallMs,
      cpuMs: h.u / 1000,
      peakMemoryKb: h.m,
    };
    if (error !== undefined) r.error = error;
    if (h.h) r.error = 'a leftover process held the output pipes open; output may be incomplete';
    if (fetched !== undefined) {
      const files = fetchedFiles(fetched, item.req.fetchFiles ?? []);
      r.files = files ?? {};
      if (!files) r.error = 'fetched files were unreadable (the snippet wrote to fd 3?)';
    }
    if (s && h.sl !== undefined) {
      const why = String(h.sl);
      r.error = `session ${s.key} lost: ${why}`;
      this.markLost(s, why);
      if (why === 'session closed') this.lost.delete(s.key);
    }
    item.resolve(r);
    if (s) this.pumpSession(s);
    else this.pump();
  }

  /** Whether a call killed by SIGKILL that the sandbox did not kill is most likely the kernel's OOM killer's: a
   * kill it counted within the last 10 s that no other such call has taken (several die in one shortage). */
  private kernelOomKill(): boolean {
    const k = this.oomKills;
    const now = oomKillCount();
    if (now !== undefined && k.seen !== undefined && now > k.seen) {
      k.unclaimed += now - k.seen;
      k.at = Date.now();
    }
    k.seen = now;
    if (Date.now() - k.at > 10_000) k.unclaimed = 0;
    if (k.unclaimed <= 0) return false;
    k.unclaimed--;
    return true;
  }

  private finish(item: Item, r: RunResult): void {
    if (item.queueTimer) clearTimeout(item.queueTimer);
    item.resolve(r);
  }
}

/** What to do when bubblewrap could not set the sandbox up, which is how a default Docker container (root without
 * CAP_SYS_ADMIN, a seccomp profile refusing new namespaces) or a host without unprivileged user namespaces fails. */
function startAdvice(stderrTail: string): string {
  if (!/bwrap: .*(namespace|uid map|setting up|Operation not permitted|Permission denied)/i.test(stderrTail))
    return '';
  return (
    ". bubblewrap cannot create the sandbox's namespaces here. In Docker, run the container with --privileged, or " +
    'at least --cap-add SYS_ADMIN --security-opt seccomp=unconfined --security-opt apparmor=unconfined. As a user ' +
    'other than root, unprivileged user namespaces must be allowed (sysctl kernel.unprivileged_userns_clone=1; on ' +
    'Ubuntu 24.04 also kernel.apparmor_restrict_unprivileged_userns=0). Or, as root, RSTAR2_SANDBOX_ISOLATION=landlock ' +
    'isolates without namespaces (Landlock, seccomp, a uid per slot; no /proc or /dev/shm for snippets)'
  );
}

/** The fetched files the child sent back, under the names the request asked for only: the child's process is the
 * snippet's, which can write any JSON there (issue 42: `../../home/user/.bashrc`), so a name not asked for or a
 * value that is not base64 text is dropped. null if it is not a JSON object. */
function fetchedFiles(json: string, asked: string[]): Record<string, string> | null {
  let sent: unknown;
  try {
    sent = JSON.parse(json);
  } catch {
    return null;
  }
  if (sent === null || typeof sent !== 'object' || Array.isArray(sent)) return null;
  const files: Record<string, string> = {};
  for (const name of asked) {
    const b64 = Object.hasOwn(sent, name) ? (sent as Record<string, unknown>)[name] : undefined;
    if (typeof b64 === 'string' && BASE64.test(b64)) files[name] = b64;
  }
  return files;
}

function sessionError(error: string): RunResult {
  return emptyResult('error', error);
}

function looksLikeOom(stderr: string, sig: string | null, peakKb: number, memoryMb: number): boolean {
  const tail = stderr.slice(-400);
  if (
    /(^|\n)MemoryError\b/.test(tail) ||
    /numpy\.core\._exceptions\._ArrayMemoryError|Unable to allocate/.test(tail)
  ) {
    return true;
  }
  // C code that fails an allocation usually aborts or segfaults near the address-space limit
  return (
    memoryMb > 0 &&
    (sig === 'SIGABRT' || sig === 'SIGSEGV' || sig === 'SIGBUS') &&
    peakKb > memoryMb * 1024 * 0.8
  );
}
