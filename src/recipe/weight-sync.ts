import { lookup } from 'node:dns/promises';
import { existsSync, readFileSync } from 'node:fs';
import { BlockList, connect, isIP } from 'node:net';
import { join } from 'node:path';
import type { WeightGroup, WeightMeta, WeightSyncEngine } from '../engines/index.js';
import { freePort } from '../util/net.js';
import type { ModelConfig } from '../worker/index.js';

// Weight sync by broadcast (docs/DECISIONS.md, weight sync): the trainer's rank 0 and every engine rank join
// one process group once; after each update rank 0 broadcasts the weights while the engines receive them.
// Disk sync (save a checkpoint, engines reload it) stays the fallback: whenever a broadcast cannot be set up
// or fails, the caller syncs through disk, and every later sync does too, except that a push failing once after a
// good join (an engine restarted mid-run left the group) joins a new group at the next sync. Nothing is lost: the weights are
// still in the trainer, and a disk reload replaces every tensor an interrupted broadcast may have touched.

export const WEIGHT_SYNC_MODES = ['auto', 'disk', 'nccl'] as const;
export type WeightSyncMode = (typeof WEIGHT_SYNC_MODES)[number];

export const SYNC_DTYPES = ['auto', 'bfloat16', 'float16', 'float32'] as const;
export type SyncDtype = Exclude<(typeof SYNC_DTYPES)[number], 'auto'>;
const DTYPE_BYTES: Record<string, number> = { float32: 4, bfloat16: 2, float16: 2 };

/**
 * The largest engine update call by default. SGLang allocates every tensor of a call on the GPU before it loads any
 * (model_runner.update_weights_from_distributed), in the memory its KV pool leaves: 1 − mem_fraction_static of
 * the GPU (≈ 10–12 % at its defaults), which activations and CUDA graphs share. slime's and verl's buckets are
 * 512 MiB too. A tensor larger than a bucket goes alone (a 7B model's embedding, 1.0 GiB in bf16).
 */
export const DEFAULT_BUCKET_MIB = 512;

/** How long one bucket may take to reach every engine by default: a 512 MiB bucket takes well under a second over
 *  NCCL and a few over gloo, so an engine that stopped receiving is found in a minute, not after the join's 600 s. */
export const DEFAULT_BUCKET_TIMEOUT_S = 60;

/** The engines' dtype for `setting` 'auto': the one the engines that report theirs agree on (vLLM reports it;
 *  SGLang only a `--dtype` other than auto), else as both read `--dtype auto`: the model's own, except that a float32
 *  checkpoint is served in float16 (vLLM's `_get_and_verify_dtype`, SGLang's `model_config.py`), so start them with
 *  `--dtype bfloat16` to train in bf16. */
export function resolveSyncDtype(
  setting: (typeof SYNC_DTYPES)[number],
  config?: Record<string, unknown>,
  reported: (string | undefined)[] = [],
): SyncDtype {
  if (setting !== 'auto') return setting;
  const served = new Set(reported.filter((d) => d !== undefined && d !== 'auto'));
  const [one] = served;
  if (served.size === 1 && (SYNC_DTYPES as readonly (string | undefined)[]).includes(one))
    return one as SyncDtype;
  const own = config?.torch_dtype ?? config?.dtype;
  return own === 'bfloat16' ? own : 'float16';
}

/** Splits one broadcast into engine calls of at most `maxBytes` each, in order (a larger tensor alone). */
export function buckets(meta: WeightMeta, maxBytes: number): WeightMeta[] {
  const out: WeightMeta[] = [];
  let bytes = 0;
  for (const [i, name] of meta.names.entries()) {
    const b = tensorBytes(meta.shapes[i], meta.dtypes[i]);
    const cur = out.at(-1);
    if (!cur || bytes + b > maxBytes) {
      out.push({ names: [name], dtypes: [meta.dtypes[i]], shapes: [meta.shapes[i]] });
      bytes = b;
    } else {
      cur.names.push(name);
      cur.dtypes.push(meta.dtypes[i]);
      cur.shapes.push(meta.shapes[i]);
      bytes += b;
    }
  }
  return out;
}

export function tensorBytes(shape: number[], dtype: string): number {
  const size = DTYPE_BYTES[dtype];
  if (size === undefined) throw new Error(`weight sync: unknown dtype ${dtype}`);
  return shape.reduce((a, b) => a * b, 1) * size;
}

/** What each sync sends: tensors, bytes in all, its buckets and the largest one. */
export function syncPlan(meta: WeightMeta, bucketBytes: number) {
  const parts = buckets(meta, bucketBytes);
  const size = (m: WeightMeta) => m.names.reduce((a, _, i) => a + tensorBytes(m.shapes[i], m.dtypes[i]), 0);
  return {
    tensors: meta.names.length,
    bytes: size(meta),
    buckets: parts.length,
    largestBucket: Math.max(0, ...parts.map(size)),
    dtypes: [...new Set(meta.dtypes)],
  };
}

