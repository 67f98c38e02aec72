import { type ChildProcess, spawn } from 'node:child_process';
import { resolve } from 'node:path';
import { warmupLr } from '../rl/index.js';
import { freePort } from '../util/net.js';
import { findPython, PYTHON_DIR } from '../util/python.js';
import { checkLaunch, type Master, rankEnvs } from './launch.js';
import {
  encodeFrame,
  type Frame,
  FrameReader,
  PROTOCOL_VERSION,
  packRagged,
  unpackRagged,
  type WireArray,
} from './protocol.js';
import {
  type EngineLoad,
  type GenerateResult,
  type LogprobsOptions,
  type LogprobsResult,
  type ModelConfig,
  type ModelInfo,
  PRECISIONS,
  type SamplingParams,
  type SaveOptions,
  type TrainBatch,
  type TrainOptions,
  TrainOptionsSchema,
  type TrainStats,
  type WeightGroup,
  type WeightMeta,
  type WorkerStartOptions,
  type WorkerTrainOptions,
} from './types.js';

const STDERR_TAIL = 4000;

/** engineLoad(): the load, and what the engine has done (prefill tokens computed and served from its prefix
 *  cache, decode steps, tokens generated, retractions when its KV pool was full). */
export type EngineStats = Required<EngineLoad> & {
  decodeSteps: number;
  generatedTokens: number;
  prefillTokens: number;
  cachedTokens: number;
  retractions: number;
  /** "i/n" when the worker is built-in engine i of n started side by side (agent/stack.ts), and its device. */
  slot: string | null;
  device: string;
  /** The longest prompt + new tokens a request may have (the KV pool or the model's positions); absent before
   *  the pool is built. */
  maxLen?: number;
};

interface Pending {
  resolve: (f: Frame) => void;
  reject: (e: Error) => void;
}

// One python process (one torch.distributed rank). Only rank 0 answers; the others write a frame only to
// report that they could not start, and otherwise matter to the client through their exit.
class Rank {
  readonly child: ChildProcess;
  private readonly reader = new FrameReader();
  private readonly pending = new Map<number, Pending>();
  private stderrTail = '';
  private hello: Promise<Frame>;
  exited: string | null = null;

  constructor(
    python: string,
    env: NodeJS.ProcessEnv,
    private readonly onExit: (why: string) => void,
  ) {
    // a session of its own, so a terminal's Ctrl-C, which reaches the whole foreground group, leaves it to the
    // trainer to stop at its next safe point; the worker ends when its stdin closes (the client's close, or death)
    this.child = spawn(python, ['-u', '-m', 'rstar2_worker'], {
      env,
      stdio: ['pipe', 'pipe', 'pipe'],
      detached: true,
    });
    let helloResolve!: (f: Frame) => void;
    let helloReject!: (e: Error) => void;
    this.hello = new Promise<Frame>((res, rej) => {
      helloResolve = res;
      helloReject = rej;
    });
    this.hello.catch(() => {});
    this.pending.set(0, { resolve: helloResolve, reject: helloReject });
    this.child.stdout?.on('data', (chunk: Buffer) => {
      let frames: Frame[];
      try {
        frames = this.reader.push(chunk);
      } catch (e) {
        this.fail(`${(e as Error).message}; killing the worker`);
        this.child.kill('SIGKILL');
        return;
      }
      for (const f of frames) {
        const id = Number(f.header.id ?? 0);
        const p = this.pending.get(id);
        if (!p) continue;
        this.pending.delete(id);
        if (f.header.error) p.reject(new Error(`worker: ${String(f.header.error)}`));
        else p.resolve(f);
      }
    });
    this.child.stderr?.on('data', (chunk: Buffer) => {
      if (process.env.RSTAR2_WORKER_DEBUG) process.stderr.write(chunk);
      this.stderrTail = (this.stderrTail + chunk.toString('utf8')).slice(-STDERR_TAIL);
    });
    this.child.on('error', (e) => this.fail(`could not start ${python}: ${e.message}`));
    this.child.on('exit', (code, signal) => {
      const how = signal ? `signal ${signal}` : `exit code ${code}`;
      const tail = this.stderrTail.trim();
      const why =
        `policy worker ${env.RANK === '0' ? '' : `rank ${env.RANK} `}(pid ${this.child.pid}) died with ${how}` +
        (tail ? `; stderr tail:\n${tail}` : '');
      // a rank that died because a peer's connection closed is the consequence, not the cause: the peer's own exit,
      // which a busy event loop may deliver second, gets a moment to be the report
      if (/connection (closed|reset) by peer|remote process exited/i.test(tail))
        setTimeout(() => this.fail(why), 500);
      else this.fail(why);
    });
    this.child.stdin?.on('error', () => {}); // EPIPE after death is reported through 'exit'
  }

