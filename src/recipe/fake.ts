import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { ChatExample } from '../data/index.js';
import type { Trajectory, TurnEvent } from '../rl/index.js';
import { Rng } from '../util/rng.js';
import type { TrainOptions, TrainStats } from '../worker/index.js';
import { answerText, demoStyle, type TaskProblem, toolCallText, toolObservationText } from './tasks.js';
import type { HeldoutScore, Policy, RolloutRequest, ScoredItem } from './trainer.js';

// A three-parameter stand-in policy for exercising the trainer without torch: logits for "call the tool",
// "the first call is broken", and "copy stdout correctly". SFT moves them toward the demo mix; GRPO moves
// them along advantage-weighted choices (a REINFORCE step on each Bernoulli). Deterministic per seed.

interface Params {
  tool: number;
  err: number;
  copy: number;
  steps: number;
  /** The seed of the last re-initialisation, if any. */
  seed?: number;
}

const sig = (x: number) => 1 / (1 + Math.exp(-x));
const enc = (s: string) => [...s].map((c) => c.charCodeAt(0) % 256);

/** The stats of a step that computed nothing (stand-in policies). */
export function emptyStats(lr = 0, step = 0): TrainStats {
  return {
    loss: 0,
    gradNorm: 0,
    clipFrac: 0,
    entropy: 0,
    tokens: 0,
    trainedTokens: 0,
    paddedTokens: 0,
    tokensPerS: 0,
    lr,
    step,
    microBatches: 1,
    timeS: 0,
  };
}

export class FakePolicy implements Policy {
  p: Params = { tool: -1, err: 0, copy: 0, steps: 0 };
  closed = false;
  /** Called at the start of every rollout; tests use it to simulate a crash at a chosen point. */
  onRollout?: (req: RolloutRequest) => void;

  async rollout(req: RolloutRequest): Promise<Trajectory[]> {
    this.onRollout?.(req);
    const rng = new Rng(req.seed);
    const out: Trajectory[] = [];
    for (const p of req.problems) {
      // the fake knows only the built-in task family: its problems carry the program that solves them
      const prob = { ...p.meta, ...p } as unknown as TaskProblem;
      if (typeof prob.code !== 'string')
        throw new Error('the fake policy needs generated problems (data.files: null)');
      for (let s = 0; s < req.n; s++) {
        const greedy = req.temperature === 0;
        const draw = (logit: number) => (greedy ? logit > 0 : rng.next() < sig(logit));
        const useTool = draw(this.p.tool);
        const broken = useTool && draw(this.p.err);
        const copies = draw(this.p.copy);
        const events: TurnEvent[] = [];
        let text = '';
        let turn = 0;
        if (broken) {
          events.push({ kind: 'generation', turn, start: 0, end: 1, finishReason: 'stop', ms: 1 });
          events.push({ kind: 'tool_call', turn, name: 'python', arguments: '{}' });
          const err = "Tool call failure\nreason: \nstderr: NameError at line 1: name 'prnt' is not defined";
          events.push({ kind: 'tool_result', turn, text: err, error: true, ms: 1, start: 0, end: 1 });
          text += toolCallText(prob.code.replace('print(', 'prnt(')) + toolObservationText(err);
          turn++;
        }
        if (useTool) {
          events.push({ kind: 'generation', turn, start: 0, end: 1, finishReason: 'stop', ms: 1 });
          events.push({ kind: 'tool_call', turn, name: 'python', arguments: '{}' });
          const ok = `Tool call success\nstdout: ${prob.answer}\n\nexecution time: 0.01s`;
          events.push({ kind: 'tool_result', turn, text: ok, error: false, ms: 1, start: 0, end: 1 });
          text += toolCallText(prob.code) + toolObservationText(ok);
          turn++;
        }
        const right = useTool ? copies : prob.level === 0 && copies;
        const ans = right ? prob.answer : `${prob.answer}9`;
        events.push({ kind: 'generation', turn, start: 0, end: 1, finishReason: 'stop', ms: 1 });
        text += answerText(ans);
        const ids = enc(text);
        out.push({
          id: `${prob.id}#${s}`,
          promptId: prob.id,
          sample: s,
          promptIds: enc(prob.question),
          responseIds: ids,
          responseMask: ids.map(() => 1),
          responseLogprobs: ids.map(() => -0.1),
          events,
          finish: 'answered',
          text,
          numToolCalls: (useTool ? 1 : 0) + (broken ? 1 : 0),
          numToolErrors: broken ? 1 : 0,
          ms: 1,
          // what the update needs to know about this sample's choices
          ...{ fake: { useTool, broken, copies } },
        });
      }
    }
    return out;
  }