/**
 * The tensors a broadcast of this model carries, as the worker announces them (weight_sync.meta: Hugging Face
 * names, a tied lm_head left out), in `dtype`: read from the safetensors headers of a model directory, else
 * built from a Qwen2/Qwen3 config (a preset).
 */
export function modelWeights(
  config: ModelConfig & Record<string, unknown>,
  dtype: SyncDtype,
  dir?: string | null,
): WeightMeta {
  const tensors: [string, number[]][] = dir ? storedShapes(dir) : presetShapes(config);
  const kept = tensors.filter(([n]) => !(config.tie_word_embeddings && n === 'lm_head.weight'));
  return { names: kept.map(([n]) => n), dtypes: kept.map(() => dtype), shapes: kept.map(([, s]) => s) };
}

function storedShapes(dir: string): [string, number[]][] {
  const index = join(dir, 'model.safetensors.index.json');
  const files = existsSync(index)
    ? [
        ...new Set(
          Object.values(JSON.parse(readFileSync(index, 'utf8')).weight_map as Record<string, string>),
        ),
      ]
    : ['model.safetensors'];
  const out: [string, number[]][] = [];
  for (const f of files) {
    const buf = readFileSync(join(dir, f));
    const header = JSON.parse(buf.subarray(8, 8 + Number(buf.readBigUInt64LE(0))).toString('utf8'));
    for (const [name, t] of Object.entries(header))
      if (name !== '__metadata__') out.push([name, (t as { shape: number[] }).shape]);
  }
  return out;
}

