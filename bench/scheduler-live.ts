// Rollout scheduling, live: N built-in engines side by side on this machine (`--engines embedded,…`: a worker
// each, each with its own KV pool of --kv-tokens, small enough to bind), the predictive policy (kv-predict) against
// the static split (round-robin) on the same problems, samples and seeds. Each policy runs --rollouts rollouts on
// its own scheduler (kv-predict learns its length prior from the rollout before, as in training, so its first
// rollout places like round-robin and is left out of the comparison). Tool calls run in the local sandbox.
// Prints each rollout's makespan, tail, re-prefilled tokens and retractions, then the ratio of the median makespans.
// The model must call tools and end its answers (a trained checkpoint: the quickstart's last one does).
//
//   npx tsx bench/scheduler-live.ts --model RUN/checkpoints/rl-step-000020 --data RUN/data/eval.jsonl
//        [--template quick] [--engines 4] [--kv-tokens 4096] [--problems 64] [--samples 8] [--rollouts 3]
//        [--max-response-tokens 720] [--max-turns 3] [--temperature 1] [--policies kv-predict,round-robin]
//
// On a GPU every engine shares it (RSTAR2_ENGINE splits the memory; --kv-tokens sets each pool). The simulation's
// figure for the same trajectories: `npx tsx bench/scheduler-sim.ts --replay RUN_DIR` (docs/DECISIONS.md).
import { runRollouts } from '../src/agent/loop.js';
import { openRolloutStack } from '../src/agent/stack.js';
import { loadProblems } from '../src/data/index.js';
import type { RolloutStats } from '../src/engines/scheduler.js';
import { benchArgs, median } from './args.js';

const { values: v } = benchArgs(import.meta.url, {
  options: {
    model: { type: 'string' },
    data: { type: 'string' },
    template: { type: 'string', default: 'quick' },
    engines: { type: 'string', default: '4' },
    'kv-tokens': { type: 'string', default: '4096' },
    problems: { type: 'string', default: '64' },
    samples: { type: 'string', default: '8' },
    rollouts: { type: 'string', default: '3' },
    'max-response-tokens': { type: 'string', default: '720' },
    'max-turns': { type: 'string', default: '3' },
    temperature: { type: 'string', default: '1' },
    policies: { type: 'string', default: 'kv-predict,round-robin' },
  },
});
if (!v.model || !v.data) {
  console.error('scheduler-live: --model DIR and --data FILE are needed (--help)');
  process.exit(2);
}
const num = (k: keyof typeof v) => Number(v[k]);
// every worker this process starts inherits it
process.env.RSTAR2_KV_TOKENS = String(num('kv-tokens'));
const problems = (await loadProblems(v.data, { layout: 'plain' })).slice(0, num('problems'));
const makespans: Record<string, number[]> = {};

for (const policy of v.policies.split(',')) {
  const stack = await openRolloutStack({
    engines: Array.from({ length: num('engines') }, () => 'embedded'),
    model: v.model,
    template: v.template,
    sandbox: 'embedded',
    scheduler: { policy: policy as 'kv-predict' },
  });
  try {
    makespans[policy] = [];
    for (let k = 0; k < num('rollouts'); k++) {
      let stats: RolloutStats | undefined;
      const ts = await runRollouts({
        scheduler: stack.scheduler,
        template: stack.template,
        runner: stack.runner,
        problems: problems.map((p) => ({ id: p.id, question: p.question })),
        n: num('samples'),
        maxResponseTokens: num('max-response-tokens'),
        maxTurns: num('max-turns'),
        sampling: { temperature: num('temperature'), seed: 1000 + k },
        onRolloutStats: (st) => {
          stats = st;
        },
      });
      const failed = ts.filter((t) => t.finish === 'error').length;
      const tokens = ts.reduce((a, t) => a + t.responseIds.length, 0);
      console.log(
        `${policy} rollout ${k}: makespan ${stats?.makespan_s} s, tail ${stats?.tail_s} s, ` +
          `${ts.length} trajectories (${failed} failed), ${tokens} response tokens, ` +
          `re-prefilled ${stats?.reprefilled_tokens}, retractions ${stats?.retractions}`,
      );
      if (k > 0 && stats) makespans[policy].push(stats.makespan_s);
    }
  } finally {
    await stack.close();
  }
}
const [a, b] = v.policies.split(',');
if (makespans[a]?.length && makespans[b]?.length)
  console.log(
    `median makespan over rollouts 1..: ${a} ${median(makespans[a])} s, ${b} ${median(makespans[b])} s; ` +
      `${b} / ${a} = ${(median(makespans[b]) / median(makespans[a])).toFixed(3)}× (above 1: ${a} faster)`,
  );
