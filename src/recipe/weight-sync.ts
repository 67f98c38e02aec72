import { lookup } from 'node:dns/promises';
import { BlockList, connect, isIP } from 'node:net';
import type { WeightGroup, WeightMeta, WeightSyncEngine } from '../engines/types.js';
import { freePort } from '../util/net.js';

// Weight sync by broadcast (docs/DECISIONS.md, weight sync): the trainer's rank 0 and every engine rank join
// one process group once; after each update rank 0 broadcasts the weights while the engines receive them.
// Disk sync (save a checkpoint, engines reload it) stays the fallback: whenever a broadcast cannot be set up
// or fails, the caller syncs through disk and every later sync does too. Nothing is lost: the weights are
// still in the trainer, and a disk reload replaces every tensor an interrupted broadcast may have touched.

export const WEIGHT_SYNC_MODES = ['auto', 'disk', 'nccl'] as const;
export type WeightSyncMode = (typeof WEIGHT_SYNC_MODES)[number];

/** The trainer's side (PolicyWorker; a stand-in in tests). */
export interface BroadcastWorker {
  joinWeightGroup(g: WeightGroup, timeoutS?: number): Promise<WeightMeta>;
  broadcastWeights(): Promise<{ tensors: number; bytes: number; timeS: number }>;
  readonly restarts: number; // a restarted worker has left the group
}

export interface WeightSyncOptions {
  mode?: WeightSyncMode; // default 'auto'
  backend?: WeightGroup['backend']; // default 'nccl'; 'gloo' for CPU engines and tests
  master?: string; // ADDR[:PORT] the engines reach the trainer at; default: detected, any free port
  timeoutS?: number; // the group's join and collective timeout (default 600)
  log?: (line: string) => void;
}

// Loopback, RFC 1918, carrier-grade NAT (cluster overlays use it) and IPv6 unique-local / link-local.
const PRIVATE = new BlockList();
PRIVATE.addSubnet('127.0.0.0', 8);
PRIVATE.addSubnet('10.0.0.0', 8);
PRIVATE.addSubnet('172.16.0.0', 12);
PRIVATE.addSubnet('192.168.0.0', 16);
PRIVATE.addSubnet('100.64.0.0', 10);
PRIVATE.addAddress('::1', 'ipv6');
PRIVATE.addSubnet('fc00::', 7, 'ipv6');
PRIVATE.addSubnet('fe80::', 10, 'ipv6');

export function isPrivateAddress(ip: string): boolean {
  const v = isIP(ip);
  return v !== 0 && PRIVATE.check(ip, v === 6 ? 'ipv6' : 'ipv4');
}

/**
 * `auto`'s network rule: every engine is a plain-http URL whose host resolves only to private or loopback
 * addresses. NCCL needs each engine to open a connection back to the trainer and a fast link; a public address
 * (another site, a NAT, a proxy in front of https) gets neither, and there the disk path is the safe one.
 * Returns why not, or null when the rule holds.
 */
export async function unreachableReason(urls: string[]): Promise<string | null> {
  for (const u of urls) {
    const url = new URL(u);
    if (url.protocol !== 'http:') return `${u} is not plain http (a proxy is in the way)`;
    const host = url.hostname.replace(/^\[|\]$/g, '');
    let addrs: string[];
    try {
      addrs = isIP(host) ? [host] : (await lookup(host, { all: true })).map((a) => a.address);
    } catch (e) {
      return `${u}: cannot resolve ${host} (${(e as Error).message})`;
    }
    const pub = addrs.find((a) => !isPrivateAddress(a));
    if (pub) return `${u} resolves to ${pub}, not a private address`;
  }
  return null;
}

/**
 * Whether `mode` broadcasts to these engines: each engine's rank count when it does, else why not (an engine that
 * cannot join a group; for auto also the network rule).
 */
export async function broadcastPlan(
  engines: WeightSyncEngine[],
  mode: WeightSyncMode,
): Promise<{ ranks: number[] } | { why: string }> {
  if (mode === 'disk') return { why: '--weight-sync disk' };
  if (engines.length === 0) return { why: 'no engines' };
  const missing = engines.find((e) => !e.weightGroupRanks || !e.url);
  if (missing) return { why: `${missing.name} cannot join a weight-update group` };
  if (mode === 'auto') {
    const why = await unreachableReason(engines.map((e) => e.url as string));
    if (why) return { why };
  }
  try {
    return { ranks: await Promise.all(engines.map((e) => (e.weightGroupRanks as () => Promise<number>)())) };
  } catch (e) {
    return { why: (e as Error).message };
  }
}