  fail(why: string): void {
    if (this.exited) return;
    this.exited = why;
    const err = new Error(why);
    for (const p of this.pending.values()) p.reject(err);
    this.pending.clear();
    this.onExit(why);
  }

  waitHello(): Promise<Frame> {
    return this.hello;
  }

  call(id: number, header: Record<string, unknown>, arrays: Record<string, WireArray>): Promise<Frame> {
    if (this.exited) return Promise.reject(new Error(this.exited));
    return new Promise<Frame>((res, rej) => {
      this.pending.set(id, { resolve: res, reject: rej });
      this.child.stdin?.write(encodeFrame({ ...header, id }, arrays));
    });
  }
}

const SHARDINGS = ['ddp', 'fsdp'] as const;

function checkSharding(o: WorkerStartOptions): void {
  const s = o.sharding ?? 'ddp';
  if (!(SHARDINGS as readonly string[]).includes(s))
    throw new Error(`sharding must be one of ${SHARDINGS.join(', ')}, got ${JSON.stringify(s)}`);
  if (o.offloadOptimizer && s !== 'fsdp')
    throw new Error('offloadOptimizer needs sharding: fsdp (DDP keeps the optimizer on the device)');
}

async function masterOf(o: WorkerStartOptions): Promise<Master> {
  const { master } = checkLaunch(o);
  return master ?? { addr: '127.0.0.1', port: await freePort('127.0.0.1') };
}

function processEnv(o: WorkerStartOptions, rank: Record<string, string>): NodeJS.ProcessEnv {
  const threads = o.threads ?? 2;
  // libgomp's idle threads spin 300k rounds before they sleep, so beside any other busy process on the same
  // cores (a second run, an eval, CI) each step waits on spinning peers: 4-28x slower. A short spin costs
  // nothing alone and 1.3x beside a second worker (bench/worker-contention.ts).
  const spin = process.env.GOMP_SPINCOUNT || process.env.OMP_WAIT_POLICY ? {} : { GOMP_SPINCOUNT: '1000' };
  return {
    // As SGLang and vLLM set them in their own processes: ranks that disagree on them in one communicator (rank 0
    // and the engines in a weight-update group) hang or fail at the first collective. Set on every rank of every
    // node, so the trainer's own groups agree too; NCCL reads them when its first communicator is made. A value
    // the user exported wins (SGLang's --enable-symm-mem runs with NCCL_CUMEM_ENABLE=1).
    NCCL_CUMEM_ENABLE: '0',
    NCCL_NVLS_ENABLE: '0',
    ...process.env,
    ...spin,
    ...o.env,
    PYTHONPATH: [resolve(PYTHON_DIR), o.env?.PYTHONPATH ?? process.env.PYTHONPATH].filter(Boolean).join(':'),
    RSTAR2_THREADS: String(threads),
    // torch threads parallelise; a second BLAS pool on top oversubscribes 2 cores (ts-tensor-engines.md)
    OPENBLAS_NUM_THREADS: process.env.OPENBLAS_NUM_THREADS ?? '1',
    OMP_NUM_THREADS: String(threads),
    RSTAR2_PRECISION: o.precision ?? 'fp32',
    RSTAR2_MODEL_BACKEND: o.modelImpl ?? 'native',
    ...(o.compile ? { RSTAR2_COMPILE: o.compile } : {}),
    RSTAR2_SHARDING: o.sharding ?? 'ddp',
    RSTAR2_OFFLOAD_OPTIMIZER: o.offloadOptimizer ? '1' : '0',
    ...rank,
  };
}