  private stats(lr: number): TrainStats {
    this.p.steps++;
    return emptyStats(lr, this.p.steps);
  }

  async sftStep(examples: ChatExample[], opts: TrainOptions): Promise<TrainStats> {
    const demos = examples.map((ex) => ({ style: demoStyle(ex) }));
    const frac = (f: (d: { style: string }) => boolean) => demos.filter(f).length / Math.max(1, demos.length);
    const tool = frac((d) => d.style !== 'direct');
    const err = frac((d) => d.style === 'recover') / Math.max(1e-6, tool);
    const toLogit = (q: number) => Math.log(Math.max(1e-3, q) / Math.max(1e-3, 1 - q));
    const k = Math.min(1, opts.lr * 20);
    this.p.tool += k * (toLogit(tool) - this.p.tool);
    this.p.err += k * (toLogit(err) - this.p.err);
    this.p.copy += k * 0.05;
    return this.stats(opts.lr);
  }

  /** Loss falls and exact copies (all 5 digits right) rise with the copy skill: enough for the SFT gate to pass
   * or not, deterministically. */
  async sftHeldout(): Promise<HeldoutScore> {
    const q = sig(this.p.copy);
    return { loss: 1 - q, exact: q ** 5 };
  }

  /** Every grpoStep's options and items, for tests of what the trainer asks. */
  readonly updates: { opts: TrainOptions; items: ScoredItem[] }[] = [];

  async grpoStep(items: ScoredItem[], opts: TrainOptions): Promise<TrainStats> {
    this.updates.push({ opts, items });
    const g = { tool: 0, err: 0, copy: 0 };
    for (const it of items) {
      const f = (it.trajectory as unknown as { fake: { useTool: boolean; broken: boolean; copies: boolean } })
        .fake;
      g.tool += it.advantage * ((f.useTool ? 1 : 0) - sig(this.p.tool));
      if (f.useTool) g.err += it.advantage * ((f.broken ? 1 : 0) - sig(this.p.err));
      g.copy += it.advantage * ((f.copies ? 1 : 0) - sig(this.p.copy));
    }
    const scale = (opts.lr * 10) / Math.max(1, items.length);
    this.p.tool += scale * g.tool;
    this.p.err += scale * g.err;
    this.p.copy += scale * g.copy;
    if (!opts.klCoef) return this.stats(opts.lr);
    // the KL term pulls the tool logit back toward the reference's, which its logprobs carry (log sig(tool))
    const refLp = items[0]?.refLogprobs?.[0];
    if (refLp === undefined) throw new Error('klCoef without reference logprobs');
    const ref = Math.log(Math.exp(refLp) / (1 - Math.exp(refLp)));
    const kl = Math.abs(Math.log(sig(this.p.tool)) - refLp);
    this.p.tool -= Math.min(1, opts.lr * opts.klCoef * 10) * (this.p.tool - ref);
    return { ...this.stats(opts.lr), kl };
  }

  async saveWeights(dir: string): Promise<void> {
    await this.save(dir);
  }

  /** Each response token's "logprob" under the reference is log sig(its tool logit): enough to pull toward it. */
  async referenceLogprobs(dir: string, trajectories: Trajectory[]): Promise<number[][]> {
    const ref = JSON.parse(readFileSync(join(dir, 'fake-policy.json'), 'utf8')) as Params;
    return trajectories.map((t) => t.responseIds.map(() => Math.log(sig(ref.tool))));
  }

  async reinit(seed: number): Promise<void> {
    this.p = { tool: -1, err: 0, copy: 0, steps: this.p.steps, seed };
  }

  async save(dir: string): Promise<void> {
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, 'fake-policy.json'), JSON.stringify(this.p));
  }

  async load(dir: string): Promise<void> {
    this.p = JSON.parse(readFileSync(join(dir, 'fake-policy.json'), 'utf8')) as Params;
  }

  async close(): Promise<void> {
    this.closed = true;
  }
}