/** The local address this host uses to reach `url`: the one the engine will see and can connect back to. */
function localAddressTowards(url: string): Promise<string> {
  const u = new URL(url);
  return new Promise((res, rej) => {
    const s = connect({ host: u.hostname.replace(/^\[|\]$/g, ''), port: Number(u.port || 80) });
    s.setTimeout(10_000, () => s.destroy(new Error(`connecting to ${url} timed out`)));
    s.once('connect', () => {
      const a = s.localAddress ?? '';
      s.destroy();
      res(a.replace(/^::ffff:/, ''));
    });
    s.once('error', rej);
  });
}

export class BroadcastSync {
  private off = false;
  private ranks: number[] | null = null; // each engine's rank count, once they said they can join
  private joined: { meta: WeightMeta; groupName: string; restarts: number } | null = null;
  private joins = 0;
  private readonly log: (line: string) => void;

  constructor(
    private readonly worker: BroadcastWorker,
    private readonly engines: WeightSyncEngine[],
    private readonly opts: WeightSyncOptions = {},
  ) {
    this.off = (opts.mode ?? 'auto') === 'disk' || engines.length === 0;
    this.log = opts.log ?? ((l) => console.error(l));
  }

  /** Whether broadcasts are still in use (false after a fallback to disk). */
  get active(): boolean {
    return !this.off;
  }

  /**
   * Sends the worker's current weights to every engine by broadcast. True when done; false when the caller must
   * sync through disk: broadcast is off, was refused, or failed now (warned once; disk from then on).
   */
  async push(version?: string): Promise<boolean> {
    if (this.off) return false;
    try {
      if (!this.ranks) {
        const plan = await broadcastPlan(this.engines, this.opts.mode ?? 'auto');
        if ('why' in plan) return this.fallBack(plan.why, this.opts.mode === 'nccl');
        this.ranks = plan.ranks;
      }
      if (!this.joined || this.joined.restarts !== this.worker.restarts) await this.join();
      const { meta, groupName } = this.joined as NonNullable<typeof this.joined>;
      const [sent] = await Promise.all([
        this.worker.broadcastWeights(),
        ...this.engines.map((e) => e.updateWeightsFromDistributed?.(meta, groupName, version)),
      ]);
      this.log(
        `weight sync ${version ?? ''}: broadcast ${sent.tensors} tensors, ` +
          `${(sent.bytes / 2 ** 20).toFixed(1)} MiB in ${sent.timeS.toFixed(2)} s`,
      );
      return true;
    } catch (e) {
      return this.fallBack(`broadcast failed: ${(e as Error).message}`, true);
    }
  }

  private fallBack(why: string, warn: boolean): false {
    this.off = true;
    this.log(`${warn ? 'warning: ' : ''}weight sync: ${why}; syncing through disk from now on`);
    return false;
  }

  private async join(): Promise<void> {
    const ranks = this.ranks as number[];
    const [addr, port] = (this.opts.master ?? '').split(':');
    const g: WeightGroup = {
      masterAddress: addr || (await localAddressTowards(this.engines[0].url as string)),
      masterPort: port ? Number(port) : await freePort(), // the group's store listens on every interface
      worldSize: 1 + ranks.reduce((a, b) => a + b, 0),
      // a new name per join: a worker restarted after a crash joins afresh beside the old group
      groupName: `rstar2_weights_${++this.joins}`,
      backend: this.opts.backend ?? 'nccl',
    };
    const restarts = this.worker.restarts;
    let offset = 1;
    const offsets = ranks.map((n) => (offset += n) - n);
    const [meta] = await Promise.all([
      this.worker.joinWeightGroup(g, this.opts.timeoutS ?? 600),
      ...this.engines.map((e, i) => e.initWeightsUpdateGroup?.(g, offsets[i])),
    ]);
    this.joined = { meta, groupName: g.groupName, restarts };
    this.log(
      `weight sync: joined ${g.groupName} (${g.backend}, ${g.worldSize} ranks) at ${g.masterAddress}:${g.masterPort}`,
    );
  }
}