/**
 * Runs this node's ranks of a multi-node job whose rank 0 (and client) is on node 0, until they exit: they
 * take their requests from rank 0. Resolves with 0 when every rank exited cleanly (the client closed), else
 * with the first failure's exit code (the others are killed: a job restarts as a whole).
 */
export async function runNodeRanks(opts: WorkerStartOptions): Promise<number> {
  const { nodeRank, master } = checkLaunch(opts);
  if (nodeRank === 0 || !master)
    throw new Error('runNodeRanks is for nodes other than node 0 (--node-rank ≥ 1 with --master ADDR:PORT)');
  checkSharding(opts);
  const python = findPython(opts.python);
  const children = rankEnvs(opts, master).map((env) =>
    spawn(python, ['-u', '-m', 'rstar2_worker'], {
      env: processEnv(opts, env),
      stdio: ['ignore', 'inherit', 'inherit'],
    }),
  );
  return new Promise((res) => {
    let left = children.length;
    let code = 0;
    for (const c of children) {
      c.on('error', () => c.emit('exit', 127, null));
      c.once('exit', (status, signal) => {
        if (code === 0 && (status !== 0 || signal)) {
          code = status || 1;
          for (const o of children) if (o.exitCode === null) o.kill('SIGKILL');
        }
        if (--left === 0) res(code);
      });
    }
  });
}

/**
 * Client for the PyTorch policy worker (python/rstar2_worker). Calls are sent in order and answered one at a
 * time, except generate calls, which overlap: the worker's engine batches them as they come. If a rank dies,
 * every pending call is rejected with the exit code and stderr tail, the other ranks are killed, and the
 * next call starts fresh processes and replays the last init/load (training since then is lost — the
 * rejected call is the report of that).
 */
export class PolicyWorker {
  private ranks: Rank[] = [];
  private nextId = 1;
  private queue: Promise<unknown> = Promise.resolve();
  private readonly inFlight = new Set<Promise<Frame>>(); // generate replies still to come
  private lastModel: { op: 'init'; config: ModelConfig; seed: number } | { op: 'load'; dir: string } | null =
    null;
  private closed = false;
  private dead: string | null = null;
  // the worker's optimizer steps taken, as its init/load/reset/train_step replies report it: warmup counts on it
  private optimizerSteps = 0;
  restarts = 0;
  /** See WorkerStartOptions.callTimeoutMs; may be changed between calls. */
  callTimeoutMs: number;
  /** from the worker's hello: device is e.g. 'cuda (NVIDIA H100 80GB HBM3)' or 'cpu (2 threads)' (rank 0's) */
  info: { version: number; torch: string; world: number; device: string } | null = null;

  private constructor(
    private readonly opts: Required<Pick<WorkerStartOptions, 'threads' | 'ranks'>> & WorkerStartOptions,
    readonly world: number,
  ) {
    this.callTimeoutMs = opts.callTimeoutMs ?? 0;
  }

  static async start(opts: WorkerStartOptions = {}): Promise<PolicyWorker> {
    const threads = opts.threads ?? 2;
    if (!Number.isInteger(threads) || threads < 1)
      throw new Error(`threads must be a positive integer, got ${threads}`);
    if (opts.precision !== undefined && !PRECISIONS.includes(opts.precision))
      throw new Error(
        `precision must be one of ${PRECISIONS.join(', ')}, got ${JSON.stringify(opts.precision)}`,
      );
    const { ranks, nnodes, nodeRank } = checkLaunch(opts);
    if (nodeRank > 0)
      throw new Error(
        `node-rank ${nodeRank} holds no client (rank 0 is on node 0): run its ranks with runNodeRanks`,
      );
    checkSharding(opts);
    const w = new PolicyWorker({ ...opts, ranks, threads }, ranks * nnodes);
    await w.spawnAll();
    return w;
  }

  /** Process ids of the ranks (rank 0 first); for supervision and tests. */
  get pids(): number[] {
    return this.ranks.map((r) => r.child.pid ?? -1);
  }