function presetShapes(c: ModelConfig & Record<string, unknown>): [string, number[]][] {
  const h = c.hidden_size;
  const heads = c.num_attention_heads;
  const hd = (c.head_dim as number | undefined) ?? h / heads;
  const q = heads * hd;
  const kv = (c.num_key_value_heads ?? heads) * hd;
  const qwen3 = c.model_type === 'qwen3';
  const bias = (c.attention_bias as boolean | undefined) ?? !qwen3;
  const out: [string, number[]][] = [['model.embed_tokens.weight', [c.vocab_size, h]]];
  for (let l = 0; l < c.num_hidden_layers; l++) {
    const p = `model.layers.${l}.`;
    const proj = (n: string, o: number, i: number) => {
      out.push([`${p}self_attn.${n}.weight`, [o, i]]);
      if (bias && n !== 'o_proj') out.push([`${p}self_attn.${n}.bias`, [o]]);
    };
    proj('q_proj', q, h);
    proj('k_proj', kv, h);
    proj('v_proj', kv, h);
    proj('o_proj', h, q);
    if (qwen3) out.push([`${p}self_attn.q_norm.weight`, [hd]], [`${p}self_attn.k_norm.weight`, [hd]]);
    out.push(
      [`${p}mlp.gate_proj.weight`, [c.intermediate_size, h]],
      [`${p}mlp.up_proj.weight`, [c.intermediate_size, h]],
      [`${p}mlp.down_proj.weight`, [h, c.intermediate_size]],
      [`${p}input_layernorm.weight`, [h]],
      [`${p}post_attention_layernorm.weight`, [h]],
    );
  }
  out.push(['model.norm.weight', [h]], ['lm_head.weight', [c.vocab_size, h]]);
  return out;
}

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
  timeoutS?: number; // the group's join timeout (default 600)
  /** Each bucket's deadline, and each collective's timeout (default DEFAULT_BUCKET_TIMEOUT_S). */
  bucketTimeoutS?: number;
  /** The dtype the worker sends (its RSTAR2_WEIGHT_SYNC_DTYPE): an engine that reports another is synced through
   *  disk. Unset: whatever the worker announces, unchecked. */
  dtype?: SyncDtype;
  bucketBytes?: number; // the largest engine update call (default DEFAULT_BUCKET_MIB)
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
  dtype?: SyncDtype,
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
    // an engine in another dtype would get weights rounded to ours and then cast again; a disk reload is exact
    for (const e of dtype ? engines : []) {
      const own = (await e.describe?.())?.dtype;
      if (own && own !== dtype)
        return { why: `${e.name} serves ${own} and the trainer would send ${dtype} (weightSync.dtype)` };
    }
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
  private joined: { meta: WeightMeta; parts: WeightMeta[]; groupName: string; restarts: number } | null =
    null;
  private joins = 0;
  private failed = false; // the last push failed after its group was joined
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
   * sync through disk: broadcast is off, was refused, or failed now (warned; disk from then on, but for one
   * failed push after a good join, which joins a new group next time).
   */
  async push(version?: string): Promise<boolean> {
    if (this.off) return false;
    let joining = false;
    try {
      if (!this.ranks) {
        const plan = await broadcastPlan(this.engines, this.opts.mode ?? 'auto', this.opts.dtype);
        if ('why' in plan) return this.fallBack(plan.why, this.opts.mode === 'nccl');
        this.ranks = plan.ranks;
      }
      if (!this.joined || this.joined.restarts !== this.worker.restarts) {
        // a join waits for every engine's ranks: after a failed push, one that does not answer (killed, not yet
        // restarted) would hold the trainer for the whole join timeout, so that sync goes through disk instead
        const gone = this.failed ? await this.unanswering() : undefined;
        if (gone) {
          this.log(`weight sync: ${gone} does not answer; this sync goes through disk`);
          return false;
        }
        joining = true;
        await this.join();
        joining = false;
      }
      const { meta, parts, groupName } = this.joined as NonNullable<typeof this.joined>;
      // one call per bucket, each once the one before it is loaded; rank 0 sends the tensors in the same order.
      // Each bucket has its own deadline: an engine that stops part-way fails the push that soon (rank 0's send
      // times out as soon, each collective's timeout being the same), and a disk sync replaces what it got
      const limitS = this.opts.bucketTimeoutS ?? DEFAULT_BUCKET_TIMEOUT_S;
      const [sent] = await Promise.all([
        this.worker.broadcastWeights(),
        ...this.engines.map(async (e) => {
          for (const [i, part] of parts.entries())
            await deadline(
              e.updateWeightsFromDistributed?.(part, groupName, { version, last: i === parts.length - 1 }),
              limitS,
              `${e.name}: bucket ${i + 1} of ${parts.length} did not arrive within ${limitS} s`,
            );
        }),
      ]);
      this.log(
        `weight sync ${version ?? ''}: broadcast ${sent.tensors} tensors (${[...new Set(meta.dtypes)].join(', ')}), ` +
          `${(sent.bytes / 2 ** 20).toFixed(1)} MiB in ${parts.length} bucket${parts.length > 1 ? 's' : ''}, ` +
          `${sent.timeS.toFixed(2)} s`,
      );
      this.failed = false;
      return true;
    } catch (e) {
      const why = `broadcast failed: ${(e as Error).message}`;
      // a join that fails, or a second push in a row, is not going to work: disk from now on. A push that fails
      // once (an engine killed or restarted mid-run, which left the group) joins a new group at the next sync
      if (joining || this.failed) return this.fallBack(why, true);
      this.failed = true;
      this.joined = null;
      this.log(`warning: weight sync: ${why}; this sync goes through disk, the next joins a new group`);
      return false;
    }
  }

  /** The first engine that does not answer a load read, if any. */
  private async unanswering(): Promise<string | undefined> {
    const answers = (e: WeightSyncEngine) =>
      e
        .load()
        .then(() => true)
        .catch(() => false);
    const ok = await Promise.all(this.engines.map(answers));
    return this.engines[ok.indexOf(false)]?.name;
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
      timeoutS: this.opts.timeoutS ?? 600,
      bucketTimeoutS: this.opts.bucketTimeoutS ?? DEFAULT_BUCKET_TIMEOUT_S,
    };
    const restarts = this.worker.restarts;
    let offset = 1;
    const offsets = ranks.map((n) => (offset += n) - n);
    const [meta] = await Promise.all([
      this.worker.joinWeightGroup(g, g.timeoutS),
      ...this.engines.map((e, i) => e.initWeightsUpdateGroup?.(g, offsets[i])),
    ]);
    const want = this.opts.dtype;
    const other = want && meta.dtypes.find((d) => d !== want);
    if (other)
      throw new Error(
        `the worker announces ${other} weights, not ${want}: it runs without RSTAR2_WEIGHT_SYNC_DTYPE`,
      );
    const parts = buckets(meta, this.opts.bucketBytes ?? DEFAULT_BUCKET_MIB * 2 ** 20);
    this.joined = { meta, parts, groupName: g.groupName, restarts };
    this.log(
      `weight sync: joined ${g.groupName} (${g.backend}, ${g.worldSize} ranks) at ${g.masterAddress}:${g.masterPort}`,
    );
  }
}

/** `p`, or a rejection with `why` once `seconds` have passed without it settling. */
async function deadline<T>(p: Promise<T> | undefined, seconds: number, why: string): Promise<T | undefined> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, rej) => {
    timer = setTimeout(() => rej(new Error(why)), seconds * 1000);
  });
  try {
    return await Promise.race([p, late]);
  } finally {
    clearTimeout(timer);
  }
}
