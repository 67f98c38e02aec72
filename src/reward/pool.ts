// Off-main-thread verification: a small pool of threads (node:worker_threads), each check under a hard time limit.
// A check that overruns gets its thread terminated and replaced; a crashed thread's item is reported
// as an error result — every item always gets a result, in input order.

import { availableParallelism } from 'node:os';
import type { Worker } from 'node:worker_threads';
import { startThread } from '../util/thread.js';
import type { VerifyOptions, VerifyProfile, VerifyResult } from './types.js';
import { checkProfile, DEFAULTS, erroredScore, type Scored, toScored } from './verify.js';

export interface VerifyItem {
  pred: string;
  gold: string;
  opts?: VerifyOptions;
  /** The data row, for a reward module (opts.module). */
  row?: unknown;
}

export interface PoolOptions {
  /** Threads (default: min(4, cores)). */
  size?: number;
  /** Options applied to every item (an item's own opts win). */
  defaults?: VerifyOptions;
  /** Extra ms past an item's time limit before its thread is killed (default 1000). */
  graceMs?: number;
}

interface Task {
  id: number;
  item: VerifyItem;
  resolve: (r: VerifyResult) => void;
}

interface Slot {
  thread: Worker;
  ready: boolean;
  task: Task | null;
  timer: NodeJS.Timeout | null;
}

function failed(_item: VerifyItem, status: 'timeout' | 'error', reason: string): VerifyResult {
  return { correct: false, extracted: null, normalised: null, matchedBy: null, reason, status };
}

export class VerifierPool {
  private readonly slots: Slot[] = [];
  private readonly queue: Task[] = [];
  private nextId = 0;
  private closed = false;
  private readonly size: number;
  private readonly graceMs: number;

  constructor(private readonly opts: PoolOptions = {}) {
    if (opts.defaults?.profile !== undefined) checkProfile(opts.defaults.profile);
    this.size = Math.max(1, opts.size ?? Math.min(4, availableParallelism()));
    this.graceMs = opts.graceMs ?? 1000;
    for (let i = 0; i < this.size; i++) this.slots.push(this.spawn());
  }

  private spawn(): Slot {
    const slot: Slot = {
      thread: startThread('./verify-thread', import.meta.url),
      ready: false,
      task: null,
      timer: null,
    };
    slot.thread.on(
      'message',
      (m: { ready?: boolean; id?: number; result?: VerifyResult; error?: string }) => {
        if (m.ready) {
          slot.ready = true;
          this.pump();
          return;
        }
        const t = slot.task;
        if (!t || t.id !== m.id) return;
        this.finish(slot, m.result ?? failed(t.item, 'error', `verifier error: ${m.error ?? 'unknown'}`));
      },
    );
    slot.thread.on('error', (e) => this.crash(slot, `verifier thread crashed: ${e.message}`));
    slot.thread.on('exit', (code) => this.crash(slot, `verifier thread exited (code ${code})`));
    return slot;
  }

  private finish(slot: Slot, r: VerifyResult): void {
    if (slot.timer) clearTimeout(slot.timer);
    slot.timer = null;
    const t = slot.task;
    slot.task = null;
    t?.resolve(r);
    this.pump();
  }

  private crash(slot: Slot, reason: string): void {
    const i = this.slots.indexOf(slot);
    if (i < 0) return; // already replaced
    if (slot.timer) clearTimeout(slot.timer);
    const t = slot.task;
    slot.task = null;
    this.slots.splice(i, 1);
    t?.resolve(failed(t.item, 'error', reason));
    if (!this.closed) {
      this.slots.push(this.spawn());
      this.pump();
    }
  }

  private pump(): void {
    for (const slot of this.slots) {
      if (!slot.ready || slot.task || this.queue.length === 0) continue;
      const t = this.queue.shift() as Task;
      slot.task = t;
      const opts = { ...this.opts.defaults, ...t.item.opts };
      const timeoutMs = opts.timeoutMs ?? DEFAULTS.timeoutMs;
      slot.timer = setTimeout(() => this.kill(slot, timeoutMs), timeoutMs + this.graceMs);
      slot.thread.postMessage({ id: t.id, pred: t.item.pred, gold: t.item.gold, opts, row: t.item.row });
    }
  }

  private kill(slot: Slot, timeoutMs: number): void {
    const i = this.slots.indexOf(slot);
    if (i < 0) return;
    const t = slot.task;
    slot.task = null;
    slot.timer = null;
    this.slots.splice(i, 1);
    void slot.thread.terminate();
    // the limit the user set, not the grace on top of it (`verify --timeout-ms 1000` said "within 2000 ms")
    t?.resolve(failed(t.item, 'timeout', `time limit: no verdict within ${timeoutMs} ms, thread replaced`));
    if (!this.closed) {
      this.slots.push(this.spawn());
      this.pump();
    }
  }

  verify(item: VerifyItem): Promise<VerifyResult> {
    if (this.closed) return Promise.reject(new Error('VerifierPool is closed'));
    if (item.opts?.profile !== undefined) {
      try {
        checkProfile(item.opts.profile);
      } catch (e) {
        return Promise.reject(e);
      }
    }
    return new Promise((resolve) => {
      this.queue.push({ id: this.nextId++, item, resolve });
      this.pump();
    });
  }

  /** `scoreTrajectory` off the main thread: the same rule for errored trajectories, the check in a thread. */
  async score(
    t: { text: string; finish?: string },
    gold: string,
    profile?: VerifyProfile,
    row?: unknown,
  ): Promise<Scored> {
    const errored = erroredScore(t);
    if (errored) return errored;
    return toScored(
      await this.verify({ pred: t.text, gold, opts: profile === undefined ? undefined : { profile }, row }),
    );
  }

  /** Results in input order; never rejects for a single bad item (it gets an error result). */
  verifyBatch(items: VerifyItem[]): Promise<VerifyResult[]> {
    return Promise.all(items.map((it) => this.verify(it)));
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const t of this.queue.splice(0))
      t.resolve(failed(t.item, 'error', 'pool closed before the check ran'));
    await Promise.all(this.slots.splice(0).map((s) => s.thread.terminate()));
  }
}