  private async spawnAll(): Promise<void> {
    const python = findPython(this.opts.python);
    const master = await masterOf(this.opts);
    this.dead = null;
    const onExit = (why: string) => {
      if (this.dead || this.closed) return;
      this.dead = why;
      // the call waiting on rank 0 is told why the job died, not that rank 0 was killed in consequence
      for (const r of this.ranks) {
        if (r.exited) continue;
        r.fail(why);
        r.child.kill('SIGKILL');
      }
    };
    this.ranks = rankEnvs(this.opts, master).map(
      (env) => new Rank(python, processEnv(this.opts, env), onExit),
    );
    let hello: Frame;
    try {
      // rank 0 says hello once every rank has joined; any other rank can only fail first
      hello = await Promise.race(this.ranks.map((r) => r.waitHello()));
    } catch (e) {
      for (const r of this.ranks) if (!r.exited) r.child.kill('SIGKILL');
      throw new Error(`policy worker failed to start: ${(e as Error).message}`);
    }
    const v = Number(hello.header.version);
    if (v !== PROTOCOL_VERSION) {
      await this.killAll();
      throw new Error(
        `policy worker protocol version mismatch: this client speaks v${PROTOCOL_VERSION}, ` +
          `python/rstar2_worker speaks v${v} (src/ and python/ come from different checkouts)`,
      );
    }
    this.info = {
      version: PROTOCOL_VERSION,
      torch: String(hello.header.torch),
      world: this.world,
      device: String(hello.header.device ?? 'unknown'),
    };
  }

  private async killAll(): Promise<void> {
    await Promise.all(
      this.ranks.map(
        (r) =>
          new Promise<void>((res) => {
            if (r.exited || r.child.exitCode !== null) return res();
            r.child.once('exit', () => res());
            r.child.kill('SIGKILL');
          }),
      ),
    );
  }

  // Serialises calls; restarts dead processes first (replaying the last init/load). A call other than generate
  // is sent once the generates before it have been answered: were the worker to die under them, it is then sent
  // to the restarted one instead of failing with them.
  private enqueue<T>(fn: () => Promise<T>, afterGenerates = true): Promise<T> {
    const run = async () => {
      if (afterGenerates) await Promise.allSettled([...this.inFlight]);
      if (this.closed) throw new Error('policy worker is closed');
      if (this.dead) {
        await this.killAll();
        this.restarts++;
        await this.spawnAll();
        const m = this.lastModel;
        this.optimizerSteps = 0; // a fresh process; the replayed model brings its own count, as its optimizer state
        const replay =
          m?.op === 'init'
            ? await this.send('init', { config: m.config, seed: m.seed }, {})
            : m?.op === 'load'
              ? await this.send('load', { dir: m.dir }, {})
              : null;
        if (replay) this.tookSteps(replay.header.result);
      }
      return fn();
    };
    const p = this.queue.then(run, run);
    this.queue = p.catch(() => {});
    return p;
  }

