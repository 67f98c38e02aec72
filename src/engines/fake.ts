import { sleep } from '../util/sleep.js';
import type { Engine, EngineLoad, FinishReason, GenerateResult, SamplingParams } from './types.js';

// A scripted engine for tests and benchmarks. `respond` decides the output for each call; the
// engine applies maxNewTokens and stop ids like a real backend would, and counts its calls.

export interface FakeReply {
  outputIds: number[];
  logprobs?: number[]; // default -0.5 per token
  finishReason?: FinishReason; // default: 'stop' if the last id is a stop id, else 'stop' anyway
  error?: string;
  delayMs?: number;
  retractions?: number; // reported as the engine's own (a pool that ran out of KV)
}

export type FakeResponder = (
  inputIds: number[],
  sampling: SamplingParams,
  call: number,
) => FakeReply | Promise<FakeReply>;

export interface FakeEngineOptions {
  name?: string;
  capacityTokens?: number;
  usedTokens?: () => number | undefined; // live usage to report from load()
}

export class FakeEngine implements Engine {
  readonly name: string;
  calls = 0;
  active = 0;
  maxActive = 0;
  private readonly capacity: number;

  constructor(
    private readonly respond: FakeResponder,
    private readonly opts: FakeEngineOptions = {},
  ) {
    this.name = opts.name ?? 'fake';
    this.capacity = opts.capacityTokens ?? 1 << 20;
  }

  async generate(inputIds: number[], s: SamplingParams, signal?: AbortSignal): Promise<GenerateResult> {
    const call = this.calls++;
    this.active++;
    this.maxActive = Math.max(this.maxActive, this.active);
    try {
      const r = await this.respond(inputIds, s, call);
      if (r.delayMs) await sleep(r.delayMs, signal);
      if (signal?.aborted)
        return { outputIds: [], logprobs: [], finishReason: 'abort', error: 'aborted by caller' };
      let ids = r.outputIds;
      let lps = r.logprobs ?? ids.map(() => -0.5);
      let finishReason: FinishReason = r.finishReason ?? 'stop';
      const stopAt = ids.findIndex((t) => s.stopTokenIds.includes(t));
      if (stopAt >= 0 && stopAt < ids.length - 1) {
        ids = ids.slice(0, stopAt + 1);
        lps = lps.slice(0, stopAt + 1);
        finishReason = 'stop';
      }
      if (ids.length > s.maxNewTokens) {
        ids = ids.slice(0, s.maxNewTokens);
        lps = lps.slice(0, s.maxNewTokens);
        finishReason = 'length';
      }
      const out: GenerateResult = { outputIds: ids, logprobs: lps, finishReason };
      if (r.error) out.error = r.error;
      if (r.retractions) out.retractions = r.retractions;
      return out;
    } finally {
      this.active--;
    }
  }

  async load(): Promise<EngineLoad> {
    const used = this.opts.usedTokens?.();
    return {
      capacityTokens: this.capacity,
      running: this.active,
      ...(used === undefined ? {} : { usedTokens: used }),
    };
  }

  async close(): Promise<void> {}
}
