import { appendFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Recipe } from './config.js';
import type { RunState } from './trainer.js';

// What `train --resume RUN --set …` may change in a run that has started: what neither the weights trained so
// far nor the records already written depend on. Anything else needs a new run from a checkpoint (--fork).

/** Fields anywhere in these sections, at any point of the run. */
const ANYTIME = ['reward.profile', 'reward.timeoutMs', 'reward.module', 'eval.', 'health.', 'logger'];
/** Fields of a stage that has not started yet (its steps and sizes). */
const LATER_STAGE = [
  'steps',
  'promptsPerStep',
  'groupSize',
  'oversample',
  'batchSize',
  'maxResponseTokens',
  'maxTurns',
  'evalEvery',
  'checkpointEvery',
];

export const RESUMABLE = `${ANYTIME.map((p) => (p.endsWith('.') ? `${p}*` : p)).join(', ')}, and for a stage that has not started: ${LATER_STAGE.join(', ')}`;

export interface Change {
  path: string; // stages by name: stages.stage2-12k.steps
  from: unknown;
  to: unknown;
}

/** Every leaf of a recipe by dotted path (arrays of values are one leaf; stages are named). */
function leaves(v: unknown, path: string, out: Map<string, unknown>): Map<string, unknown> {
  if (path === 'stages' && Array.isArray(v)) {
    for (const s of v as { name: string }[]) leaves(s, `stages.${s.name}`, out);
  } else if (v !== null && typeof v === 'object' && !Array.isArray(v)) {
    for (const [k, x] of Object.entries(v)) leaves(x, path ? `${path}.${k}` : k, out);
  } else out.set(path, v);
  return out;
}

/** The fields `after` changes in `before`, each checked against what a resume after `state` may change. */
export function resumeChanges(before: Recipe, after: Recipe, state: RunState | null): Change[] {
  const a = leaves(before, '', new Map());
  const b = leaves(after, '', new Map());
  const changes: Change[] = [];
  for (const path of new Set([...a.keys(), ...b.keys()]))
    if (JSON.stringify(a.get(path)) !== JSON.stringify(b.get(path)))
      changes.push({ path, from: a.get(path) ?? null, to: b.get(path) ?? null });
  const started = (name: string) => {
    const i = before.stages.findIndex((s) => s.name === name);
    return state !== null && i <= state.stageIndex;
  };
  for (const c of changes) {
    const m = /^stages\.(.+)\.([^.]+)$/.exec(c.path);
    const ok =
      ANYTIME.some((p) => (p.endsWith('.') ? c.path.startsWith(p) : c.path === p)) ||
      (m !== null && LATER_STAGE.includes(m[2]) && !started(m[1]));
    if (ok) continue;
    const why = m && LATER_STAGE.includes(m[2]) ? ` (stage ${m[1]} has started)` : '';
    throw new Error(
      `--resume cannot change ${c.path}${why}: a resume may change ${RESUMABLE}. To change anything else, ` +
        `start a new run from one of its checkpoints: rstar2 train --fork RUN/checkpoints/STAGE-step-N --out NEW --set …`,
    );
  }
  return changes;
}

/** Writes the changed config into the run and appends each change, with where the run stood, to changes.jsonl. */
export function recordChanges(
  runDir: string,
  recipe: Recipe,
  changes: Change[],
  state: RunState | null,
): void {
  if (changes.length === 0) return;
  const time = new Date().toISOString();
  const at = state ? { stage: state.stage, step: state.step } : null;
  appendFileSync(
    join(runDir, 'changes.jsonl'),
    changes.map((c) => JSON.stringify({ time, after: at, ...c }) + '\n').join(''),
  );
  writeFileSync(join(runDir, 'config.json'), JSON.stringify(recipe, null, 2) + '\n');
}