  private async send(
    op: string,
    header: Record<string, unknown>,
    arrays: Record<string, WireArray>,
    signals?: (AbortSignal | undefined)[],
  ): Promise<Frame> {
    const id = this.nextId++;
    // rank 0 passes the request on to the ranks that must run it too (python/rstar2_worker/loop.py)
    const reply = this.ranks[0].call(id, { ...header, op }, arrays);
    const off = signals ? this.cancelRows(id, signals) : () => {};
    reply.then(off, off);
    const limit = this.callTimeoutMs;
    if (!(limit > 0)) return reply;
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, rej) => {
      timer = setTimeout(() => {
        this.dead = `policy worker call '${op}' did not answer within ${limit} ms; killed it`;
        for (const r of this.ranks) if (!r.exited) r.child.kill('SIGKILL');
        rej(new Error(`${this.dead} (it restarts on the next call)`));
      }, limit);
    });
    reply.catch(() => {});
    try {
      return await Promise.race([reply, timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  // Row i of generate `id` stops between decode steps once signals[i] aborts: a cancel frame, sent outside the
  // call queue, which the worker reads while it generates. Returns what removes the listeners.
  private cancelRows(id: number, signals: (AbortSignal | undefined)[]): () => void {
    const stdin = this.ranks[0].child.stdin;
    const offs = signals.map((s, row) => {
      const cancel = () => stdin?.write(encodeFrame({ op: 'cancel', target: id, rows: [row] }));
      if (s?.aborted) cancel();
      else s?.addEventListener('abort', cancel, { once: true });
      return () => s?.removeEventListener('abort', cancel);
    });
    return () => {
      for (const f of offs) f();
    };
  }

  async init(config: ModelConfig, seed = 0): Promise<ModelInfo> {
    return this.enqueue(async () => {
      const f = await this.send('init', { config, seed }, {});
      this.lastModel = { op: 'init', config, seed };
      this.tookSteps(f.header.result);
      return f.header.result as ModelInfo;
    });
  }

  async load(dir: string): Promise<ModelInfo> {
    const abs = resolve(dir);
    return this.enqueue(async () => {
      const f = await this.send('load', { dir: abs }, {});
      this.lastModel = { op: 'load', dir: abs };
      this.tookSteps(f.header.result);
      return f.header.result as ModelInfo;
    });
  }

  /** Writes config.json, the weights and (with `optimizer`) optimizer.pt; returns the weight files written. */
  /** Drops the optimizer state and step count on every rank (the next train step starts a fresh AdamW). */
  async resetOptimizer(): Promise<void> {
    await this.enqueue(async () => {
      await this.send('reset_optimizer', {}, {});
      this.optimizerSteps = 0;
    });
  }

  private tookSteps(result: unknown): void {
    const step = (result as { step?: unknown }).step;
    if (!(Number.isInteger(step) && (step as number) >= 0))
      throw new Error(`policy worker reported no optimizer step count (step: ${JSON.stringify(step)})`);
    this.optimizerSteps = step as number;
  }

  async save(dir: string, opts: SaveOptions = {}): Promise<string[]> {
    const abs = resolve(dir);
    const { shards, maxShardBytes } = opts;
    if (shards !== undefined && !(Number.isInteger(shards) && shards >= 1))
      throw new Error(`save: shards must be a positive integer, got ${shards}`);
    if (maxShardBytes !== undefined && !(Number.isInteger(maxShardBytes) && maxShardBytes >= 1))
      throw new Error(`save: maxShardBytes must be a positive integer, got ${maxShardBytes}`);
    const f = await this.enqueue(() =>
      this.send('save', { dir: abs, optimizer: Boolean(opts.optimizer), shards, maxShardBytes }, {}),
    );
    return (f.header.result as { files: string[] }).files;
  }

  /** `signals[i]`, where given, stops row i early: it comes back with what it has, finishReason 'abort'. */
  async generate(
    prompts: number[][],
    sampling: SamplingParams,
    signals?: (AbortSignal | undefined)[],
  ): Promise<GenerateResult[]> {
    if (prompts.length === 0) return [];
    const { flat, lens } = packRagged(prompts, 'prompts');
    if (lens.some((n) => n === 0)) throw new Error('generate: every prompt needs at least one token');
    // sent in call order, but the queue does not wait for the reply: the worker's engine takes generate calls
    // while others run, and holds back any other call until the generates before it have finished
    const sent = await this.enqueue(async () => {
      const reply = this.send('generate', { sampling }, { ids: flat, lens }, signals);
      this.inFlight.add(reply);
      const done = () => this.inFlight.delete(reply);
      reply.then(done, done);
      return { reply };
    }, false);
    const f = await sent.reply;
    const outLens = f.arrays.out_lens as Int32Array;
    const ids = unpackRagged(f.arrays.out_ids, outLens);
    const lps = unpackRagged(f.arrays.out_logprobs, outLens);
    const r = f.header.result as {
      finish: GenerateResult['finishReason'][];
      cached?: number[];
      retractions?: number[];
    };
    return ids.map((outputIds, i) => ({
      outputIds,
      logprobs: lps[i],
      finishReason: r.finish[i],
      cachedTokens: r.cached?.[i] ?? 0,
      retractions: r.retractions?.[i] ?? 0,
    }));
  }

  /** The engine's load as SGLang reports it (rows running and queued, KV tokens held and in all; 0 without a
   *  model) and its counters since the model was set. Answered between engine steps, not after the running
   *  requests. */
  async engineLoad(): Promise<EngineStats> {
    if (this.closed) throw new Error('policy worker is closed');
    // a dead worker restarts here as for any call: a scheduler that saw its load check fail would keep the
    // engine down, with no generate left to bring it back
    const f = this.dead
      ? await this.enqueue(() => this.send('engine_load', {}, {}))
      : await this.ranks[0].call(this.nextId++, { op: 'engine_load' }, {});
    return f.header.result as EngineStats;
  }

  async logprobs(seqs: number[][], opts: LogprobsOptions = {}): Promise<LogprobsResult[]> {
    if (seqs.length === 0) return [];
    const { flat, lens } = packRagged(seqs, 'seqs');
    return this.enqueue(async () => {
      const f = await this.send('logprobs', { ...opts }, { ids: flat, lens });
      const lp = unpackRagged(f.arrays.logprobs, lens);
      const ent = unpackRagged(f.arrays.entropy, lens);
      const top = unpackRagged(f.arrays.argmax, lens);
      return lp.map((logprobs, i) => ({ logprobs, entropy: ent[i], argmax: top[i].map((x) => x === 1) }));
    });
  }

  async trainStep(batch: TrainBatch, opts: TrainOptions): Promise<TrainStats> {
    const arrays = packTrainBatch(batch);
    if (!(typeof opts?.lr === 'number' && opts.lr >= 0))
      throw new Error('trainStep: opts.lr must be a number ≥ 0');
    const { warmupSteps = 0, ...sent } = opts;
    if (!(Number.isInteger(warmupSteps) && warmupSteps >= 0))
      throw new Error(`trainStep: opts.warmupSteps must be an integer ≥ 0, got ${warmupSteps}`);
    const parsed = TrainOptionsSchema.safeParse(sent);
    if (!parsed.success) {
      const i = parsed.error.issues[0];
      throw new Error(`trainStep: opts.${i.path.join('.')}: ${i.message}`);
    }
    return this.enqueue(async () => {
      // the count read here, after any restart's replay: the step the worker takes next
      const full: WorkerTrainOptions = {
        ...parsed.data,
        lr: warmupLr(parsed.data.lr, warmupSteps, this.optimizerSteps),
      };
      const f = await this.send('train_step', { loss: batch.loss, opts: full }, arrays);
      this.tookSteps(f.header.result);
      return f.header.result as TrainStats;
    });
  }

  /**
   * Joins `g` as its rank 0 (the engines join as the other ranks at the same time; fails after `timeoutS` if
   * they do not) and returns what each broadcast will carry.
   */
  async joinWeightGroup(g: WeightGroup, timeoutS = 600): Promise<WeightMeta> {
    return this.enqueue(async () => {
      const { masterAddress: addr, masterPort: port, worldSize, groupName, backend, bucketTimeoutS } = g;
      const f = await this.send(
        'weights_join',
        { addr, port, worldSize, groupName, backend, timeoutS, opTimeoutS: bucketTimeoutS },
        {},
      );
      return f.header.result as WeightMeta;
    });
  }

  /** Broadcasts every weight over the joined group, while each engine receives them. */
  async broadcastWeights(): Promise<{ tensors: number; bytes: number; timeS: number }> {
    return this.enqueue(async () => {
      const f = await this.send('weights_broadcast', {}, {});
      return f.header.result as { tensors: number; bytes: number; timeS: number };
    });
  }

  /** `rstar2 serve`: joins a trainer's weight-update group `g` as its rank `rank` (the trainer joins at once). */
  async joinWeightGroupAsEngine(g: WeightGroup, rank: number): Promise<void> {
    await this.enqueue(async () => {
      const { masterAddress: addr, masterPort: port, worldSize, groupName, backend, timeoutS } = g;
      await this.send(
        'weights_engine_join',
        { addr, port, rank, worldSize, groupName, backend, timeoutS },
        {},
      );
    });
  }

  /** One bucket of a trainer's broadcast, held until `commit`, which swaps every held bucket in at once and drops
   *  the cached prefixes. A bucket that fails drops what was held and leaves the group; the old weights serve on. */
  async receiveWeights(meta: WeightMeta, groupName: string, commit: boolean): Promise<{ applied: number }> {
    return this.enqueue(async () => {
      const f = await this.send('weights_receive', { ...meta, groupName, commit }, {});
      return f.header.result as { applied: number };
    });
  }

  /** Drops the engine's cached prefixes; refused while requests run or wait (as SGLang's /flush_cache). */
  async flushCache(): Promise<void> {
    if (this.closed) throw new Error('policy worker is closed');
    if (this.dead) await this.enqueue(() => this.send('flush_cache', {}, {}));
    else await this.ranks[0].call(this.nextId++, { op: 'flush_cache' }, {});
  }

  /** Bench hook: runs the bare PyTorch baseline loop inside the worker (bench/worker.ts, which starts the worker
   *  with python/bench/bare_bench.py on its PYTHONPATH). */
  async bareBench(
    spec:
      | { kind: 'generate'; batch: number; prompt: number; new: number }
      | { kind: 'train'; batch: number; len: number },
  ): Promise<number> {
    return this.enqueue(async () => {
      const f = await this.send('bare_bench', spec, {});
      return (f.header.result as { tokS: number }).tokS;
    });
  }

  async close(): Promise<void> {
    if (this.closed) return;
    await this.queue;
    await Promise.allSettled([...this.inFlight]);
    this.closed = true;
    await Promise.all(
      this.ranks.map(
        (r) =>
          new Promise<void>((res) => {
            if (r.exited || r.child.exitCode !== null) return res();
            const t = setTimeout(() => r.child.kill('SIGKILL'), 5000);
            r.child.once('exit', () => {
              clearTimeout(t);
              res();
            });
            r.child.stdin?.end(); // EOF: the worker exits cleanly
          }),
      ),
    );
  }
}

function packTrainBatch(batch: TrainBatch): Record<string, WireArray> {
  if (batch?.loss !== 'grpo' && batch?.loss !== 'sft') {
    throw new Error(`trainStep: batch.loss must be 'grpo' or 'sft', got ${JSON.stringify(batch?.loss)}`);
  }
  const seqs = batch.sequences;
  if (!Array.isArray(seqs) || seqs.length === 0) throw new Error('trainStep: batch.sequences is empty');
  const { flat, lens } = packRagged(
    seqs.map((s) => s.ids),
    'sequences[].ids',
  );
  const mask = new Int32Array(flat.length);
  const old = new Float32Array(flat.length);
  const hasOld = new Int32Array(seqs.length);
  const adv = new Float32Array(seqs.length);
  let off = 0;
  seqs.forEach((s, i) => {
    const n = s.ids.length;
    if (!Array.isArray(s.mask) || s.mask.length !== n) {
      throw new Error(`trainStep: sequences[${i}].mask has length ${s.mask?.length}, ids has ${n}`);
    }
    if (n > 0 && s.mask[0])
      throw new Error(`trainStep: sequences[${i}].mask[0] must be 0 (nothing predicts the first token)`);
    if (batch.loss === 'grpo') {
      if (typeof s.advantage !== 'number' || !Number.isFinite(s.advantage)) {
        throw new Error(`trainStep: sequences[${i}].advantage must be a finite number for loss 'grpo'`);
      }
      adv[i] = s.advantage;
    }
    if (s.oldLogprobs !== undefined) {
      if (s.oldLogprobs.length !== n) {
        throw new Error(
          `trainStep: sequences[${i}].oldLogprobs has length ${s.oldLogprobs.length}, ids has ${n}`,
        );
      }
      hasOld[i] = 1;
    }
    for (let j = 0; j < n; j++) {
      const m = s.mask[j];
      if (m !== 0 && m !== 1)
        throw new Error(`trainStep: sequences[${i}].mask[${j}] = ${m}, expected 0 or 1`);
      mask[off + j] = m;
      if (hasOld[i]) old[off + j] = s.oldLogprobs?.[j] ?? 0;
    }
    off += n;
  });
  return { ids: flat, lens, mask, old_logprobs: old, has_old: hasOld, advantages: adv };
}
