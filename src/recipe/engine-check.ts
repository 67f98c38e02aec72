import type { EngineReport, WeightSyncEngine } from '../engines/index.js';
import type { Recipe } from './config.js';

// Before a run on served engines (and in --dry-run): each engine says what it is, and the recipe is held to it.
// A server older than rstar2 supports, a temperature it refuses and logprobs that would make the PPO ratio wrong
// stop the run before it starts; seeds it cannot honour are a warning, since the run still trains.

const PROCESSED = ['processed_logprobs', 'after temperature'];

/** Why `mode` logprobs are not the sampling distribution's for this sampling, or null when they are. */
export function logprobsMismatch(mode: string, temperature: number, topP: number): string | null {
  if (PROCESSED.includes(mode)) return null;
  if (mode.endsWith('_logits')) return `it returns logits (--logprobs-mode ${mode}), not logprobs`;
  if (temperature === 1 && topP === 1) return null;
  return `its logprobs are taken before temperature and top-p (--logprobs-mode ${mode}), and this stage samples at temperature ${temperature}${topP < 1 ? `, top-p ${topP}` : ''}`;
}

/** Reads each engine's report and checks the recipe against it; throws naming the engine and what to change. */
export async function checkEngines(
  engines: WeightSyncEngine[],
  recipe: Recipe,
  log: (line: string) => void,
): Promise<Map<WeightSyncEngine, EngineReport>> {
  const reports = new Map<WeightSyncEngine, EngineReport>();
  for (const e of engines) {
    if (!e.describe) continue;
    let r: EngineReport;
    try {
      r = await e.describe();
    } catch (err) {
      throw new Error(`engine ${e.name}: ${(err as Error).message}`);
    }
    reports.set(e, r);
    const sampled: [string, number][] = [
      ...recipe.stages.flatMap((st) =>
        st.type === 'rl' ? [[`stage ${st.name}`, st.temperature] as [string, number]] : [],
      ),
      ['eval', recipe.eval.temperature],
    ];
    for (const [where, t] of sampled)
      if (r.maxTemperature !== undefined && t > r.maxTemperature)
        throw new Error(`${where}: temperature ${t} is above ${r.maxTemperature}, which ${e.name} refuses`);
    for (const st of recipe.stages) {
      if (st.type !== 'rl' || st.oldLogprobs !== 'engine') continue;
      const topP = (st as { topP?: number }).topP ?? 1;
      if (r.logprobsMode === undefined) {
        // a server that cannot say (vLLM before 0.11.0, or without dev mode) runs vLLM's default, raw_logprobs,
        // unless shown otherwise: those are the sampled distribution's only at temperature 1 without top-p
        const why = logprobsMismatch('raw_logprobs', st.temperature, topP);
        if (why)
          throw new Error(
            `stage ${st.name}: oldLogprobs 'engine' takes the PPO ratio's denominator from ${e.name}, which cannot ` +
              `report its --logprobs-mode (vLLM before 0.11.0, or started without VLLM_SERVER_DEV_MODE=1), and ` +
              `vLLM's default mode is raw: ${why}; start it in dev mode with --logprobs-mode processed_logprobs ` +
              `(vLLM 0.11.0 on), or set stages.${st.name}.oldLogprobs=recompute`,
          );
        continue;
      }
      const why = logprobsMismatch(r.logprobsMode, st.temperature, topP);
      if (why)
        throw new Error(
          `stage ${st.name}: oldLogprobs 'engine' takes the PPO ratio's denominator from ${e.name}, but ${why}; ` +
            `restart it with --logprobs-mode processed_logprobs, or set stages.${st.name}.oldLogprobs=recompute`,
        );
    }
    if (!r.seeds)
      log(
        `warning: ${e.name} cannot honour seeds: rollouts and evals on it are not reproducible from the seed`,
      );
  }
  return reports;
}

/** One line of what an engine said about itself, for --dry-run and bench/engine-probe.ts. */
export function reportLine(name: string, r: EngineReport): string {
  const kv = `KV pool ${r.kv.capacityTokens} tokens${r.kv.blockTokens ? ` (blocks of ${r.kv.blockTokens})` : ''}`;
  return (
    `engine ${name}: version ${r.version ?? 'not reported'}, dtype ${r.dtype ?? 'not reported'}, ` +
    `logprobs ${r.logprobsMode ?? 'mode not readable'}, seeds ${r.seeds ? 'honoured' : 'ignored'}` +
    `${r.maxTemperature !== undefined ? `, temperature ≤ ${r.maxTemperature}` : ''}, ${kv}`
  );
}
