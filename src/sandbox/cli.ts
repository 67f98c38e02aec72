import { readFileSync } from 'node:fs';
import type { Command } from 'commander';
import { commaList, nonNegativeInt, port, positiveInt } from '../cli/index.js';
import { checkBind, resolveToken, TOKEN_ENV } from '../util/http-guard.js';
import { forTerminal } from '../util/terminal.js';
import type { ShardedPool } from './shards.js';
import { SHARDS_ENV } from './shards.js';
import { type CodeRunner, REDIS_PASSWORD_ENV } from './types.js';

interface PoolFlags {
  workers?: number;
  insecureNoSandbox?: boolean;
  preload?: string[];
  timeoutMs: number;
  memoryMb?: number;
  demoteAfterMs?: number;
  shards?: number;
}

/** The isolated pool: `--shards` broker+zygote pairs (one for a one-slot pool unless asked). */
async function startPool(f: PoolFlags, slotsDefault?: number): Promise<ShardedPool> {
  const { ShardedPool } = await import('./shards.js');
  return ShardedPool.start({
    shards: f.shards ?? (slotsDefault === 1 ? 1 : undefined),
    slots: f.workers ?? slotsDefault,
    isolation: f.insecureNoSandbox ? 'none' : undefined,
    preload: f.preload ?? [],
    timeoutMs: f.timeoutMs,
    ...(f.memoryMb ? { memoryMb: f.memoryMb } : {}),
    ...(f.demoteAfterMs === undefined ? {} : { demoteAfterMs: f.demoteAfterMs }),
  });
}

function poolOptions(cmd: Command): Command {
  return cmd
    .option(
      '--workers <n>',
      'executor slots of the local isolated pool, all shards together (default 4 x cores)',
      positiveInt(),
    )
    .option(
      '--shards <n>',
      `broker+zygote pairs the pool runs side by side, calls going to the least loaded (default $${SHARDS_ENV}, else one per 4 cores)`,
      positiveInt(),
    )
    .option(
      '--insecure-no-sandbox',
      'run Python without bubblewrap isolation (development only; loudly warned). Where namespaces are refused ' +
        '(a container), RSTAR2_SANDBOX_ISOLATION=landlock isolates without them',
    )
    .option(
      '--preload <mods>',
      'modules the zygote imports once, comma-separated (e.g. numpy,sympy)',
      commaList,
    )
    .option(
      '--timeout-ms <ms>',
      'wall-clock limit per call (code-judge MAX_EXECUTION_TIME)',
      positiveInt(),
      4000,
    )
    .option('--memory-mb <mb>', 'address-space limit per call', positiveInt())
    .option(
      '--demote-after-ms <ms>',
      'a call still running after this many ms gets the lowest CPU priority (default 50; 0 = never)',
      nonNegativeInt(),
    );
}

interface ServeFlags extends PoolFlags {
  port: number;
  host: string;
  token?: string;
  requestTimeoutMs: number;
  maxBodyMb: number;
  maxBodyInFlightMb: number;
  bodyIdleTimeoutMs: number;
  maxBatchItems: number;
  maxBatchOutputMb: number;
  maxSessionsPerClient: number;
  redis?: string;
  maxQueue: number;
  maxInFlight: number;
  quiet?: boolean;
}

/** Stops on SIGINT/SIGTERM after answering what is queued. */
function onSignal(stop: () => Promise<void>): void {
  let stopping = false;
  const handler = (sig: string) => {
    if (stopping) process.exit(1);
    stopping = true;
    process.stderr.write(
      `${JSON.stringify({ time: new Date().toISOString(), level: 'info', msg: `${sig}: stopping` })}\n`,
    );
    stop().then(
      () => process.exit(0),
      () => process.exit(1),
    );
  };
  process.on('SIGINT', () => handler('SIGINT'));
  process.on('SIGTERM', () => handler('SIGTERM'));
}

