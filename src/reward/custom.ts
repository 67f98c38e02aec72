import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import type { VerifyResult } from './types.js';

// A reward of one's own (`reward.module: ./my-reward.mjs`, `--reward-module`): an ES module whose default export
// scores a response. It runs where the built-in profiles run, on the verifier pool's threads under the same
// deadline, so a slow or stuck function costs a 0 for that response, never the run.

/** What the function is given. `row` is the problem as data/ read it (id, question, answer, source, meta). */
export interface RewardInput {
  text: string;
  gold: string;
  row: unknown;
}

/**
 * What it returns: a number (the reward; correct when > 0), a boolean, or an object. `penalty` (≥ 0) is added
 * to the RoC penalty that ranks a group's positives, so a positive with a higher one is dropped first.
 */
export type RewardOutput =
  | number
  | boolean
  | { reward: number; correct?: boolean; reason?: string; extracted?: string | null; penalty?: number };

export type RewardFunction = (input: RewardInput) => RewardOutput | Promise<RewardOutput>;

const loaded = new Map<string, Promise<RewardFunction>>();

/** The module's default export (or its `reward` export), imported once per thread. */
export function loadRewardModule(path: string): Promise<RewardFunction> {
  const abs = resolve(path);
  let p = loaded.get(abs);
  if (!p) {
    p = (async () => {
      if (!existsSync(abs)) throw new Error(`reward module ${abs}: no such file`);
      const m = (await import(pathToFileURL(abs).href)) as { default?: unknown; reward?: unknown };
      const fn = m.default ?? m.reward;
      if (typeof fn !== 'function')
        throw new Error(
          `reward module ${abs}: its default export is not a function ({text, gold, row}) => reward`,
        );
      return fn as RewardFunction;
    })();
    loaded.set(abs, p);
  }
  return p;
}

/** Runs the module's function on one response; anything but a finite reward is an error result naming the module. */
export async function customReward(path: string, input: RewardInput): Promise<VerifyResult> {
  const out = await (await loadRewardModule(path))(input);
  const o =
    typeof out === 'object' && out !== null ? out : { reward: typeof out === 'boolean' ? Number(out) : out };
  if (typeof o.reward !== 'number' || !Number.isFinite(o.reward))
    throw new Error(`reward module ${path} returned ${JSON.stringify(out)}: expected a finite reward`);
  if (o.penalty !== undefined && !(typeof o.penalty === 'number' && o.penalty >= 0))
    throw new Error(`reward module ${path}: penalty must be a number >= 0, got ${JSON.stringify(o.penalty)}`);
  const correct = typeof o.correct === 'boolean' ? o.correct : o.reward > 0;
  return {
    correct,
    reward: o.reward,
    ...(o.penalty !== undefined ? { penalty: o.penalty } : {}),
    extracted: o.extracted ?? null,
    normalised: null,
    matchedBy: 'module',
    reason: o.reason ?? `reward ${o.reward} from ${path}`,
    status: correct ? 'equal' : 'not-equal',
  };
}
