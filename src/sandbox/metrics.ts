import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from 'prom-client';
import type { PoolStats } from './pool.js';
import type { RunStatus } from './types.js';

// The service's Prometheus metrics, written by prom-client (escaping, formatting) into a registry of
// this server's own, so several servers in one process (tests, embedded use) never share or collide.
// Label values come from closed sets: a route the service does not serve is counted as `other`, an
// outcome outside RunStatus as `other`, so no client can add series or break the exposition.
// Process and event-loop metrics (prom-client's default set) describe the process, not a server:
// they live in one registry per process, collected once and appended to every server's scrape.

const BUCKETS_S = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];

/** The `route` label of requests to paths the service does not serve. */
export const OTHER_ROUTE = 'other';

const STATUSES: ReadonlySet<string> = new Set<RunStatus>([
  'ok',
  'error',
  'timeout',
  'oom',
  'output_limit',
  'killed',
  'queue_timeout',
  'busy',
  'invalid_input',
  'internal_error',
]);

let processRegistry: Registry | undefined;

/** prom-client's default metrics (process_*, nodejs_*: CPU, memory, handles, GC, event-loop lag from
 * perf_hooks' delay histogram), registered once per process: each collectDefaultMetrics call starts a
 * delay monitor and a GC observer that live as long as the process. */
function processMetrics(): Registry {
  if (!processRegistry) {
    processRegistry = new Registry();
    collectDefaultMetrics({ register: processRegistry });
  }
  return processRegistry;
}

/** Each shard's pool counts under a `shard` label (its index): the calls it runs and queues, its sessions, and as
 * counters the calls it finished and its sandbox restarts (read from the pools at each scrape). */
function shardMetrics(read: () => PoolStats[], registers: Registry[]): void {
  const labelNames = ['shard'];
  const each = (set: (shard: string, s: PoolStats) => void) => {
    for (const [i, s] of read().entries()) set(String(i), s);
  };
  const gauge = (name: string, help: string, key: keyof PoolStats) =>
    new Gauge({
      name,
      help,
      labelNames,
      registers,
      collect() {
        each((shard, s) => this.set({ shard }, s[key]));
      },
    });
  const counter = (name: string, help: string, key: keyof PoolStats) =>
    new Counter({
      name,
      help,
      labelNames,
      registers,
      collect() {
        this.reset();
        each((shard, s) => this.inc({ shard }, s[key]));
      },
    });
  gauge('rstar2_sandbox_shard_in_flight', 'Calls each sandbox shard is running.', 'inFlight');
  gauge('rstar2_sandbox_shard_queued', 'Calls waiting inside each sandbox shard.', 'queued');
  gauge('rstar2_sandbox_shard_sessions', 'Live stateful sessions in each sandbox shard.', 'sessions');
  gauge(
    'rstar2_sandbox_shard_kernel_limits',
    "1 where the kernel holds each call's memory and process limits (a memory and a pids cgroup per slot), " +
      '0 where the sandbox polls /proc for them every 100 ms.',
    'kernelLimits',
  );
  counter('rstar2_sandbox_shard_calls_total', 'Calls each sandbox shard finished.', 'completed');
  counter('rstar2_sandbox_shard_restarts_total', "Restarts of each sandbox shard's broker.", 'restarts');
}

export class ServiceMetrics {
  readonly registry = new Registry();
  readonly contentType = this.registry.contentType;
  private readonly requests: Counter<'route'>;
  private readonly busy: Counter;
  private readonly items: Counter<'status'>;
  private readonly latency: Histogram;

  /** routes: the paths the service serves; any other path counts as `other`. shards: each sandbox shard's pool
   * counts (ShardedPool.shardStats), labelled by shard. */
  constructor(
    gauges: () => { queueDepth: number; inFlight: number; clients: number },
    private readonly routes: ReadonlySet<string>,
    shards?: () => PoolStats[],
  ) {
    const registers = [this.registry];
    const gauge = (name: string, help: string, read: (g: ReturnType<typeof gauges>) => number) =>
      new Gauge({
        name,
        help,
        registers,
        collect() {
          this.set(read(gauges()));
        },
      });
    gauge('rstar2_sandbox_queue_depth', 'Items admitted and waiting to start.', (g) => g.queueDepth);
    gauge('rstar2_sandbox_in_flight', 'Items running now.', (g) => g.inFlight);
    gauge('rstar2_sandbox_clients_waiting', 'Clients with at least one queued item.', (g) => g.clients);
    this.requests = new Counter({
      name: 'rstar2_sandbox_requests_total',
      help: `HTTP requests by route (paths the service does not serve: route="${OTHER_ROUTE}").`,
      labelNames: ['route'],
      registers,
    });
    this.busy = new Counter({
      name: 'rstar2_sandbox_busy_rejections_total',
      help: 'Requests refused because the queue was full.',
      registers,
    });
    this.items = new Counter({
      name: 'rstar2_sandbox_items_total',
      help: 'Finished items by status.',
      labelNames: ['status'],
      registers,
    });
    this.latency = new Histogram({
      name: 'rstar2_sandbox_item_latency_seconds',
      help: 'Admission to result, per item.',
      buckets: BUCKETS_S,
      registers,
    });
    if (shards) shardMetrics(shards, registers);
    processMetrics();
  }

  /** One request that passed the guard; `path` is the raw path, mapped to a served route or `other`. */
  request(path: string): void {
    this.requests.inc({ route: this.routes.has(path) ? path : OTHER_ROUTE });
  }

  rejectedBusy(): void {
    this.busy.inc();
  }

  /** One finished item: its outcome and its time from admission to result. */
  item(status: RunStatus, latencyMs: number): void {
    this.items.inc({ status: STATUSES.has(status) ? status : 'other' });
    this.latency.observe(latencyMs / 1000);
  }

  /** The exposition: this server's metrics, then the process's. */
  async render(): Promise<string> {
    const [own, proc] = await Promise.all([this.registry.metrics(), processMetrics().metrics()]);
    return `${own}\n${proc}`;
  }
}