export function registerSandboxCommands(program: Command): void {
  const sandbox = program
    .command('sandbox')
    .description('isolated Python execution: service, Redis workers, one-off runs');

  poolOptions(
    sandbox
      .command('serve')
      .description(
        "HTTP service: code-judge-compatible routes (/run, /run/long-batch, /judge, ...), SandboxFusion's " +
          "/run_code (verl's sandbox tool; Python only), the native /v1 API and Prometheus /metrics",
      )
      .option('--port <port>', 'TCP port (0 = any free port)', port(), 8088)
      .option(
        '--host <host>',
        'address to bind; anything but a loopback address (127.0.0.1, ::1, localhost) needs a token',
        '127.0.0.1',
      )
      .option(
        '--token <token>',
        `require 'Authorization: Bearer <token>' on every route but /ping (16+ characters; ` +
          `default $${TOKEN_ENV}, which keeps it out of the process list)`,
      )
      .option('--request-timeout-ms <ms>', 'time allowed to receive a whole request', positiveInt(), 30000)
      .option('--max-body-mb <mb>', 'largest request body', positiveInt(), 64)
      .option(
        '--max-body-in-flight-mb <mb>',
        'request body bytes received and not yet parsed, all requests together; past it the body holding the most is refused',
        positiveInt(),
        128,
      )
      .option(
        '--body-idle-timeout-ms <ms>',
        'a request body that sends nothing for this long is cut (408)',
        positiveInt(),
        10000,
      )
      .option('--max-batch-items <n>', 'items in one request at most (413 past it)', positiveInt(), 4096)
      .option(
        '--max-batch-output-mb <mb>',
        'output one answer carries; items finishing after it is full are answered without theirs, saying why',
        positiveInt(),
        64,
      )
      .option(
        '--max-sessions-per-client <n>',
        'live stateful sessions one client (peer address; every local process is one) may hold (0 = only the pool limit)',
        nonNegativeInt(),
        4,
      )
      .option(
        '--redis <url>',
        'front door only: enqueue on Redis for `rstar2 sandbox worker` hosts (redis[s]://[:password@]host:port; ' +
          `a password in $${REDIS_PASSWORD_ENV} stays out of the process list)`,
      )
      .option(
        '--max-queue <n>',
        'items allowed to wait before requests are refused with 503 busy',
        positiveInt(),
        100000,
      )
      .option(
        '--max-in-flight <n>',
        'with --redis: items outstanding at the workers at once',
        positiveInt(),
        4096,
      )
      .option('--quiet', 'log only warnings and errors, not every request'),
  ).action(async (o: ServeFlags) => {
    const token = resolveToken(o.token);
    checkBind(o.host, token, 'sandbox service'); // before starting anything
    const { RedisRunner, RedisWorker } = await import('./redis.js');
    const { SandboxServer } = await import('./server.js');
    const closers: Array<() => Promise<void>> = [];
    let runner: CodeRunner;
    let concurrency: number;
    let numWorkers: (() => Promise<number>) | undefined;
    let backlog: (() => Promise<number>) | undefined;
    let shardStats: ShardedPool['shardStats'] | undefined;
    let sessionTtlMs: number | undefined;
    if (o.redis) {
      const front = await RedisRunner.connect(o.redis);
      runner = front;
      concurrency = o.maxInFlight;
      numWorkers = () => front.numWorkers();
      backlog = () => front.queueDepth();
      if (o.workers) {
        // A front door may also host a worker on its own machine.
        const pool = await startPool(o, 1);
        const worker = await RedisWorker.start(o.redis, pool, { concurrency: pool.slots });
        closers.push(
          () => worker.stop(),
          () => pool.close(),
        );
      }
      closers.push(() => front.close());
    } else {
      const pool = await startPool(o);
      runner = pool;
      concurrency = pool.slots;
      shardStats = () => pool.shardStats();
      sessionTtlMs = pool.shards[0].options.sessionTtlMs;
      closers.push(() => pool.close());
    }
    const server = new SandboxServer({
      runner,
      port: o.port,
      host: o.host,
      ...(token ? { token } : {}),
      requestTimeoutMs: o.requestTimeoutMs,
      maxBodyBytes: o.maxBodyMb * 2 ** 20,
      maxBodyBytesInFlight: o.maxBodyInFlightMb * 2 ** 20,
      bodyIdleTimeoutMs: o.bodyIdleTimeoutMs,
      maxBatchItems: o.maxBatchItems,
      maxBatchOutputBytes: o.maxBatchOutputMb * 2 ** 20,
      maxSessionsPerClient: o.maxSessionsPerClient,
      concurrency,
      maxQueue: o.maxQueue,
      timeoutMs: o.timeoutMs,
      ...(o.memoryMb ? { memoryMb: o.memoryMb } : {}),
      ...(numWorkers ? { numWorkers } : {}),
      ...(backlog ? { backlog } : {}),
      ...(shardStats ? { shardStats } : {}),
      ...(sessionTtlMs ? { sessionTtlMs } : {}),
      logRequests: !o.quiet,
    });
    await server.listen();
    onSignal(async () => {
      await server.close();
      for (const c of closers) await c();
    });
  });

  poolOptions(
    sandbox
      .command('worker')
      .description("worker host: pull calls from Redis and run them on this machine's isolated pool")
      .requiredOption(
        '--redis <url>',
        'Redis URL shared with the front door (`rstar2 sandbox serve --redis`); ' +
          `a password in $${REDIS_PASSWORD_ENV} stays out of the process list`,
      ),
  ).action(async (o: PoolFlags & { redis: string }) => {
    const { RedisWorker } = await import('./redis.js');
    const pool = await startPool(o);
    const worker = await RedisWorker.start(o.redis, pool, { concurrency: pool.slots });
    onSignal(async () => {
      await worker.stop();
      await pool.close();
    });
  });

  sandbox
    .command('run')
    .description('run one Python file in the sandbox and print the result')
    .argument('<file>', 'Python source file')
    .option('--stdin <file>', 'file whose content becomes stdin')
    .option('--tool', 'run it as the rStar2 python tool and print the text the model would see')
    .option('--json', 'print the full RunResult as JSON')
    .option(
      '--insecure-no-sandbox',
      'run without bubblewrap isolation (development only; in a container: RSTAR2_SANDBOX_ISOLATION=landlock)',
    )
    .option('--timeout-ms <ms>', 'wall-clock limit', positiveInt(), 4000)
    .option('--memory-mb <mb>', 'address-space limit', positiveInt())
    .option('--preload <mods>', 'modules to import before the call, comma-separated', commaList)
    .action(async (file: string, o: PoolFlags & { stdin?: string; tool?: boolean; json?: boolean }) => {
      const read = (p: string, what: string) => {
        try {
          return readFileSync(p, 'utf8');
        } catch (e) {
          throw new Error(
            `cannot read ${what} ${p}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`,
          );
        }
      };
      const code = read(file, 'source file');
      const stdin = o.stdin ? read(o.stdin, '--stdin file') : undefined;
      const pool = await startPool({ ...o, workers: 1 }, 1);
      try {
        const timeoutMs = o.timeoutMs;
        if (o.tool) {
          const { executePythonTool } = await import('./tool.js');
          const r = await executePythonTool({ code, input: stdin ?? '' }, pool, {
            timeoutMs,
            budget: Infinity,
          });
          process.stdout.write(
            o.json ? `${JSON.stringify(r, null, 2)}\n` : forTerminal(`${r.fullText}\n`, process.stdout),
          );
          process.exitCode = r.error ? 1 : 0;
          return;
        }
        const r = await pool.run({ code, timeoutMs, ...(stdin !== undefined ? { stdin } : {}) });
        if (o.json) process.stdout.write(`${JSON.stringify(r, null, 2)}\n`);
        else {
          // what the snippet printed is shown, not obeyed, on a terminal; a pipe gets it as printed
          process.stdout.write(forTerminal(r.stdout, process.stdout));
          process.stderr.write(forTerminal(r.stderr, process.stderr));
          process.stderr.write(
            `[${r.status}] exit=${r.exitCode ?? '-'}${r.signal ? ` signal=${r.signal}` : ''} wall=${r.wallMs.toFixed(1)}ms cpu=${r.cpuMs.toFixed(1)}ms peak=${r.peakMemoryKb}KB${r.truncated ? ' (output truncated)' : ''}${r.error ? ` ${forTerminal(r.error, process.stderr)}` : ''}\n`,
          );
        }
        process.exitCode = r.status === 'ok' ? 0 : (r.exitCode ?? 1) || 1;
      } finally {
        await pool.close();
      }
    });
}
