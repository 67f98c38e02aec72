import type { RunStatus } from './types.js';

// Prometheus text exposition, kept dependency-free: a handful of counters, two gauges and one
// latency histogram are all the service reports.

const BUCKETS_S = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];

export class ServiceMetrics {
  readonly outcomes = new Map<string, number>();
  readonly requests = new Map<string, number>();
  rejectedBusy = 0;
  private readonly bucketCounts = new Array<number>(BUCKETS_S.length).fill(0);
  private latencyCount = 0;
  private latencySum = 0;

  constructor(private readonly gauges: () => { queueDepth: number; inFlight: number; clients: number }) {}

  request(route: string): void {
    this.requests.set(route, (this.requests.get(route) ?? 0) + 1);
  }

  /** One finished item: its outcome and its time from admission to result. */
  item(status: RunStatus, latencyMs: number): void {
    this.outcomes.set(status, (this.outcomes.get(status) ?? 0) + 1);
    const s = latencyMs / 1000;
    this.latencyCount++;
    this.latencySum += s;
    for (let i = 0; i < BUCKETS_S.length; i++) if (s <= BUCKETS_S[i]) this.bucketCounts[i]++;
  }

  render(): string {
    const g = this.gauges();
    const lines: string[] = [];
    const head = (name: string, type: string, help: string) =>
      lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
    head('rstar2_sandbox_queue_depth', 'gauge', 'Items admitted and waiting to start.');
    lines.push(`rstar2_sandbox_queue_depth ${g.queueDepth}`);
    head('rstar2_sandbox_in_flight', 'gauge', 'Items running now.');
    lines.push(`rstar2_sandbox_in_flight ${g.inFlight}`);
    head('rstar2_sandbox_clients_waiting', 'gauge', 'Clients with at least one queued item.');
    lines.push(`rstar2_sandbox_clients_waiting ${g.clients}`);
    head('rstar2_sandbox_requests_total', 'counter', 'HTTP requests by route.');
    for (const [route, n] of this.requests)
      lines.push(`rstar2_sandbox_requests_total{route="${route}"} ${n}`);
    head('rstar2_sandbox_busy_rejections_total', 'counter', 'Requests refused because the queue was full.');
    lines.push(`rstar2_sandbox_busy_rejections_total ${this.rejectedBusy}`);
    head('rstar2_sandbox_items_total', 'counter', 'Finished items by status.');
    for (const [status, n] of this.outcomes)
      lines.push(`rstar2_sandbox_items_total{status="${status}"} ${n}`);
    head('rstar2_sandbox_item_latency_seconds', 'histogram', 'Admission to result, per item.');
    for (let i = 0; i < BUCKETS_S.length; i++)
      lines.push(`rstar2_sandbox_item_latency_seconds_bucket{le="${BUCKETS_S[i]}"} ${this.bucketCounts[i]}`);
    lines.push(`rstar2_sandbox_item_latency_seconds_bucket{le="+Inf"} ${this.latencyCount}`);
    lines.push(`rstar2_sandbox_item_latency_seconds_sum ${this.latencySum}`);
    lines.push(`rstar2_sandbox_item_latency_seconds_count ${this.latencyCount}`);
    return `${lines.join('\n')}\n`;
  }
}
